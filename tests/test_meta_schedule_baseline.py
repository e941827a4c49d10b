"""The meta_schedule baseline: TVM's auto-scheduler against the hand-tuned kernels on one case."""

import numpy as np
import pytest

from tvm_ops import build, targets
from tvm_ops.tuning import meta_schedule_baseline as mb
from tvm_ops.tuning import tune
from tvm_ops.ops import get

OP = get("three_interpolate_backward")
# small: one kernel, runs in well under a millisecond; one channel, so launch runs the narrow
# kernel, a TensorIR compute (meta_schedule cannot take the vector kernels' lane shuffles)
CASE = "net_16x1x128_m1024"
pytestmark = [pytest.mark.skipif(bool(mb.available()), reason=mb.available() or "meta_schedule available"),
              pytest.mark.xdist_group("meta_schedule")]


@pytest.mark.slow
def test_tuned_kernels_are_checked_and_timed_against_hand_tuned(tmp_path):
    result = mb.compare(OP, CASE, trials=2, work_dir=tmp_path, rounds=1, budget_s=0.2)
    assert [k.name for k in result.kernels] == [OP.kernel_names[2]]  # what launch runs at C = 1
    assert result.check == ""  # the configuration that was timed passed the float64 reference
    (kernel,) = result.kernels
    assert kernel.measured >= 1 and kernel.ms_best_s > 0  # meta_schedule really tuned it
    if kernel.used == mb.META_SCHEDULE:
        assert kernel.schedule and mb.META_SCHEDULE in result.times
    else:  # its candidates were wrong (TVM 0.27 miscompiles the vectorised tile loop): said, not crashed
        assert kernel.reason and "wrong result" in kernel.reason
    assert result.times[mb.HAND_TUNED][0] > 0
    assert any("outputs of the meta_schedule configuration: pass" in line for line in result.lines())


def test_kernel_meta_schedule_cannot_take_is_reported(tmp_path, monkeypatch):
    def refuse(func, args):
        raise ValueError("a data-dependent extent")

    monkeypatch.setattr(mb, "specialise", refuse)
    result = mb.compare(OP, CASE, trials=2, work_dir=tmp_path, rounds=1, budget_s=0.1)
    (kernel,) = result.kernels
    assert kernel.used == mb.HAND_TUNED and "cannot specialise" in kernel.reason
    assert "a data-dependent extent" in kernel.reason
    assert result.check == "" and set(result.times) == {mb.HAND_TUNED}
    text = "\n".join(result.lines())
    assert "meta_schedule on kernels (none); hand-tuned three_interpolate_backward" in text


def test_specialise_binds_shapes_and_scalars():
    model = targets.host_cpu()
    func = mb._plain_compute(get("dynamic_scatter_backward"), "float32", model, "max_unbucketed")
    fixed = mb.specialise(func, [np.zeros(5, np.int32), np.zeros((5, 3), np.float32), 7])
    assert len(fixed.params) == 2  # the scalar is gone, the buffers have their concrete shapes
    assert [[int(d) for d in p.ty.shape] for p in fixed.params] == [[5], [5, 3]]
    assert "v < 7" in fixed.script()  # voxel_num bound into the body
    with pytest.raises(ValueError):
        mb.specialise(func, [np.zeros(5, np.int32), np.zeros((5, 3), np.float32)])


def test_align_tensors_keeps_values_and_aligns():
    harness = tune.Harness(OP, next(c for c in OP.spec.cases if c.name == CASE), "float32", targets.host_cpu())
    before = {k: np.array(v) for k, v in {**harness.inputs, **harness.results}.items()}
    mb.align_tensors(harness)
    for name, value in {**harness.inputs, **harness.results}.items():  # the kernels read and write these
        assert value.ctypes.data % 64 == 0
        np.testing.assert_array_equal(value, before[name])


def test_summary_and_why_nothing(tmp_path):
    trace = '''
  v1 = sch.sample_categorical(candidates=[0, 16, 64, 512], probs=[0.25, 0.25, 0.25, 0.25], decision=2)
  sch.annotate(block_or_loop=b0, ann_key="meta_schedule.parallel", ann_val=32)
  sch.annotate(block_or_loop=b0, ann_key="meta_schedule.unroll_explicit", ann_val=v1)
  l7 = sch.fuse(l4, l5, preserve_unit_iters=True)
  sch.parallel(loop=l7)
  l8 = sch.fuse(l6, preserve_unit_iters=True)
'''
    assert mb._summary(trace) == "parallel=32 unroll=64 fuse x2 parallel"
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "x.task_0_main.log").write_text(
        "Postproc #0 [s_tir.meta_schedule.DisallowDynamicLoop]: 512 failure(s)\n"
        "[WARNING] Cannot sample enough initial population, evolutionary search failed.\n")
    assert mb._why_nothing(tmp_path) == ("meta_schedule could not sample any candidate "
                                         "(s_tir.meta_schedule.DisallowDynamicLoop rejected 512 samples)")


@pytest.mark.slow
def test_cli_tune_meta_schedule(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, TVM_OPS_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--meta-schedule", "--trials", "1", "--repeat", "3"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"meta_schedule vs hand-tuned: {OP.name} {CASE} float32" in done.stdout
    assert "hand-tuned " in done.stdout and "1 trials per kernel" in done.stdout
    refused = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--meta-schedule",
                              "--rpc-tracker", "127.0.0.1:9", "--rpc-key", "k"],
                             env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "takes no --rpc-tracker or --rpc-key" in refused.stderr


def test_recording_takes_the_call_plans_tvm_workspace_tensors():
    # dynamic_scatter_forward's reused workspaces reach its kernels as TVM tensors
    # (invocation.CallPlan): they are recorded as numpy copies, like the arrays
    op = get("dynamic_scatter_forward")
    model = targets.host_cpu()
    case = next(c for c in op.spec.cases if c.name == "net_4294x128_m3435")
    harness = tune.Harness(op, case, "float32", model)
    hand = mb._load_variant(build.Variant(op, "float32", model, dict(op.schedules["llvm"].defaults), mb.HAND_TUNED))
    calls = mb.record_calls(harness, hand)
    group = calls["group_split_d3"]
    assert group is not None and all(isinstance(a, (np.ndarray, int)) for a in group)
    assert group[1].dtype == np.int32 and group[1].shape == (case.shape["N"],)  # order, a workspace
