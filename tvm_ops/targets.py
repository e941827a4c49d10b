"""Target models: what the MLU-style policy needs to know about a machine.

A `TargetModel` is plain data (cores, on-chip bytes, vector width), so the
policy can be tested without TVM. `host_cpu()` reads the machine it runs on;
`other_cpu` describes another x86-64 CPU and `llvm_cpu` any CPU LLVM targets (an aarch64
board: built here to assembly, run there); `cuda(arch)` describes an NVIDIA architecture
from a small table, so CUDA kernels can be built on a machine without a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from . import forked, host_record
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
# "llvm:aarch64[:CORES]": a generic 64-bit Arm CPU (NEON, 16-byte vectors)
AARCH64_TRIPLE = "aarch64-linux-gnu"


@dataclass(frozen=True)
class TargetModel:
    """The machine as mlu-ops sees an MLU: taskDim cores, an NRAM budget, an NFU width."""

    kind: str  # "llvm" or "cuda"
    cpu: str  # LLVM -mcpu name ("" for cuda targets)
    arch: str  # CUDA arch ("" for llvm targets)
    cores: int  # parallel workers: CPU threads, or SMs
    onchip_bytes: int  # per-core cache budget (L2) or shared memory per block
    vector_bytes: int  # SIMD register width in bytes (CUDA: a warp of 4-byte lanes)
    mtriple: str = ""  # LLVM target triple; "" for this host's (x86-64) and for cuda targets
    # LLVM features of `cpu` this machine lacks (a virtual machine may mask some, AVX-512
    # among them): kernels are built without them, so they never hold such an instruction
    disabled: tuple = ()

    @property
    def key(self) -> str:
        """Short stable name used in cache keys and file names."""
        if self.kind == "cuda":
            return f"cuda-{self.arch}"
        machine = f"{triple_arch(self.mtriple)}-" if self.mtriple else ""
        # the features built without, as a short digest (a masked VM's list is long)
        without = f"-without-{hashlib.sha1(','.join(self.disabled).encode()).hexdigest()[:8]}" if self.disabled else ""
        return f"llvm-{machine}{self.cpu}{without}-{self.cores}c"

    def lanes(self, dtype: str) -> int:
        """Vector lanes of `dtype` (float16 is computed in float32 lanes on CPUs)."""
        if self.kind == "cuda":
            return 32
        return self.vector_bytes // 4

    def tvm_target(self):
        """The tvm.target.Target for this model (TVM imported lazily)."""
        import tvm

        if self.kind == "llvm":
            triple = {"mtriple": self.mtriple} if self.mtriple else {}
            return tvm.target.Target({"kind": "llvm", "mcpu": self.cpu, "num-cores": self.cores, **triple,
                                      **self._mattr()})
        host = host_cpu()
        return tvm.target.Target({"kind": "cuda", "arch": self.arch, "host": {
            "kind": "llvm", "mcpu": host.cpu, "num-cores": host.cores, **host._mattr()}})

    def _mattr(self) -> dict:
        return {"mattr": [f"-{feature}" for feature in self.disabled]} if self.disabled else {}

    @property
    def vector_registers(self) -> int:
        """SIMD registers a CPU kernel keeps its values in: 32 with AVX-512 and on AArch64,
        16 on other x86-64 CPUs (AVX2 and before); 0 for cuda."""
        if self.kind != "llvm":
            return 0
        return 32 if self.mtriple or self.vector_bytes >= 64 else 16

    def features(self) -> frozenset:
        """The CPU's LLVM features ("avx512f", "sse2", "neon", ...); empty for cuda."""
        if self.kind != "llvm":
            return frozenset()
        return _llvm_features(self.mtriple, self.cpu) - frozenset(self.disabled)


def triple_arch(mtriple: str) -> str:
    """The architecture of an LLVM triple ("aarch64" of "aarch64-linux-gnu")."""
    return mtriple.partition("-")[0]


@functools.lru_cache(maxsize=None)
def _llvm_features(mtriple: str, cpu: str) -> frozenset:
    host = host_record.load() if not mtriple else None  # the host's CPU: known without TVM
    if host is not None and host["cpu"] == cpu:
        return frozenset(host["features"])
    tvm = forked.import_tvm()

    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu, **({"mtriple": mtriple} if mtriple else {})})
    return frozenset(tvm.get_global_func("target.llvm_get_cpu_features")(target))


