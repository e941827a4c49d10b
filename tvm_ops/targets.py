"""Target models: what the MLU-style policy needs to know about a machine.

A `TargetModel` is plain data (cores, on-chip bytes, vector width), so the
policy can be tested without TVM. `host_cpu()` reads the machine it runs on;
`cuda(arch)` describes an NVIDIA architecture from a small table, so CUDA
kernels can be built on a machine without a GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ArchMismatchError, BadParamError

TARGET_KINDS = ("llvm", "cuda")

# SM count and shared memory a block may use (bytes), per architecture.
CUDA_ARCHS = {
    "sm_70": (80, 96 * 1024),
    "sm_75": (40, 64 * 1024),
    "sm_80": (108, 163 * 1024),
    "sm_86": (84, 99 * 1024),
    "sm_89": (128, 99 * 1024),
    "sm_90": (132, 227 * 1024),
}
DEFAULT_CUDA_ARCH = "sm_80"


@dataclass(frozen=True)
class TargetModel:
    """The machine as mlu-ops sees an MLU: taskDim cores, an NRAM budget, an NFU width."""

    kind: str  # "llvm" or "cuda"
    cpu: str  # LLVM -mcpu name ("" for cuda targets)
    arch: str  # CUDA arch ("" for llvm targets)
    cores: int  # parallel workers: CPU threads, or SMs
    onchip_bytes: int  # per-core cache budget (L2) or shared memory per block
    vector_bytes: int  # SIMD register width in bytes (CUDA: a warp of 4-byte lanes)

    @property
    def key(self) -> str:
        """Short stable name used in cache keys and file names."""
        return f"llvm-{self.cpu}-{self.cores}c" if self.kind == "llvm" else f"cuda-{self.arch}"

    def lanes(self, dtype: str) -> int:
        """Vector lanes of `dtype` (float16 is computed in float32 lanes on CPUs)."""
        if self.kind == "cuda":
            return 32
        return self.vector_bytes // 4

    def tvm_target(self):
        """The tvm.target.Target for this model (TVM imported lazily)."""
        import tvm

        host = {"kind": "llvm", "mcpu": host_cpu().cpu, "num-cores": host_cpu().cores}
        if self.kind == "llvm":
            return tvm.target.Target({"kind": "llvm", "mcpu": self.cpu, "num-cores": self.cores})
        return tvm.target.Target({"kind": "cuda", "arch": self.arch, "host": host})


def _read_l2_bytes() -> int:
    index = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in sorted(index.glob("index*")):
        try:
            if (entry / "level").read_text().strip() == "2":
                size = (entry / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return 1024 * 1024


def _read_vector_bytes() -> int:
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        ).split()
    except (OSError, StopIteration):
        return 16
    if "avx512f" in flags:
        return 64
    if "avx2" in flags:
        return 32
    return 16


def _worker_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def host_cpu() -> TargetModel:
    """The host CPU with its real -mcpu (a bare "llvm" target would be SSE only)."""
    import tvm

    cpu = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")()
    cores = _worker_count()
    # TVM's runtime uses one thread unless told; use every core, as taskDim = all cores.
    os.environ.setdefault("TVM_NUM_THREADS", str(cores))
    return TargetModel("llvm", cpu, "", cores, _read_l2_bytes(), _read_vector_bytes())


def other_cpu(spec: str) -> TargetModel:
    """Another x86-64 CPU, "MCPU[:CORES]" (e.g. a board measured over RPC): its LLVM -mcpu
    name, its core count (default: this host's) and vector width (from LLVM's feature
    table); the on-chip budget is this host's L2. Libraries for it build here, with this
    host's toolchain, so only x86-64 Linux targets are supported."""
    import tvm

    mcpu, _, cores = spec.partition(":")
    if not tvm.get_global_func("target.llvm_is_valid_cpu")(mcpu, "x86_64-linux-gnu"):
        raise BadParamError(f"target llvm:{spec}: {mcpu!r} is not an x86-64 CPU LLVM knows "
                            f"(e.g. haswell, skylake-avx512, znver4)")
    if cores and (not cores.isdigit() or int(cores) < 1):
        raise BadParamError(f"target llvm:{spec}: the core count must be a positive integer, got {cores!r}")
    has = tvm.get_global_func("target.llvm_cpu_has_feature")
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    vector = 64 if has("avx512f", target) else 32 if has("avx2", target) else 16
    return TargetModel("llvm", mcpu, "", int(cores) if cores else host_cpu().cores, _read_l2_bytes(), vector)


def cuda(arch: str | None = None) -> TargetModel:
    """An NVIDIA target; without `arch` the local GPU's, else sm_80."""
    arch = arch or local_cuda_arch() or DEFAULT_CUDA_ARCH
    if arch not in CUDA_ARCHS:
        raise BadParamError(f"unknown CUDA arch {arch!r}; known: {', '.join(CUDA_ARCHS)}")
    sms, smem = CUDA_ARCHS[arch]
    # Kernels use static shared memory, which CUDA caps at 48 KiB per block on every arch.
    return TargetModel("cuda", "", arch, sms, min(smem, 48 * 1024), 128)


@functools.lru_cache(maxsize=None)
def local_cuda_arch() -> str | None:
    """The arch of GPU 0 if this process can see one, else None (a process's GPUs are fixed
    when CUDA starts, so this is asked once)."""
    import tvm

    dev = tvm.cuda(0)
    if not dev.exist:
        return None
    return "sm_" + dev.compute_version.replace(".", "")


def resolve(target) -> TargetModel:
    """Accept "llvm" (this host), "llvm:MCPU[:CORES]" (another x86-64 CPU), "cuda", "cuda:sm_90"
    or a TargetModel."""
    if isinstance(target, TargetModel):
        return target
    if not isinstance(target, str):
        raise BadParamError(f"target must be a string such as 'llvm' or 'cuda', got {target!r}")
    kind, _, arch = target.partition(":")
    if kind == "llvm":
        return other_cpu(arch) if arch else host_cpu()
    if kind == "cuda":
        return cuda(arch or None)
    raise BadParamError(f"unknown target {target!r}; expected one of {', '.join(TARGET_KINDS)}")


def require_runnable(model: TargetModel) -> None:
    """Raise ArchMismatchError when kernels for `model` cannot run in this process."""
    if model.kind == "llvm" and model.cpu != host_cpu().cpu:
        raise ArchMismatchError(f"target llvm:{model.cpu} is not this machine's CPU ({host_cpu().cpu}); "
                                f"build it with `build --target`, or tune it on its board with --rpc-tracker")
    if model.kind == "cuda":
        local = local_cuda_arch()
        if local is None:
            raise ArchMismatchError("target 'cuda' needs an NVIDIA GPU; none is visible to this process")
