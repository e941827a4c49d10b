"""Benchmarks: median times of spec cases, efficiency against this machine's
bandwidth measured in the same run, and the ratio against the fastest of the op's
PyTorch eager formulations (testing/<op>.py `peers`), timed on the same inputs in the
same run.

The io efficiency of a case is against its roofline: the stream (DRAM) bandwidth, or,
when the case's bytes fit in half of a cache level of the CPU (all cores' L2, or the L3),
that level's bandwidth, measured in the same run by the same copy kernel over a buffer
of the case's size (the data stays in the cache between repeats, as the case's does).
DRAM's is the faster of two copies: with cached stores, and (x86 CPUs whose vector is a
whole cache line) with non-temporal ones, which skip the read of each line a cached store
makes first: the bytes DRAM can move, which a kernel streaming its output reaches. Reading
alone is slower than that (two cores' loads in flight, not the memory, bound it), so a
case that mostly reads is also held to the read kernel's bandwidth for its inputs' bytes
(`Roofline`). Between half the L3 and PARTLY_CACHED_L3 times it, a repeated case still
finds part of its bytes in the L3: the copy at the case's size is timed too, and the
faster of it and DRAM's is the roofline (named L3/DRAM when the copy is the faster).
Where a case is bound by where its bytes are rather than how many (corner gathers: the
testing module's `access_pattern`), the roofline is the time of its accesses alone, in
its kernel's order (tvm_ops/access_pattern.py), measured in the same run.

A case, its peers and its roofline are timed in turn, a warm block of each per round
(`interleaved_medians`): on a shared host the slow spells fall on all of them, so the
ratio and the efficiency hold where the absolute times move (measured one after the
other, a case timed in a slow spell read above 100% of a roofline timed in a quiet one)."""

from __future__ import annotations

import functools
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from . import access_pattern, checks, dispatch, host_buffers, records, runner
from .targets import TargetModel
from .testing import material

STREAM_BYTES = 2 * 128 * 1024 * 1024  # read + written: two 128 MiB buffers, far beyond the caches


@dataclass
class BenchLine:
    op: str
    case: str
    dtype: str
    target: str
    origin: str  # which schedule configuration the kernel came from
    median_ms: float
    gbps: float  # theory io bytes / median time
    io_efficiency: float  # gbps / measured stream bandwidth
    compute_efficiency: float | None
    peer_ms: float | None  # the fastest PyTorch formulation measured in this run
    speedup: float | None  # peer_ms / median_ms
    other_peers: dict = field(default_factory=dict)  # the other torch formulations: name -> ms
    peer: str | None = None  # the fastest formulation's name
    # what io_efficiency is against: the bandwidth of DRAM, L3 or L2, or an access pattern's
    # time (gather, scatter, gather+scatter) as the bandwidth io bytes / that time
    roofline: str = "DRAM"
    roofline_gbps: float = 0.0
    one_core: bool = False  # the call ran one-core kernels (the policy's choice; one_core.py)

    def text(self) -> str:
        compute = f"{self.compute_efficiency:6.1%}" if self.compute_efficiency is not None else "    - "
        peer = (f"best peer {self.peer} {self.peer_ms:9.2f} ms  x{self.speedup:6.1f}" if self.peer_ms is not None
                else "peer        -")
        others = "".join(f"  [{name} {ms:.2f} ms x{ms / self.median_ms:.1f}]" for name, ms in self.other_peers.items())
        origin = f"{self.origin}, one-core" if self.one_core else self.origin
        return (f"{self.op:28s} {self.case:26s} {self.dtype:8s} {self.target:18s} {origin:16s} "
                f"{self.median_ms:9.3f} ms "
                f"{self.gbps:7.2f} GB/s  io {self.io_efficiency:6.1%} of {self.roofline:14s} "
                f"{self.roofline_gbps:6.1f} GB/s  compute {compute}  {peer}{others}")


