"""The point loop of the CPU kernels that vectorise over points (three_nn,
three_interpolate_forward): N in vectors of V lanes without a predicate.

A split of a symbolic N keeps a predicate, and a predicated vector loop becomes scalar code.
So the loop runs over ceil(N / V) vectors and the last one is moved back to end at N: vector
`o` covers points min(o*V, N - V) + lane. The last vector recomputes up to V - 1 points an
earlier one wrote, with the same per-lane arithmetic, so it stores the same bits. It needs
N >= V; a call with N < V runs the operator's `_small` kernel (V = 1: every point once).
`plan_vector` rounds a plan's vector knob to the target's lanes (border_align_forward's
channel vectors too).
"""

from __future__ import annotations


def plan_vector(model, knobs: dict) -> dict:
    """The plan of `knobs` with its `vector` (points or channels per vector step) a whole
    number of the CPU target's float32 vectors, at least one; a CUDA plan is the knobs."""
    plan = dict(knobs)
    if model.kind == "llvm":
        lanes = model.lanes("float32")
        plan["vector"] = max(lanes, int(plan["vector"]) // lanes * lanes)
    return plan


def vectors(N, lanes: int):
    """Extent of the vector loop for N points in vectors of `lanes`."""
    from tvm.script import tirx as T  # here: the call path imports this module without TVM

    return T.ceildiv(N, lanes) if lanes > 1 else N


def point(N, lanes: int, vector, lane):
    """The point of (vector, lane): vector * lanes + lane, the last vector ending at N. Lane
    invariant base + lane, so TVM's vectoriser sees a contiguous ramp."""
    from tvm.script import tirx as T

    if lanes == 1:
        return vector
    return T.min(vector * lanes, N - lanes) + lane


def scratch_scope(kind: str) -> str:
    """The storage scope of a kernel's small per-block buffers (accumulators, a vector's
    state) on a target kind: registers ("local") on CUDA; on the CPU the default scope, a
    constant-size stack alloca that LLVM keeps in registers. TVM 0.27 lowers a "local"
    buffer on the CPU to a TVMBackendAllocWorkspace / Free pair in every iteration of the
    loop around its block (dynamic_scatter_forward's reduce: one per voxel and vector)."""
    return "local" if kind == "cuda" else "global"