def _read_l2_bytes() -> int:
    return cache_bytes(2) or 1024 * 1024


@functools.cache
def cache_bytes(level: int) -> int | None:
    """The size of this host's level-`level` data cache as the first CPU sees it (L2: per
    core; L3: shared), or None when the OS does not tell (read once per process)."""
    index = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in sorted(index.glob("index*")):
        try:
            if (entry / "level").read_text().strip() == str(level) and \
                    (entry / "type").read_text().strip() in ("Data", "Unified"):
                size = (entry / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return None


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


# TVM's thread pool: its workers spin this many sched_yield calls between kernels before they
# sleep (TVM's default, runtime/thread_pool.cc), unless the environment says otherwise
SPIN_ENV = "TVM_THREAD_POOL_SPIN_COUNT"
TVM_DEFAULT_SPIN = 300000


def sleep_workers_between_kernels() -> None:
    """Have TVM's CPU workers sleep between kernels (unless the environment already says how
    long they spin); TVM reads this once, when its first parallel kernel runs, so it takes
    effect only before that.

    For callers that pass torch tensors: after each parallel torch op PyTorch's OpenMP
    workers spin too, and where torch ops and these kernels take turns on the same cores,
    each pool's spinning workers hold the cores the other's need, a scheduler time slice
    at a time (a voxel_pooling training step on 2 cores: 7.9 ms instead of 2.4;
    docs/performance.md). A sleeping worker's wake-up costs a call tens of microseconds
    on a small case, so callers with numpy arrays keep TVM's spinning workers."""
    os.environ.setdefault(SPIN_ENV, "0")


def workers_asleep_between_kernels() -> bool:
    """Whether TVM's CPU workers sleep between kernels (the spin count is 0), so that waking
    them costs a parallel loop tens of microseconds rather than a few."""
    return os.environ.get(SPIN_ENV, "").strip() == "0"


# what TVM's pool is refused beyond (it reads both once, when its first parallel kernel runs):
# more threads than any CPU this serves, or a spin from which a worker does not come back to
# let the process exit (measured: 10^9 spins, or -1, never did; TVM's 300000 takes seconds)
MAX_THREADS = 1024
MAX_SPIN = 1_000_000


def _require_thread_settings() -> None:
    """BadParamError for a TVM_NUM_THREADS or TVM_THREAD_POOL_SPIN_COUNT that TVM's pool would
    take and then hang on (a huge thread count, a negative or huge spin). A blank one is
    removed, as unset: TVM would read it as 0 (one thread, or workers that never spin)."""
    for name, least, most in (("TVM_NUM_THREADS", 1, MAX_THREADS), (SPIN_ENV, 0, MAX_SPIN)):
        raw = os.environ.get(name)
        if raw is None:
            continue
        if not raw.strip():
            del os.environ[name]
            continue
        text = raw.strip()
        if not (text.isascii() and text.isdigit() and least <= int(text) <= most):  # TVM's atoi: ASCII only
            raise BadParamError(f"{name} must be an integer from {least} to {most}, got {raw!r}")


def available_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@functools.lru_cache(maxsize=None)
def host_cpu() -> TargetModel:
    """The host CPU with its real -mcpu (a bare "llvm" target would be SSE only), as TVM's
    LLVM names it: asked once per CPU, then read from the cache directory (host_record.py)."""
    _require_thread_settings()  # before the first kernel starts TVM's pool with them
    cores = available_cores()
    # TVM's runtime uses one thread unless told; use every core, as taskDim = all cores.
    threads = int(os.environ.setdefault("TVM_NUM_THREADS", str(cores)))
    if threads > cores:
        # more workers than cores: a spinning worker holds a core another one needs, and at
        # exit each spins its count out first (1000 threads on 2 cores: the process never
        # ended; sleeping between kernels: it exits in seconds)
        os.environ.setdefault(SPIN_ENV, "0")
    known = host_record.load()
    if known is not None:
        cpu = known["cpu"]
    else:
        tvm = forked.import_tvm()

        cpu = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUName")()
        host_record.store(cpu, _llvm_features("", cpu), _host_features())
    disabled = lacking_features(cpu, _host_features())
    return TargetModel("llvm", cpu, "", cores, _read_l2_bytes(), _read_vector_bytes(), "", disabled)


@functools.lru_cache(maxsize=None)
def _host_features() -> dict:
    """{LLVM feature: whether this machine's CPU has it (CPUID; read once, the checked path of
    every new call signature asks it)}."""
    known = host_record.load()  # kept with the host's CPU name: no TVM
    if known is not None:
        return known["host"]
    tvm = forked.import_tvm()

    # Python bools: TVM's values are IntImm, whose truth test costs ~0.15 us, and the
    # checked path tests ~60 of them (10 us of every new call signature)
    return {str(name): bool(present)
            for name, present in tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")().items()}


def _absent(features, host: dict) -> list[str]:
    """The CPUID features among `features` that `host` ({feature: present}) lacks, sorted
    (LLVM's tuning flags, which no instruction needs, are not CPUID features: never among them)."""
    return sorted(f for f in features if f in host and not host[f])


def lacking_features(cpu: str, host: dict) -> tuple:
    """The features LLVM's x86-64 `cpu` implies that `host` ({feature: present}, CPUID) lacks
    (_absent). LLVM names the host CPU by its family and model, so a virtual machine that
    masks features (this project's own 2-core znver4 host lacks mwaitx, pku, rdpru and
    wbnoinvd; another could lack AVX-512) would otherwise get instructions it cannot run."""
    return tuple(_absent(_llvm_features("", cpu), host))


def other_cpu(spec: str) -> TargetModel:
    """Another x86-64 CPU, "MCPU[:CORES]" (e.g. a board measured over RPC): its LLVM -mcpu
    name, its core count (default: this host's) and vector width (from LLVM's feature
    table); the on-chip budget is this host's L2. Libraries for it build here, with this
    host's toolchain, so only x86-64 Linux targets are supported."""
    tvm = forked.import_tvm()

    mcpu, _, cores = spec.partition(":")
    if not tvm.get_global_func("target.llvm_is_valid_cpu")(mcpu, "x86_64-linux-gnu"):
        raise BadParamError(f"target llvm:{spec}: {mcpu!r} is not an x86-64 CPU LLVM knows "
                            f"(e.g. haswell, skylake-avx512, znver4)")
    if cores and (not cores.isdigit() or int(cores) < 1):
        raise BadParamError(f"target llvm:{spec}: the core count must be a positive integer, got {cores!r}")
    host = host_cpu()
    if mcpu == host.cpu:  # this machine's CPU: built without what it lacks, as host_cpu is
        return dataclasses.replace(host, cores=int(cores) if cores else host.cores)
    has = tvm.get_global_func("target.llvm_cpu_has_feature")
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    vector = 64 if has("avx512f", target) else 32 if has("avx2", target) else 16
    return TargetModel("llvm", mcpu, "", int(cores) if cores else host.cores, _read_l2_bytes(), vector)


def llvm_cpu(mtriple: str, mcpu: str = "generic", cores: int | None = None) -> TargetModel:
    """A CPU of any architecture LLVM targets (e.g. mtriple "aarch64-linux-gnu"; an x86-64
    triple gives other_cpu's model): its kernels build here to assembly (linking them needs
    that platform's toolchain) and run there. Its vector width is LLVM's for the CPU; cores
    default to this host's, the on-chip budget is this host's L2."""
    tvm = forked.import_tvm()

    if triple_arch(mtriple) == "x86_64":
        return other_cpu(f"{mcpu}:{cores}" if cores else mcpu)
    if not tvm.get_global_func("target.llvm_is_valid_cpu")(mcpu, mtriple):
        raise BadParamError(f"target mtriple {mtriple!r}, mcpu {mcpu!r}: not a CPU LLVM knows for that triple")
    if cores is not None and (not isinstance(cores, int) or cores < 1):
        raise BadParamError(f"target mtriple {mtriple!r}: the core count must be a positive integer, got {cores!r}")
    target = tvm.target.Target({"kind": "llvm", "mtriple": mtriple, "mcpu": mcpu})
    vector = tvm.get_global_func("target.llvm_get_vector_width")(target) // 8
    return TargetModel("llvm", mcpu, "", cores or host_cpu().cores, _read_l2_bytes(), max(vector, 4), mtriple)


def from_tvm(spec: dict) -> TargetModel:
    """The model of a TVM target dict: {"kind": "llvm"[, "mtriple", "mcpu", "num-cores"]} or
    {"kind": "cuda"[, "arch"]}."""
    kind = spec.get("kind")
    if kind == "cuda":
        return cuda(spec.get("arch"))
    if kind != "llvm":
        raise BadParamError(f"unknown target kind {kind!r}; expected one of {', '.join(TARGET_KINDS)}")
    unknown = set(spec) - {"kind", "mtriple", "mcpu", "num-cores"}
    if unknown:
        raise BadParamError(f"target {spec!r}: unsupported keys {', '.join(sorted(unknown))}")
    mtriple, mcpu, cores = spec.get("mtriple", ""), spec.get("mcpu"), spec.get("num-cores")
    for name, value in (("mtriple", mtriple), ("mcpu", mcpu)):
        if value is not None and not isinstance(value, str):
            raise BadParamError(f"target {spec!r}: {name} must be a string, got {value!r}")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise BadParamError(f"target {spec!r}: num-cores must be a positive integer, got {cores!r}")
    if mtriple:
        return llvm_cpu(mtriple, mcpu or "generic", cores)
    if mcpu is None and cores is None:
        return host_cpu()
    mcpu = mcpu or host_cpu().cpu
    return other_cpu(f"{mcpu}:{cores}" if cores else mcpu)


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
    tvm = forked.import_tvm()

    dev = tvm.cuda(0)
    if not dev.exist:
        return None
    return "sm_" + dev.compute_version.replace(".", "")


def resolve(target) -> TargetModel:
    """Accept "llvm" (this host), "llvm:MCPU[:CORES]" (another x86-64 CPU), "llvm:aarch64[:CORES]"
    (a generic 64-bit Arm CPU), "cuda", "cuda:sm_90", a TVM target dict (from_tvm) or a
    TargetModel."""
    if isinstance(target, TargetModel):
        return target
    if isinstance(target, dict):
        return from_tvm(target)
    if not isinstance(target, str):
        raise BadParamError(f"target must be a string such as 'llvm' or 'cuda', got {target!r}")
    kind, _, arch = target.partition(":")
    if kind == "llvm":
        cpu, _, cores = arch.partition(":")
        if cpu == "aarch64":
            if cores and (not cores.isdigit() or int(cores) < 1):
                raise BadParamError(f"target {target}: the core count must be a positive integer, got {cores!r}")
            return llvm_cpu(AARCH64_TRIPLE, "generic", int(cores) if cores else None)
        return other_cpu(arch) if arch else host_cpu()
    if kind == "cuda":
        return cuda(arch or None)
    raise BadParamError(f"unknown target {target!r}; expected one of {', '.join(TARGET_KINDS)}")


def missing_features(model: TargetModel) -> list[str]:
    """The features of `model`'s CPU that this host lacks (by CPUID; LLVM's tuning flags,
    which no instruction needs, are not CPUID features and are left out); ["<arch>"] for
    another architecture, [] for the host's own CPU."""
    return list(_missing_features(model))


@functools.lru_cache(maxsize=None)  # asked on the checked path of every new call signature
def _missing_features(model: TargetModel) -> tuple:
    if model.mtriple and triple_arch(model.mtriple) != platform.machine():
        return (triple_arch(model.mtriple),)
    return tuple(_absent(model.features(), _host_features()))


def require_runnable(model: TargetModel) -> None:
    """Raise ArchMismatchError when kernels for `model` cannot run in this process: another
    architecture, or an x86-64 CPU with a feature this host lacks (a CPU whose features
    this host has all of runs here, e.g. haswell's AVX2 code on an AVX-512 host)."""
    if model.kind == "llvm":
        missing = missing_features(model)
        if missing:
            raise ArchMismatchError(f"target {model.key} needs {', '.join(missing)}, which this machine's CPU "
                                    f"({host_cpu().cpu}) lacks; build it with `build --target` and run it on "
                                    f"its board (`tune --rpc-tracker` measures it there)")
    if model.kind == "cuda":
        local = local_cuda_arch()
        if local is None:
            raise ArchMismatchError("target 'cuda' needs an NVIDIA GPU; none is visible to this process")


def require_measurable(model: TargetModel) -> None:
    """require_runnable, and for a CPU: this host's own, since timings of another CPU's
    kernels taken here say little about that CPU."""
    if model.kind == "llvm" and (model.cpu != host_cpu().cpu or model.mtriple):
        raise ArchMismatchError(f"target {model.key} is not this machine's CPU ({host_cpu().cpu}); "
                                f"measure it on its board (`tune --rpc-tracker` does)")
    require_runnable(model)