BLOCK_SECONDS = 2e-3  # each repeat times calls back to back for at least this long
# calls run untimed for this long before each timed block: after an idle wait (settle) or
# another kernel's block the first milliseconds of a 0.4 ms call ran 20-30% slower (caches,
# clocks and the thread pool waking up)
WARM_SECONDS = 0.02


@dataclass
class Timed:
    """One thing a case times: `block()` runs it warm, back to back for ~BLOCK_SECONDS, and
    returns seconds per run; `library` is whose worker threads it wakes (tvm or torch);
    it takes part in the first `rounds` rounds of interleaved_medians."""
    block: Callable[[], float]
    library: str
    rounds: int


def call_timing(fn, sync=None) -> Callable[[], float]:
    """A block timer of the Python callable fn (`sync` runs before a block and after each
    call: a GPU call is timed to its end, never overlapped with the next)."""
    return _warmed_blocks(_runs(fn, sync))


def _runs(fn, sync) -> Callable[[int], float]:
    """run(number): seconds per call of `number` calls of fn back to back."""
    def run(number: int) -> float:
        if sync is not None:
            sync()  # nothing queued before may count against this run
        start = time.perf_counter()
        for _ in range(number):
            fn()
            if sync is not None:
                sync()
        return (time.perf_counter() - start) / number

    return run


def kernel_timing(lib, name: str, dev, args: list) -> Callable[[], float]:
    """A block timer of the TVM function lib[name](*args), timed by TVM's time_evaluator (a
    microsecond kernel is not timed through Python)."""
    evaluators: dict = {}

    def run(number: int) -> float:
        if number not in evaluators:
            evaluators[number] = lib.time_evaluator(name, dev, number=number, repeat=1)
        return evaluators[number](*args).mean

    return _warmed_blocks(run)


# a run's time, which sizes the blocks, is the fastest of this many single runs (fewer where
# they take longer than CALIBRATION_SECONDS in all)
CALIBRATION_RUNS, CALIBRATION_SECONDS = 5, 0.05


def _warmed_blocks(run: Callable[[int], float]) -> Callable[[], float]:
    """block(): WARM_SECONDS of untimed runs (none for a run longer than that), then as many
    runs as last ~BLOCK_SECONDS; their mean. How many is decided in the first block (after
    the other library's threads have settled, as every block is) from the fastest of a few
    single runs: decided when the Timed was made, right after the case's own block, a torch
    peer's runs shared the cores with TVM's spinning workers, and the first run after an idle
    wait can take a scheduler tick (torch.gather on three_interpolate_forward's
    net_16x16x512_n64: 1-18 ms against 0.06); sized from such a run, each block was one
    run as slow (that peer's median 15-26 ms)."""
    runs = functools.cache(lambda: _block_runs(run))  # measured in the first block, kept

    def block() -> float:
        number, warm = runs()
        if warm:
            run(warm)
        return run(number)

    return block


def _block_runs(run: Callable[[int], float]) -> tuple[int, int]:
    """(runs per block, warm-up runs) from the fastest of a few single runs."""
    start = time.perf_counter()
    once = run(1)
    for _ in range(CALIBRATION_RUNS - 1):
        if time.perf_counter() - start > CALIBRATION_SECONDS:
            break
        once = min(once, run(1))
    once = max(once, 1e-7)
    return max(1, int(BLOCK_SECONDS / once)), int(WARM_SECONDS / once)


