"""The bench's rooflines: a case's io efficiency is against the cache level its bytes fit
in (measured at its size), DRAM, or the faster of DRAM and the copy at its size where it is
partly cached; the compute peak is a measured FMA loop."""

import os
import subprocess
import sys

import pytest

from tvm_ops import bench, targets

from .conftest import requires_torch


def test_a_case_is_held_to_the_level_its_bytes_fit_in():
    model = targets.resolve("llvm")
    l2, l3 = targets.cache_bytes(2), targets.cache_bytes(3)
    if not (l2 and l3):
        pytest.skip("the OS does not give this CPU's cache sizes")
    assert bench.cache_level(model, l2 * model.cores / 4) == "L2"
    assert bench.cache_level(model, l3 / 4) == "L3"
    assert bench.cache_level(model, l3) is None
    stream = 1e6  # a placeholder DRAM bandwidth: every cache level copies faster
    bound = bench.bytes_roofline(model, l2 * model.cores / 4, stream, repeat=1)
    assert bound.name == "L2" and bound.bandwidth(bench.interleaved_medians(bound.timings, 1)) > stream
    gpu = bench.bytes_roofline(targets.cuda("sm_90"), 1024, stream, repeat=1)
    assert (gpu.name, gpu.timings, gpu.bandwidth({})) == ("DRAM", {}, stream)  # measured once per run


def test_interleaved_timings_each_run_their_rounds_in_turn():
    order = []

    def timed(name, seconds, library, rounds):
        return bench.Timed(lambda: order.append(name) or seconds, library, rounds)

    medians = bench.interleaved_medians({"case": timed("case", 2.0, "tvm", 3), "peer": timed("peer", 5.0, "torch", 2),
                                         "copy": timed("copy", 1.0, "tvm", 3)}, 3)
    assert order == ["case", "peer", "copy"] * 2 + ["case", "copy"]
    assert medians == {"case": 2.0, "peer": 5.0, "copy": 1.0}


@requires_torch
def test_peers_run_on_the_cpu_without_a_device_mode():
    """`with torch.device(...)` sends every torch call through a function mode (a 39 us
    scatter_add_ peer took 63 us under it): a CPU peer runs as a user's code would, a GPU
    peer's tensors land on the GPU (meta here)."""
    import torch

    def block():
        return torch.empty(1).device.type

    assert bench.on_device(torch.device("cpu"), block) is block
    assert bench.on_device(torch.device("meta"), block)() == "meta"


def test_blocks_are_sized_in_the_first_block_from_the_fastest_single_run():
    runs = []
    seconds = iter([0.5, 1e-4, 2e-4, 1e-4, 3e-4])  # a slow first run (a thread waking up)

    def run(number):
        runs.append(number)
        return next(seconds, 1e-4)

    block = bench._warmed_blocks(run)
    assert runs == []  # nothing runs where the Timed is made (another library's threads may spin there)
    block()
    fastest = 1e-4
    assert runs == [1] * bench.CALIBRATION_RUNS + [int(bench.WARM_SECONDS / fastest),
                                                   int(bench.BLOCK_SECONDS / fastest)]
    block()
    assert runs[-2:] == runs[-4:-2]  # sized once


def test_settle_waits_until_tvms_workers_stop_spinning():
    if not os.path.isdir(bench._TASKS):
        pytest.skip("no /proc/self/task: settle waits a fixed time here")
    # a fresh process: TVM's pool reads its spin count once, at its first parallel kernel; a
    # spin of 30000 yields still outlasts the check right after the kernel, and ends within
    # SETTLE_MAX_SECONDS while another process holds the second core (300000 did not on a znver3)
    code = ("import os; os.environ['TVM_THREAD_POOL_SPIN_COUNT'] = '30000'\n"
            "from tvm_ops import bench, targets\n"
            "bench.copy_timing(targets.resolve('llvm'), 1 << 20)[1]()\n"
            "spinning = bench._other_threads_running()\n"
            "bench.settle()\n"
            "print(spinning, bench._other_threads_running())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"]


def test_the_compute_peak_is_measured_and_below_the_nominal_one():
    model = targets.resolve("llvm")
    peak = bench.peak_flops(model)
    # the nominal ceiling: 2 FMA pipes x 2 flops per lane, at a generous 6 GHz
    assert 0 < peak < model.cores * 6e9 * model.lanes("float32") * 4
    assert bench.peak_flops(model) == peak  # once per process


def test_dram_is_the_faster_of_the_cached_and_the_streamed_copy():
    import numpy as np
    import tvm

    model = targets.resolve("llvm")
    if not bench.streamed_copy(model):
        pytest.skip("this CPU's vector is not a whole cache line, or it has no non-temporal stores")
    lib, dev = bench._copy_kernel(model, streamed=True)
    for rows in (1, bench._STREAMED_TASK_ROWS - 1, bench._STREAMED_TASK_ROWS + 1, 300):  # tasks and their tail
        src = np.random.default_rng(rows).random((rows, bench._COPY_ROW), dtype=np.float32)
        dst = tvm.runtime.tensor(np.full_like(src, np.nan), dev)
        lib[lib.entry_name](tvm.runtime.tensor(src, dev), dst)
        assert np.array_equal(dst.numpy(), src)
    l3 = targets.cache_bytes(3)
    dram = bench.bytes_roofline(model, 4 * (l3 or 1 << 30), 1e6, repeat=1)
    assert dram.name == "DRAM" and set(dram.timings) == {"roofline copy", "roofline copy streamed"}
    medians = {"roofline copy": 2.0, "roofline copy streamed": 1.0}
    assert dram.bandwidth(medians) == dram.moved / 1.0  # the faster copy is the roofline


