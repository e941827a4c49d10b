"""The MLU-style work policy, as pure arithmetic on a TargetModel.

mlu-ops plans every kernel the same way: split the work evenly over taskDim
cores with the remainder on the first cores, and size on-chip tiles from the
NRAM budget (`deal_num`), aligned to the vector width. Nothing here imports TVM.
"""

from __future__ import annotations


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


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))
