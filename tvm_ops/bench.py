"""Benchmarks: median times of spec cases, efficiency against this machine's
bandwidth measured in the same run, and the ratio against the fastest of the op's
PyTorch eager formulations (testing/<op>.py `peers`), timed on the same inputs in the
same run."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import checks, dispatch, records, runner
from .targets import TargetModel
from .testing import material

STREAM_ELEMENTS = 32 * 1024 * 1024  # 128 MiB per buffer: far beyond the caches


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

    def text(self) -> str:
        compute = f"{self.compute_efficiency:6.1%}" if self.compute_efficiency is not None else "    - "
        peer = (f"best peer {self.peer} {self.peer_ms:9.2f} ms  x{self.speedup:6.1f}" if self.peer_ms is not None
                else "peer        -")
        others = "".join(f"  [{name} {ms:.2f} ms x{ms / self.median_ms:.1f}]" for name, ms in self.other_peers.items())
        return (f"{self.op:28s} {self.case:26s} {self.dtype:8s} {self.target:18s} {self.origin:16s} "
                f"{self.median_ms:9.3f} ms "
                f"{self.gbps:7.2f} GB/s  io {self.io_efficiency:6.1%}  compute {compute}  {peer}{others}")


def median_seconds(fn, repeat: int, sync=None) -> float:
    times = []
    for _ in range(repeat):
        if sync is not None:
            sync()  # nothing queued before may count against this run
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream_bandwidth(model: TargetModel, repeat: int = 10) -> float:
    """Bytes/s of a parallel, vectorised TVM copy kernel (read + write) on this target."""
    import tvm
    from tvm.script import tirx as T

    lanes = model.lanes("float32")

    @T.prim_func(s_tir=True)
    def stream_copy(a: T.Buffer((STREAM_ELEMENTS,), "float32"), b: T.Buffer((STREAM_ELEMENTS,), "float32")):
        for i in range(STREAM_ELEMENTS):
            with T.sblock("copy"):
                vi = T.axis.remap("S", [i])
                b[vi] = a[vi]

    sch = tvm.s_tir.Schedule(stream_copy)
    (i,) = sch.get_loops(sch.get_sblock("copy"))
    if model.kind == "llvm":
        outer, inner = sch.split(i, factors=[None, lanes])
        sch.parallel(outer)
        sch.vectorize(inner)
        dev = tvm.cpu()
    else:
        blocks, threads = sch.split(i, factors=[None, 256])
        sch.bind(blocks, "blockIdx.x")
        sch.bind(threads, "threadIdx.x")
        dev = tvm.cuda()
    lib = tvm.tirx.build(sch.mod, target=model.tvm_target())
    a = tvm.runtime.tensor(np.ones(STREAM_ELEMENTS, "float32"), dev)
    b = tvm.runtime.empty((STREAM_ELEMENTS,), "float32", dev)
    timer = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=repeat)
    return 2 * STREAM_ELEMENTS * 4 / timer(a, b).median


def peak_flops(model: TargetModel) -> float | None:
    """Theoretical float32 FLOP/s of the CPU: cores x clock x lanes x 2 FMA pipes x 2."""
    if model.kind != "llvm":
        return None
    try:
        mhz = max(float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("cpu MHz"))
    except (OSError, ValueError):
        return None
    return model.cores * mhz * 1e6 * model.lanes("float32") * 2 * 2


def bench_case(op, case, dtype: str, model: TargetModel, bandwidth: float, repeat: int, peer: bool) -> BenchLine:
    inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
    on_target = runner.to_target(model, inputs)
    sync = None
    if model.kind == "cuda":
        import torch

        sync = torch.cuda.synchronize
    call = lambda: op.call(on_target, params, model, {})  # noqa: E731 - a timed thunk
    call()  # build or load the kernels outside the timing
    seconds = median_seconds(call, repeat, sync)
    io_bytes, ops = op.spec.theory(case.shape, np.dtype(dtype).itemsize, params)
    peak = peak_flops(model)
    peers = {}
    if peer:
        peers = time_peers(op, inputs, params, model, repeat, sync)
    # the ratio is against the fastest formulation of this run, whichever it is
    main_peer = min(peers, key=peers.get, default=None)
    peer_ms = peers.pop(main_peer) if main_peer else None
    problem = checks.check(op.spec, inputs, params, {}, op.rules)
    origin = dispatch.default_variant(op, dtype, model, records.problem_class(op.spec, problem)).origin
    return BenchLine(
        op.name, case.name, dtype, model.key, origin, seconds * 1e3, io_bytes / seconds / 1e9,
        io_bytes / seconds / bandwidth, (ops / seconds / peak) if ops and peak else None,
        peer_ms, (peer_ms / 1e3 / seconds) if peer_ms else None, peers, main_peer)


def time_peers(op, inputs: dict, params: dict, model: TargetModel, repeat: int, sync) -> dict:
    """{name: median ms} of the op's PyTorch eager peers, on the target's device (CPU or GPU)."""
    try:
        import torch
    except ImportError:
        return {}
    peers = {}
    with torch.device("cuda" if model.kind == "cuda" else "cpu"):
        for name, run_peer in material(op).peers(inputs, params).items():
            run_peer()
            peers[name] = median_seconds(run_peer, max(3, repeat // 2), sync) * 1e3
    return peers


def as_json(lines: list[BenchLine], bandwidth: float, model: TargetModel) -> dict:
    return {"target": model.key, "stream_bandwidth_gbps": bandwidth / 1e9,
            "peak_gflops": (peak_flops(model) or 0) / 1e9, "cases": [asdict(line) for line in lines]}
