"""The MLU-style policy is pure arithmetic: no TVM needed."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tvm_ops import policy
from tvm_ops.targets import TargetModel


def test_policy_imports_without_tvm():
    code = "import sys, tvm_ops.policy, tvm_ops.targets; assert 'tvm' not in sys.modules, 'tvm was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_even_split_puts_the_remainder_on_the_first_cores():
    assert policy.even_split(10, 4) == [(0, 3), (3, 3), (6, 2), (8, 2)]
    assert policy.even_split(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert policy.even_split(0, 3) == [(0, 0), (0, 0), (0, 0)]


@given(st.integers(0, 10_000), st.integers(1, 128))
def test_even_split_covers_everything_once(total, cores):
    plan = policy.even_split(total, cores)
    assert len(plan) == cores
    assert sum(count for _, count in plan) == total
    assert all(start + count == nxt for (start, count), (nxt, _) in zip(plan, plan[1:]))
    counts = [count for _, count in plan]
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)


def test_even_split_rejects_no_cores():
    with pytest.raises(ValueError):
        policy.even_split(5, 0)


def test_cache_resident_is_up_to_the_cache_and_never_for_an_unknown_one():
    assert policy.cache_resident(32 << 20, 32 << 20) and not policy.cache_resident((32 << 20) + 1, 32 << 20)
    assert not policy.cache_resident(1, None)


def test_deal_num_sizes_tiles_from_the_budget():
    # 512 KiB shared by 2 float32 buffers, aligned to 16 lanes
    assert policy.deal_num(512 * 1024, 2, 4, 16) == 65536
    assert policy.deal_num(1000, 1, 4, 16) == 240
    assert policy.deal_num(10, 1, 4, 16) == 0


def test_floor_align_and_ceil_div():
    assert policy.floor_align(100, 32) == 96
    assert policy.floor_align(31, 32) == 0
    assert policy.ceil_div(100, 32) == 4
    assert policy.ceil_div(96, 32) == 3
    with pytest.raises(ValueError):
        policy.floor_align(5, 0)


def test_target_model_lanes_and_keys():
    cpu = TargetModel("llvm", "znver4", "", 2, 1 << 20, 64)
    gpu = TargetModel("cuda", "", "sm_90", 132, 48 * 1024, 128)
    assert cpu.lanes("float32") == 16
    assert cpu.key == "llvm-znver4-2c"
    assert gpu.key == "cuda-sm_90"
    assert gpu.lanes("float32") == 32


# --- Policy: the inputs every plan() reads ------------------------------------------


CPU = TargetModel("llvm", "znver4", "", 2, 1 << 20, 64)
GPU = TargetModel("cuda", "", "sm_90", 132, 48 * 1024, 128)


def test_for_target_takes_the_budget_from_the_named_memory():
    cpu = policy.for_target(CPU, "l2")
    assert (cpu.cores, cpu.budget, cpu.lanes, cpu.scope) == (2, 1 << 20, 16, "global")
    gpu = policy.for_target(GPU, "shared")
    assert (gpu.cores, gpu.budget, gpu.lanes, gpu.scope) == (132, 48 * 1024, 32, "shared")
    assert policy.for_target(CPU).budget == policy.for_target(GPU, "none").budget == 0
    for model, onchip in ((CPU, "shared"), (GPU, "l2"), (CPU, "nram")):
        with pytest.raises(ValueError, match="onchip"):
            policy.for_target(model, onchip)


@given(st.integers(1, 1 << 22), st.sampled_from([0.25, 0.5, 0.75, 1.0]), st.integers(0, 1 << 16),
       st.integers(1, 4), st.sampled_from([2, 4, 64, 256]), st.sampled_from([1, 16, 32]))
def test_policy_deal_num_fits_the_budget_share(budget, fraction, reserved, buffers, itemsize, align):
    pol = policy.Policy(2, budget, 16, "global")
    n = pol.deal_num(fraction, reserved, buffers, itemsize, align)
    assert n >= 0 and n % align == 0
    assert reserved + n * buffers * itemsize <= max(int(budget * fraction), reserved)
    if int(budget * fraction) - reserved >= 0:  # as many as fit: one more aligned step does not
        assert reserved + (n + align) * buffers * itemsize > int(budget * fraction)


@given(st.integers(1, 64), st.integers(1, 256))
def test_tasks_per_item_gives_every_core_a_task(items, cores):
    tasks = policy.tasks_per_item(items, cores)
    assert tasks >= 1 and items * tasks >= cores
    assert tasks == 1 or items * (tasks - 1) < cores  # no more cuts than needed


def test_warps_are_whole_and_fit_a_block():
    pol = policy.for_target(GPU)
    assert [pol.warps(t) for t in (32, 128, 1024)] == [1, 4, 32]
    for bad in (0, 48, 2048):
        with pytest.raises(ValueError, match="multiple of 32"):
            pol.warps(bad)
    assert pol.vector(2) == 64 and policy.for_target(CPU).vector(2) == 32


# --- every operator's plan, in the policy's terms -------------------------------------


def _models():
    from tvm_ops import targets

    return [targets.host_cpu(), targets.resolve("llvm:haswell"), targets.cuda("sm_80"), targets.cuda("sm_90")]


def _plans(op_name):
    """(model, knobs, plan or the exception) for the defaults and every candidate combination."""
    import itertools

    from tvm_ops.ops import get

    op = get(op_name)
    for model in _models():
        sched = op.schedules[model.kind]
        names = list(sched.candidates)
        for values in [tuple(sched.defaults[n] for n in names), *itertools.product(*sched.candidates.values())]:
            knobs = dict(zip(names, values))
            try:
                yield model, knobs, op.plan(model, knobs)
            except ValueError as exc:
                yield model, knobs, exc


def test_three_interpolate_tiles_fill_the_onchip_budget():
    for model, knobs, plan in _plans("three_interpolate_backward"):
        budget = int(model.onchip_bytes * knobs["acc_budget"])
        lanes = model.lanes("float32")
        # go_t[No, Co] float32; on the CPU No is one vector (a [lanes, lanes] square per vector)
        n_tile = knobs["n_tile"] if model.kind == "cuda" else lanes
        staged = n_tile * knobs["c_tile"] * 4
        row = knobs["c_tile"] * 4  # one acc row, Co float32
        if isinstance(plan, Exception):  # refused only when not one 32-row block fits, or the CPU's
            # channels are not whole vectors
            assert staged + 32 * row > budget or (model.kind == "llvm" and knobs["c_tile"] % lanes), \
                (model.key, knobs)
            continue
        m = plan["m_tile"]
        assert m > 0 and m % 32 == 0
        assert m * row + staged <= budget  # acc + go_t within the share of the budget
        cap = knobs.get("m_tile_max") or 0
        assert m == cap if cap and staged + cap * row <= budget else staged + (m + 32) * row > budget
        assert plan["scope"] == ("shared" if model.kind == "cuda" else "global")
        assert (plan["c_tile"], plan["n_tile"]) == (knobs["c_tile"], n_tile)


def test_channel_steps_are_whole_vectors():
    for model, knobs, plan in _plans("dynamic_scatter_backward"):
        if model.kind == "cuda":
            assert plan["threads_x"] == policy.WARP and plan["threads_x"] * plan["threads_y"] == knobs["threads"]
        else:
            assert plan["vec"] % model.lanes("float32") == 0
            assert plan["vec"] == model.lanes("float32") * knobs["lanes_mult"]
    for model, knobs, plan in _plans("voxel_pooling_forward"):
        if model.kind == "cuda":
            assert plan["vec"] == model.lanes("float32")  # a warp
        else:  # whole SIMD registers making a cache line: one AVX-512 register, two AVX2, four NEON
            assert plan["vec"] % model.lanes("float32") == 0 and plan["vec"] * 4 == max(64, model.vector_bytes)
        if model.kind == "llvm":
            assert plan["cores"] == model.cores and plan["row_bands"] == knobs["row_bands"]
    for model, knobs, plan in _plans("ms_deform_attn_backward"):
        assert plan.get("lanes") == (model.lanes("float32") if model.kind == "llvm" else None)


def test_border_align_owners_are_whole_channel_groups():
    for model, knobs, plan in _plans("border_align_backward"):
        assert plan["owner_lanes"] % plan["channel_group"] == 0
        if model.kind == "llvm":  # capped where the argmax and gradient would outgrow the registers
            registers = 2 * plan["owner_lanes"] // model.lanes("float32")
            assert plan["owner_lanes"] == knobs["owner_lanes"] or registers == model.vector_registers
            assert registers <= model.vector_registers or plan["owner_lanes"] == plan["channel_group"]
            wide = model.lanes("float32") >= plan["channel_group"]
            assert plan["corner_adds"] == (knobs["corner_adds"] if wide or knobs["corner_adds"] != "per_position"
                                           else "per_sample")


def test_small_work_runs_on_one_core_and_more_of_it_with_sleeping_workers():
    two = policy.Policy(cores=2, budget=1 << 20, lanes=16, scope="global")
    spinning_io, spinning_ops = policy.ONE_CORE_BELOW["spinning"]
    asleep_io, asleep_ops = policy.ONE_CORE_BELOW["asleep"]
    assert spinning_io < asleep_io and spinning_ops < asleep_ops  # a wake-up costs more than a hand-out
    for asleep, (io_limit, ops_limit) in ((False, (spinning_io, spinning_ops)), (True, (asleep_io, asleep_ops))):
        assert two.one_core(io_limit - 1, ops_limit - 1, asleep)
        assert two.one_core(io_limit - 1, None, asleep)  # no ops formula: the io decides
        assert not two.one_core(io_limit, 0, asleep)
        assert not two.one_core(0, ops_limit, asleep)
        # per parallel loop of the call: each hands out work and waits for the workers
        assert two.one_core(3 * io_limit - 1, 3 * ops_limit - 1, asleep, loops=3)
        assert not two.one_core(3 * io_limit, 0, asleep, loops=3)
        assert not two.one_core(0, 3 * ops_limit, asleep, loops=3)
    one = policy.Policy(cores=1, budget=1 << 20, lanes=16, scope="global")
    assert one.one_core(1e12, 1e12, False)  # nothing to gain from a pool of one