def test_dram_is_at_least_the_runs_stream():
    # the copies timed beside a case, in a slow spell, below what the run's stream showed
    model = targets.resolve("llvm")
    l3 = targets.cache_bytes(3) or 1 << 30
    dram = bench.bytes_roofline(model, 4 * l3, 1e15, repeat=1)
    slow = {name: 1e9 for name in dram.timings}  # every copy ~0 B/s
    assert dram.name == "DRAM" and dram.bandwidth(slow) == pytest.approx(1e15)


def test_a_streamed_store_is_whole_cache_lines_whatever_the_vector_width():
    import numpy as np
    import tvm

    from tvm_ops.ops import cpu_ir

    assert [cpu_ir.line_vector(lanes, "float32") for lanes in (4, 8, 16, 32)] == [16, 16, 16, 32]
    assert cpu_ir.line_vector(16, "float16") == 32
    if "avx2" not in targets.resolve("llvm").features():
        pytest.skip("this CPU cannot run AVX2 code")
    avx2 = targets.resolve("llvm:haswell")  # a float32 register is half a cache line
    assert bench.streamed_copy(avx2)
    lib, dev = bench._copy_kernel(avx2, streamed=True)
    assert "vmovntps\t%ymm" in lib.inspect_source("asm")  # two non-temporal stores a line
    src = np.random.default_rng(0).random((bench._STREAMED_TASK_ROWS + 3, bench._COPY_ROW), dtype=np.float32)
    dst = tvm.runtime.tensor(np.full_like(src, np.nan), dev)
    lib[lib.entry_name](tvm.runtime.tensor(src, dev), dst)
    assert np.array_equal(dst.numpy(), src)


def test_the_read_kernel_sums_each_tasks_rows():
    import numpy as np
    import tvm

    model = targets.resolve("llvm")
    lib, K = bench.read_kernel(model), bench._READ_TASK_ROWS
    for rows in (1, K - 1, K + 1, 3 * K):  # tasks and their tail
        src = np.random.default_rng(rows).random((rows, bench._COPY_ROW), dtype=np.float32)
        tasks = -(-rows // K)
        sums = tvm.runtime.tensor(np.full((tasks, bench._COPY_ROW), np.nan, np.float32), tvm.cpu())
        lib["read"](tvm.runtime.tensor(src, tvm.cpu()), sums)
        expected = np.stack([src[t * K:(t + 1) * K].astype(np.float64).sum(0) for t in range(tasks)])
        np.testing.assert_allclose(sums.numpy(), expected, rtol=1e-5)


def test_a_case_that_mostly_reads_is_held_to_reading_alone_too():
    copy, read = "roofline copy", bench.READ_TIMING
    # the copy moves 2 GB/s (read + written), the read kernel reads 1 GB/s
    bound = bench.Roofline("DRAM", 2.0, {copy: None, read: None}, reads=90.0, io_bytes=100.0, read_moved=1.0)
    medians = {copy: 1.0, read: 1.0}
    assert bound.bandwidth(medians) == pytest.approx(100.0 / 90.0)  # 90 bytes read at 1 B/s: 90 s
    bound.reads = 10.0  # mostly written: the copy's 2 B/s bounds it (50 s against 10 s of reading)
    assert bound.bandwidth(medians) == pytest.approx(2.0)
    assert bench.Roofline("DRAM", 2.0, {copy: None}).bandwidth({copy: 1.0}) == 2.0  # no reads given


def test_only_a_dram_case_times_the_read_kernel():
    model = targets.resolve("llvm")
    l3 = targets.cache_bytes(3) or 1 << 30
    dram = bench.bytes_roofline(model, 4 * l3, 1e6, repeat=1, reads=3 * l3)
    assert dram.name == "DRAM" and bench.READ_TIMING in dram.timings
    assert (dram.reads, dram.io_bytes) == (3 * l3, 4 * l3) and dram.read_moved >= 2 * l3
    assert bench.READ_TIMING not in bench.bytes_roofline(model, 4 * l3, 1e6, repeat=1).timings
    if targets.cache_bytes(2):
        cached = bench.bytes_roofline(model, 1024, 1e6, repeat=1, reads=512)
        assert cached.name in ("L2", "L3") and bench.READ_TIMING not in cached.timings


def test_a_case_beyond_half_the_l3_is_also_held_to_the_copy_at_its_size():
    model = targets.resolve("llvm")
    l3 = targets.cache_bytes(3)
    if not l3:
        pytest.skip("the OS does not give this CPU's L3 size")
    partly = bench.bytes_roofline(model, l3, 1e6, repeat=1, reads=l3 / 2)
    assert partly.name == "DRAM" and bench.AT_SIZE_TIMING in partly.timings and bench.READ_TIMING in partly.timings
    assert partly.at_size_moved == pytest.approx(l3, rel=0.01)
    beyond = bench.bytes_roofline(model, (bench.PARTLY_CACHED_L3 + 1) * l3, 1e6, repeat=1)
    assert bench.AT_SIZE_TIMING not in beyond.timings
    copy, at_size = "roofline copy", bench.AT_SIZE_TIMING
    bound = bench.Roofline("DRAM", 2.0, {copy: None, at_size: None}, at_size_moved=6.0)
    assert (bound.bandwidth({copy: 1.0, at_size: 2.0}), bound.label({copy: 1.0, at_size: 2.0})) == (3.0, "L3/DRAM")
    assert (bound.bandwidth({copy: 1.0, at_size: 6.0}), bound.label({copy: 1.0, at_size: 6.0})) == (2.0, "DRAM")
