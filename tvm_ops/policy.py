"""The MLU-style work policy, as pure arithmetic on a TargetModel.

mlu-ops plans every kernel the same way: split the work evenly over taskDim
cores with the remainder on the first cores, and size on-chip tiles from the
NRAM budget (`deal_num`), aligned to the vector width. Every operator's plan()
is written with `Policy` below, so it reads step by step against the policy
function of the op's seed design. Nothing here imports TVM.
"""

from __future__ import annotations

from dataclasses import dataclass

WARP = 32  # CUDA threads in lock step: the vector a CUDA block computes with
MAX_BLOCK_THREADS = 1024  # CUDA threads per block, every arch
# The on-chip memory a schedule file may size tiles from (its `onchip` key): the
# per-core L2 on a CPU, the shared memory of a CUDA block, or none (nothing staged).
ONCHIP = ("l2", "shared", "none")
# (io bytes, ops) of the theory formulas per parallel loop of a call below which a CPU call
# runs one-core kernels (one_core.py): a parallel loop costs a few microseconds while TVM's
# workers spin between kernels and tens while they sleep (torch callers), more than a
# second core saves below these. Measured on 2 cores, one-core against parallel kernels
# interleaved: docs/performance.md, "small calls on one core".
ONE_CORE_BELOW = {"spinning": (64 * 1024, 0.5e6), "asleep": (1024 * 1024, 2.5e6)}


def floor_align(value: int, align: int) -> int:
    """Largest multiple of `align` not above `value` (0 when value < align)."""
    if align <= 0:
        raise ValueError("align must be positive")
    return (value // align) * align


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def even_split(total: int, cores: int) -> list[tuple[int, int]]:
    """(start, count) for each core: total // cores each, the first total % cores get one more.

    Cores left without work get count 0, as an MLU task with taskId >= total does.
    """
    if cores <= 0:
        raise ValueError("cores must be positive")
    per_core, remainder = divmod(total, cores)
    plan, start = [], 0
    for task_id in range(cores):
        count = per_core + (1 if task_id < remainder else 0)
        plan.append((start, count))
        start += count
    return plan


def deal_num(budget_bytes: int, buffers: int, itemsize: int, align: int) -> int:
    """Elements per buffer when `buffers` equal buffers share `budget_bytes` (mlu-ops deal_num)."""
    if buffers <= 0 or itemsize <= 0:
        raise ValueError("buffers and itemsize must be positive")
    return floor_align(budget_bytes // (buffers * itemsize), align)


def tasks_per_item(items: int, cores: int) -> int:
    """Tasks to cut each of `items` into so that every core gets one: ceil(cores / items),
    1 when items >= cores (the even split then needs no cut)."""
    return max(1, ceil_div(cores, max(items, 1)))


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def cache_resident(io_bytes: float, cache_bytes: int | None) -> bool:
    """Whether a call's tensors (its theory io bytes) fit in a cache of `cache_bytes` (None:
    not known, so no). A repeated call, or one right after the op that wrote its inputs, then
    finds them there: software prefetches of its rows cost more than they hide."""
    return cache_bytes is not None and io_bytes <= cache_bytes


@dataclass(frozen=True)
class Policy:
    """What an mlu-ops policy function reads: taskDim, the NRAM budget, the NFU width."""

    cores: int  # taskDim: CPU threads, or SMs
    budget: int  # bytes of the named on-chip memory per core (CPU) or per block (CUDA); 0: none
    lanes: int  # float32 lanes of one vector: a SIMD register, or a warp on CUDA
    scope: str  # TIR storage scope of an on-chip tile ("global" on a CPU: the cache holds it)

    def deal_num(self, fraction: float, reserved: int, buffers: int, itemsize: int, align: int) -> int:
        """deal_num over `fraction` of the budget less `reserved` bytes (0 when nothing is left)."""
        return deal_num(max(int(self.budget * fraction) - reserved, 0), buffers, itemsize, align)

    def vector(self, registers: int = 1) -> int:
        """Channels per step: `registers` whole vectors (NFU_ALIGN_NUM on an MLU)."""
        return self.lanes * registers

    def one_core(self, io_bytes: float, ops: float | None, workers_asleep: bool, loops: int = 1) -> bool:
        """Whether a call of this much work (theory io bytes and ops) in `loops` parallel loops
        runs on one core: always on a one-core target, else below ONE_CORE_BELOW per loop
        (each loop hands out work and waits for the workers) for the state of the workers."""
        io_limit, ops_limit = ONE_CORE_BELOW["asleep" if workers_asleep else "spinning"]
        return self.cores == 1 or (io_bytes < io_limit * loops and (ops or 0) < ops_limit * loops)

    def warps(self, threads: int) -> int:
        """Warps of a `threads`-thread block: a whole number of warps, at most MAX_BLOCK_THREADS."""
        if threads % WARP or not 0 < threads <= MAX_BLOCK_THREADS:
            raise ValueError(f"threads must be a multiple of {WARP} up to {MAX_BLOCK_THREADS}, got {threads}")
        return threads // WARP


def for_target(model, onchip: str = "none") -> Policy:
    """The policy inputs of `model` (a targets.TargetModel); `onchip` names the memory whose
    size is the budget (a schedule file's `onchip` key): "l2" on a CPU, "shared" on CUDA."""
    if onchip not in ONCHIP:
        raise ValueError(f"onchip must be one of {', '.join(ONCHIP)}, got {onchip!r}")
    home = "l2" if model.kind == "llvm" else "shared"
    if onchip not in (home, "none"):
        raise ValueError(f"onchip {onchip!r} does not exist on a {model.kind} target (it has {home!r})")
    # TargetModel.onchip_bytes is that memory: the per-core L2, or the shared memory of a block
    budget = model.onchip_bytes if onchip == home else 0
    return Policy(model.cores, budget, model.lanes("float32"),
                  "shared" if onchip == "shared" else "global")