def peer_rounds(repeat: int) -> int:
    """Rounds a PyTorch peer takes part in: half the case's, at least 3 (the slow peers
    would otherwise dominate a run)."""
    return max(3, repeat // 2)


def interleaved_medians(timings: dict, repeat: int) -> dict:
    """{name: median seconds per run} of each Timed in `timings`, a block of each in turn per
    round: a slow spell of a shared host falls on the case and its peers and rooflines alike,
    so their ratios hold where their absolute times do not. The other library's workers are
    let settle where one library's block follows the other's."""
    samples: dict = {name: [] for name in timings}
    last = None
    for round_ in range(repeat):
        for name, timed in timings.items():
            if round_ >= timed.rounds:
                continue
            if timed.library != last:  # the first block too: the previous case's peers
                settle()
            samples[name].append(timed.block())
            last = timed.library
    return {name: statistics.median(values) for name, values in samples.items()}


def single_calls_median(fn, repeat: int, sync=None) -> float:
    """Median seconds of `repeat` single calls of fn, no warm-up (the tuner's spread)."""
    run = _runs(fn, sync)
    return statistics.median(run(1) for _ in range(repeat))


SETTLE_SECONDS = 0.1  # where the threads cannot be watched (no /proc): a fixed wait
SETTLE_POLL_SECONDS = 0.005
SETTLE_MAX_SECONDS = 1.0  # a thread that never sleeps (not a pool) must not stall the bench


def settle() -> None:
    """Wait until the other library's worker threads sleep. OpenMP's (torch's) and TVM's
    pools spin for a while after their last parallel region, and a timing started in that
    window shares the cores with them: on the 2-core host, the L3 copy measured right after
    a torch call ran at half its bandwidth about one time in three. TVM's workers spin ~0.12 s
    there (300000 sched_yield calls), longer than the fixed 0.1 s this waited before: a
    parallel torch peer that started beside a spinning worker ran 300x slower (torch.gather
    on three_interpolate_forward's net_16x16x512_n64, 15-26 ms a call against 0.05-0.09),
    since each yield then hands over a time slice and the spin outlasts the peer's block.
    So this waits, polling, until no other thread of the process is running (Linux: their
    states in /proc), a fixed time elsewhere."""
    if not os.path.isdir(_TASKS):
        time.sleep(SETTLE_SECONDS)
        return
    deadline = time.perf_counter() + SETTLE_MAX_SECONDS
    quiet = 0
    while quiet < 2 and time.perf_counter() < deadline:  # two polls in a row with none running
        time.sleep(SETTLE_POLL_SECONDS)
        quiet = quiet + 1 if not _other_threads_running() else 0


_TASKS = "/proc/self/task"


def _other_threads_running() -> bool:
    """Whether a thread of this process other than the caller is running or runnable (a
    spinning pool worker is: sched_yield keeps it so)."""
    me = threading.get_native_id()
    for tid in os.listdir(_TASKS):
        if int(tid) == me:
            continue
        try:
            with open(f"{_TASKS}/{tid}/stat") as stat:
                fields = stat.read()
        except OSError:  # the thread ended meanwhile
            continue
        if fields[fields.rindex(")") + 2] == "R":  # the state follows the name, which may hold ")"
            return True
    return False


def stream_bandwidth(model: TargetModel, repeat: int = 10) -> float:
    """Bytes/s of a parallel, vectorised TVM copy kernel (read + write) on this target, over
    buffers far beyond the caches: the faster of its cached and streamed stores (the two
    timed in turn)."""
    dram = _dram_roofline(model, repeat)
    return dram.bandwidth(interleaved_medians(dram.timings, repeat))


def copy_timing(model: TargetModel, nbytes: int, streamed: bool = False) -> tuple[int, Callable[[], float]]:
    """(bytes read + written per run, block timer) of the copy kernel moving ~`nbytes` in all
    (nbytes / 2 copied); `streamed`: its non-temporal-store variant (streamed_copy(model))."""
    lib, dev = _copy_kernel(model, streamed)
    return 2 * _copy_rows(nbytes) * _COPY_ROW * 4, kernel_timing(lib, lib.entry_name, dev, _copy_buffers(model, nbytes))


def _copy_rows(nbytes: int) -> int:
    return max(1, nbytes // 2 // (_COPY_ROW * 4))


@functools.lru_cache(maxsize=2)  # the stream's 256 MiB, allocated once per process, and a case's
def _copy_buffers(model: TargetModel, nbytes: int) -> list:
    import tvm

    _, dev = _copy_kernel(model)
    rows = _copy_rows(nbytes)
    return [tvm.runtime.tensor(np.ones((rows, _COPY_ROW), "float32"), dev),
            tvm.runtime.empty((rows, _COPY_ROW), "float32", dev)]


def streamed_copy(model: TargetModel) -> bool:
    """Whether the copy kernel has a streamed variant here: this host's CPU, with x86's
    non-temporal stores (each of whole cache lines, cpu_ir.line_vector: the rows, 1 KiB each,
    start on one, as TVM tensors are 64-byte aligned)."""
    from .ops import cpu_ir

    return host_cpu(model) and cpu_ir.has_streaming_stores(model.features())


def host_cpu(model: TargetModel) -> bool:
    """Whether the model is this machine's CPU: the only target whose rooflines the bench
    measures (a cross-compiled CPU's bench runs elsewhere)."""
    return model.kind == "llvm" and not model.mtriple


_COPY_ROW = 256  # floats per row of the copy kernel's [rows, 256] buffers
# rows per task of the streamed copy: its stores are ordered (SFENCE) once per task, and a
# fence per row (1 KiB) halved the copy's bandwidth on the 2-core host
_STREAMED_TASK_ROWS = 64
_copy_kernels: dict = {}


def _copy_kernel(model: TargetModel, streamed: bool = False):
    """(library, device) of the copy kernel for `model`: rows over the cores (CUDA: blocks),
    each row in vectors (threads); `streamed`: tasks of rows stored by non-temporal vector
    stores (cpu_ir.stream_ir), then a fence. Built once per process."""
    import tvm
    from tvm.script import tirx as T

    key = (model.key, streamed)
    if key in _copy_kernels:
        return _copy_kernels[key]
    if streamed:
        _copy_kernels[key] = tvm.tirx.build(_streamed_copy_module(model), target=model.tvm_target()), tvm.cpu()
        return _copy_kernels[key]

    @T.prim_func(s_tir=True)
    def copy(a_h: T.handle, b_h: T.handle):
        rows = T.int32()
        a = T.match_buffer(a_h, (rows, _COPY_ROW), "float32")
        b = T.match_buffer(b_h, (rows, _COPY_ROW), "float32")
        for r, i in T.grid(rows, _COPY_ROW):
            with T.sblock("copy"):
                vr, vi = T.axis.remap("SS", [r, i])
                b[vr, vi] = a[vr, vi]

    sch = tvm.s_tir.Schedule(copy)
    r, i = sch.get_loops(sch.get_sblock("copy"))
    if model.kind == "llvm":
        _, lanes = sch.split(i, factors=[None, model.lanes("float32")])
        sch.parallel(r)
        sch.vectorize(lanes)
        dev = tvm.cpu()
    else:
        sch.bind(r, "blockIdx.x")
        sch.bind(i, "threadIdx.x")
        dev = tvm.cuda()
    _copy_kernels[key] = tvm.tirx.build(sch.mod, target=model.tvm_target()), dev
    return _copy_kernels[key]


def _streamed_copy_module(model: TargetModel):
    """The copy with non-temporal stores (only where streamed_copy(model))."""
    import tvm
    from tvm.script import tirx as T

    from .ops import cpu_ir

    # words per store: whole cache lines of whole registers (two AVX2 ones a line)
    words, K = cpu_ir.line_vector(model.lanes("float32"), "float32"), _STREAMED_TASK_ROWS
    store = f"tvm_ops_stream_x{words}_float32"

    @T.prim_func(s_tir=True)
    def copy(a_h: T.handle, b_h: T.handle):
        rows = T.int32()
        a = T.match_buffer(a_h, (rows, _COPY_ROW), "float32")
        b = T.match_buffer(b_h, (rows, _COPY_ROW), "float32")
        for t in range(T.ceildiv(rows, K)):
            with T.sblock("task"):
                vt = T.axis.remap("S", [t])
                T.reads(a[vt * K:vt * K + K, 0:_COPY_ROW])
                T.writes(b[vt * K:vt * K + K, 0:_COPY_ROW])
                for j, o in T.grid(T.min(K, rows - vt * K), _COPY_ROW // words):
                    T.evaluate(T.call_extern("void", store, T.address_of(b[vt * K + j, o * words]),
                                             a[vt * K + j, T.Ramp(o * words, 1, words)]))
                T.evaluate(T.call_extern("void", "tvm_ops_store_fence"))

    sch = tvm.s_tir.Schedule(copy)
    (t,) = sch.get_loops(sch.get_sblock("task"))
    sch.parallel(t)
    sch.annotate(t, "pragma_import_llvm", cpu_ir.stream_ir(model.features(), words, "float32"))
    return sch.mod


READ_TIMING = "roofline read"
AT_SIZE_TIMING = "roofline copy at size"
# a case of up to this many times the L3 is also held to the copy at its own size: repeated,
# part of its bytes stay in the L3 (2026-11-28, the 2-core znver4 host, 32 MiB of L3: the
# copy moved 141 / 94 / 73 / 52 GB/s over 0.75 / 1.5 / 2 / 3 times it, 44 over 256 MiB, and
# DRAM's streamed copy ~60)
PARTLY_CACHED_L3 = 3
PARTLY_CACHED = "L3/DRAM"


@dataclass
class Roofline:
    """What bounds a case, timed beside it: `name` (L2, L3, DRAM or an access pattern),
    the bytes each run of its timings moves, the timings (the fastest one's median is its
    time) and a bandwidth it is at least (a cache level's: the DRAM stream).

    DRAM with a READ_TIMING (the read kernel: `read_moved` bytes a run): two cores read
    alone slower than a copy reads and writes together, so a case reading `reads` of its
    `io_bytes` takes at least reads / (the read bandwidth) as well as io_bytes / (the
    copy's): the slower of the two is its time, io_bytes over it the bandwidth. DRAM with
    an AT_SIZE_TIMING (a partly cached case: the copy at its own size, `at_size_moved`
    bytes a run): the faster of that copy and the rest is the bandwidth (`label` names it)."""
    name: str
    moved: float
    timings: dict
    floor: float = 0.0
    reads: float = 0.0
    io_bytes: float = 0.0
    read_moved: float = 0.0
    at_size_moved: float = 0.0  # bytes a run of the AT_SIZE_TIMING copy moves (a partly cached case)

    def bandwidth(self, medians: dict) -> float:
        return max(self._bandwidths(medians))

    def label(self, medians: dict) -> str:
        """The roofline's name, PARTLY_CACHED where the copy at the case's size was the faster."""
        own, at_size = self._bandwidths(medians)
        return PARTLY_CACHED if at_size > own else self.name

    def _bandwidths(self, medians: dict) -> tuple[float, float]:
        """(this roofline's bandwidth without the copy at the case's size, that copy's or 0)."""
        at_size = self.at_size_moved / medians[AT_SIZE_TIMING] if AT_SIZE_TIMING in self.timings else 0.0
        timings = [name for name in self.timings if name not in (READ_TIMING, AT_SIZE_TIMING)]
        if not timings:
            return self.floor, at_size
        copy = max(self.moved / min(medians[name] for name in timings), self.floor)
        if READ_TIMING not in self.timings:
            return copy, at_size
        seconds = max(self.reads * medians[READ_TIMING] / self.read_moved, self.io_bytes / copy)
        return self.io_bytes / seconds, at_size


def read_timing(model: TargetModel) -> tuple[int, Callable[[], float]]:
    """(bytes read per run, block timer) of the read kernel (this CPU): a parallel,
    vectorised sum of a [rows, 256] float32 buffer twice the L3 (at least the stream's
    bytes), so each run reads it from memory; each task of _READ_TASK_ROWS rows adds them
    into its row of sums, a 64th of the bytes read."""
    import tvm

    from .targets import cache_bytes

    rows = max(STREAM_BYTES, 2 * (cache_bytes(3) or 0)) // (_COPY_ROW * 4)
    return rows * _COPY_ROW * 4, kernel_timing(read_kernel(model), "read", tvm.cpu(), _read_buffers(rows))


@functools.lru_cache(maxsize=1)  # allocated once per process
def _read_buffers(rows: int) -> list:
    import tvm

    tasks = -(-rows // _READ_TASK_ROWS)
    return [tvm.runtime.tensor(np.ones((rows, _COPY_ROW), "float32"), tvm.cpu()),
            tvm.runtime.empty((tasks, _COPY_ROW), "float32", tvm.cpu())]


_READ_TASK_ROWS = 64
_read_kernels: dict = {}


def read_kernel(model: TargetModel):
    """The read kernel's library for this CPU, built once per process: sums[t, i] = the
    sum of a[r, i] over task t's rows r."""
    import tvm
    from tvm.script import tirx as T

    if model.key in _read_kernels:
        return _read_kernels[model.key]
    K, lanes = _READ_TASK_ROWS, model.lanes("float32")

    @T.prim_func(s_tir=True)
    def read(a_h: T.handle, sums_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        rows, tasks = T.int32(), T.int32()
        a = T.match_buffer(a_h, (rows, _COPY_ROW), "float32")
        sums = T.match_buffer(sums_h, (tasks, _COPY_ROW), "float32")
        for t in T.parallel(tasks):
            for o in range(_COPY_ROW // lanes):
                for lane in T.vectorized(lanes):
                    sums[t, o * lanes + lane] = T.float32(0)
            for j in range(T.min(K, rows - t * K)):
                for o in range(_COPY_ROW // lanes):
                    for lane in T.vectorized(lanes):
                        sums[t, o * lanes + lane] = sums[t, o * lanes + lane] + a[t * K + j, o * lanes + lane]

    _read_kernels[model.key] = tvm.tirx.build(tvm.IRModule({"read": read.with_attr("global_symbol", "read")}),
                                              target=model.tvm_target())
    return _read_kernels[model.key]


def cache_level(model: TargetModel, io_bytes: float) -> str | None:
    """The level of this CPU's caches whose half holds io_bytes (all the model's cores' L2,
    then the L3), None for DRAM."""
    from .targets import cache_bytes

    l2, l3 = cache_bytes(2), cache_bytes(3)
    for name, size in (("L2", l2 * model.cores if l2 else None), ("L3", l3)):
        if size and io_bytes <= size / 2:
            return name
    return None


def bytes_roofline(model: TargetModel, io_bytes: float, stream: float, repeat: int, reads: float = 0.0) -> Roofline:
    """The copy kernel at the case's size where a cache level holds its bytes (data staying
    in the cache between runs, as the case's does), else over the stream's buffers, with
    cached and (streamed_copy) streamed stores, and, for a case reading `reads` bytes, the
    read kernel (Roofline); a cache level or DRAM moves at least `stream`, the run's own
    measure of DRAM; another target than this CPU: `stream`, measured once (its rooflines
    are not measured per case)."""
    if not host_cpu(model):
        return Roofline("DRAM", 0.0, {}, stream)
    level = cache_level(model, io_bytes)
    if level:  # a streamed store bypasses the cache level measured here
        moved, block = copy_timing(model, int(io_bytes))
        return Roofline(level, moved, {"roofline copy": Timed(block, "tvm", repeat)}, stream)
    dram = _dram_roofline(model, repeat)
    # at least the run's stream: on a shared host the copies timed beside the case can all
    # fall in slow spells the case's own blocks miss (a case read 102.5% of such a DRAM
    # roofline, 8.1 GB/s, in a run whose stream was 24 GB/s)
    dram.floor = stream
    if reads:
        read_moved, block = read_timing(model)
        dram.timings[READ_TIMING] = Timed(block, "tvm", repeat)
        dram.reads, dram.io_bytes, dram.read_moved = min(reads, io_bytes), io_bytes, read_moved
    if partly_cached(io_bytes):
        dram.at_size_moved, block = copy_timing(model, int(io_bytes))
        dram.timings[AT_SIZE_TIMING] = Timed(block, "tvm", repeat)
    return dram


def partly_cached(io_bytes: float) -> bool:
    """Whether a case beyond the caches' halves is small enough that, repeated, part of its
    bytes stay in the L3 (PARTLY_CACHED_L3)."""
    from .targets import cache_bytes

    l3 = cache_bytes(3)
    return bool(l3) and io_bytes <= PARTLY_CACHED_L3 * l3


def _dram_roofline(model: TargetModel, repeat: int) -> Roofline:
    """The copy over the stream's buffers, with cached and (streamed_copy) streamed stores:
    the faster is DRAM's bandwidth."""
    moved, block = copy_timing(model, STREAM_BYTES)
    timings = {"roofline copy": Timed(block, "tvm", repeat)}
    if streamed_copy(model):
        timings["roofline copy streamed"] = Timed(copy_timing(model, STREAM_BYTES, streamed=True)[1], "tvm", repeat)
    return Roofline("DRAM", moved, timings)


def pattern_roofline(model: TargetModel, pattern, io_bytes: float, repeat: int) -> Roofline:
    """The case's accesses alone (tvm_ops/access_pattern.py), each prefetch distance timed
    (and, for a large gathered output, cached and streamed stores): the fastest is the
    roofline."""
    import tvm

    args = access_pattern.timing_arguments(pattern)
    stores = (False, True) if access_pattern.streamable(model, pattern) else (False,)
    timings = {f"roofline {pattern.name} ahead {ahead}{' streamed' if streamed else ''}":
               Timed(kernel_timing(access_pattern.kernel(model, pattern, ahead, streamed), "pattern", tvm.cpu(), args),
                     "tvm", repeat) for ahead in access_pattern.AHEADS for streamed in stores}
    return Roofline(pattern.name, io_bytes, timings)


FMA_CHAINS = 12  # independent accumulators per core: enough to cover the FMA latency
_peaks: dict = {}


def peak_flops(model: TargetModel) -> float | None:
    """Float32 FLOP/s of an FMA loop in TVM on every core (FMA_CHAINS independent vector
    accumulators each; the fastest of 15 repeats), measured once per process; None for
    other than this host's CPU."""
    if not host_cpu(model):
        return None
    if model.key not in _peaks:
        import tvm
        from tvm.script import tirx as T

        lanes, chains, iters = model.lanes("float32"), FMA_CHAINS, 100_000

        @T.prim_func(s_tir=True)
        def fma_loop(out_h: T.handle, steps: T.int32):
            tasks = T.int32()
            out = T.match_buffer(out_h, (tasks, chains, lanes), "float32")
            for t in T.parallel(tasks):
                acc = T.alloc_buffer((chains, lanes), "float32", scope="local")
                for a in T.unroll(chains):
                    for v in T.vectorized(lanes):
                        acc[a, v] = T.Cast("float32", t + a + v)
                for _ in range(steps):
                    for a in T.unroll(chains):
                        for v in T.vectorized(lanes):
                            acc[a, v] = T.fma(acc[a, v], T.float32(0.9999), T.float32(0.0001))
                for a in T.unroll(chains):
                    for v in T.vectorized(lanes):
                        out[t, a, v] = acc[a, v]

        lib = tvm.tirx.build(tvm.IRModule({"fma_loop": fma_loop.with_attr("global_symbol", "fma_loop")}),
                             target=model.tvm_target())
        out = tvm.runtime.empty((model.cores, chains, lanes), "float32", tvm.cpu())
        lib["fma_loop"](out, iters)  # the thread pool up, the cores at their vector clock
        # the best of 15 repeats of 10 runs (~2 ms each, 30 ms in all): a peak, and a shared
        # host only ever slows a repeat (7 single runs, 1.5 ms in all, once read a third)
        seconds = min(lib.time_evaluator("fma_loop", tvm.cpu(), number=10, repeat=15)(out, iters).results)
        _peaks[model.key] = model.cores * iters * chains * lanes * 2 / seconds
    return _peaks[model.key]


def bench_case(op, case, dtype: str, model: TargetModel, bandwidth: float, repeat: int, peer: bool) -> BenchLine:
    """The public call on the case's inputs, its PyTorch peers and its roofline, timed in
    turn (interleaved_medians); `bandwidth`: the run's stream bandwidth, measured once."""
    inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
    # numpy's large arrays start 16 bytes into a line: a row of whole lines would straddle one more
    inputs = {name: host_buffers.line_aligned(value) for name, value in inputs.items()}
    on_target = runner.to_target(model, inputs)
    sync = None
    if model.kind == "cuda":
        import torch

        sync = torch.cuda.synchronize
    call = lambda: op.call(on_target, params, model, {})  # noqa: E731 - a timed thunk
    call()  # build or load the kernels outside the timing
    io_bytes, ops = op.spec.theory(case.shape, np.dtype(dtype).itemsize, params)
    timings = {"case": Timed(call_timing(call, sync), "tvm", repeat)}
    peers = peer_timings(op, inputs, params, model, peer_rounds(repeat), sync) if peer else {}
    pattern_of = getattr(material(op), "access_pattern", None)
    pattern = pattern_of(inputs, params) if pattern_of is not None and host_cpu(model) and io_bytes else None
    # the case's accesses themselves (its streams included) where its bytes are not what
    # bounds it (or overstate it: a gather need not touch every row of its table)
    reads = sum(value.nbytes for value in inputs.values() if isinstance(value, np.ndarray))
    bound = (pattern_roofline(model, pattern, io_bytes, repeat) if pattern is not None
             else bytes_roofline(model, io_bytes, bandwidth, repeat, reads))
    medians = interleaved_medians({**timings, **peers, **bound.timings}, repeat)
    seconds, bound_bandwidth = medians["case"], bound.bandwidth(medians)
    peer_ms = {name.removeprefix("peer "): medians[name] * 1e3 for name in peers}
    # the ratio is against the fastest formulation of this run, whichever it is
    main_peer = min(peer_ms, key=peer_ms.get, default=None)
    main_ms = peer_ms.pop(main_peer) if main_peer else None
    problem = checks.check(op.spec, inputs, params, {}, op.rules)
    origin = dispatch.default_variant(op, dtype, model, records.problem_class(op.spec, problem)).origin
    one_core = dispatch.runs_on_one_core(op, problem, model)
    peak = peak_flops(model)
    return BenchLine(
        op.name, case.name, dtype, model.key, origin, seconds * 1e3, io_bytes / seconds / 1e9,
        io_bytes / seconds / bound_bandwidth, (ops / seconds / peak) if ops and peak else None,
        main_ms, (main_ms / 1e3 / seconds) if main_ms else None, peer_ms, main_peer, bound.label(medians),
        bound_bandwidth / 1e9, one_core)


def peer_timings(op, inputs: dict, params: dict, model: TargetModel, rounds: int, sync) -> dict:
    """{"peer NAME": Timed} of the op's PyTorch eager formulations, on the target's device
    (CPU or GPU), each run under that device (the tensors they make land there)."""
    try:
        import torch
    except ImportError:
        return {}
    device = torch.device("cuda" if model.kind == "cuda" else "cpu")
    timings = {}
    with device:
        for name, run_peer in material(op).peers(inputs, params).items():
            run_peer()
            timings[f"peer {name}"] = Timed(on_device(device, call_timing(run_peer, sync)), "torch", rounds)
    return timings


def on_device(device, block):
    """block, run with `device` the default of the tensors it makes. The CPU, PyTorch's
    default, is left as it is: `with torch.device(...)` is a function mode that every torch
    call then passes through (a 39 us scatter_add_ peer took 63 us under it)."""
    if device.type == "cpu":
        return block

    def run():
        with device:
            return block()
    return run


def as_json(lines: list[BenchLine], bandwidth: float, model: TargetModel) -> dict:
    return {"target": model.key, "stream_bandwidth_gbps": bandwidth / 1e9,
            "peak_gflops": (peak_flops(model) or 0) / 1e9, "cases": [asdict(line) for line in lines]}
