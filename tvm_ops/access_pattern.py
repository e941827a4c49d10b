"""Access-pattern rooflines: the time of a case's random memory accesses alone.

Some kernels are bound neither by their bytes nor by their flops but by where the bytes
are: bilinear corners gathered at random rows, updates scattered to rows that other
updates also hit. Their roofline is a microbenchmark of that pattern: the same row
addresses in the same order, summed (a gather) or added to (a scatter), with no other
arithmetic. A case's testing module states its pattern (`access_pattern(inputs, params)`),
in its CPU kernel's order; the bench times it in the same run (`bench.pattern_roofline`)
and takes it as the case's roofline in place of the bytes one.

A pattern is a [R, W] table and G groups in CSR form: group g touches the rows
index[offsets[g]:offsets[g + 1]]. gather: out[g] = the sum of those rows (a [G, W] write);
scatter: the table zeroed, then each of those rows += src[g] (a [G, W] read). The groups
run over the cores; scattered updates to a shared row race between them (wrong sums, the
fastest the pattern can go: a lower bound on any correct kernel's time). The rows are
contiguous in the table, the layout most favourable to the accesses, whatever the
operator's own layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


VECTOR = 256  # elements per step of a group's walk: W itself up to this, else its widest divisor below it
# the walk prefetches the row this many entries on (rows at random: no hardware prefetcher
# follows them), or nothing (0: where the rows are cache-resident, a prefetch is only an
# instruction more); the roofline is the fastest of these
AHEADS = (0, 8, 16, 32)
# A gather's output of this size or more is also timed written past the caches (x86
# non-temporal stores of whole lines), as a kernel streaming such an output writes it
# (voxel_pooling_backward): the faster variant is the roofline.
STREAM_MIN_BYTES = 32 << 20
# groups per task of the streamed variant: its stores are ordered (SFENCE) once per task
# (1024, as voxel_pooling_backward's tasks: 64 ran its pattern 7.72 against 7.15 ms)
STREAMED_TASK_GROUPS = 1024


@dataclass
class AccessPattern:
    rows: int  # R: the table's rows
    width: int  # W: elements per row
    offsets: np.ndarray  # [G + 1] int32: group g's entries are index[offsets[g]:offsets[g + 1]]
    index: np.ndarray  # [E] int32 rows of the table, each in [0, R)
    gather: bool
    scatter: bool
    dtype: str = "float32"

    @property
    def name(self) -> str:
        return "+".join(kind for kind, on in (("gather", self.gather), ("scatter", self.scatter)) if on)

    def __post_init__(self):
        self.offsets = np.ascontiguousarray(self.offsets, np.int32)
        self.index = np.ascontiguousarray(self.index, np.int32)
        if self.index.size and not (0 <= self.index.min() and self.index.max() < self.rows):
            raise ValueError("access pattern: an index outside the table's rows")
        if self.offsets[0] != 0 or self.offsets[-1] != self.index.size or (np.diff(self.offsets) < 0).any():
            raise ValueError("access pattern: offsets must rise from 0 to the index's length")


def csr(groups: np.ndarray, index: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [count + 1], index) grouping the entries `index` by their group number
    `groups` (each in [0, count)), each group's entries in their given order."""
    groups = np.asarray(groups, np.int64).reshape(-1)
    order = np.argsort(groups, kind="stable")
    return offsets_of(np.bincount(groups, minlength=count)), np.asarray(index).reshape(-1)[order]


def fixed_groups(index: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, index) for [G, K] entries of which `used` are touched, in row-major order."""
    index, used = np.asarray(index).reshape(len(index), -1), np.asarray(used, bool).reshape(len(index), -1)
    return offsets_of(used.sum(1)), index[used]


def offsets_of(counts) -> np.ndarray:
    """CSR offsets [G + 1] from the entries per group (an array, or a list of arrays in turn)."""
    counts = np.concatenate([np.asarray(c, np.int64).reshape(-1) for c in counts]) if isinstance(counts, list) \
        else np.asarray(counts, np.int64).reshape(-1)
    offsets = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def timing_arguments(pattern: AccessPattern) -> list:
    """The kernel's tensors for timing: a random table and source rows."""
    rng = np.random.default_rng(0)
    table = rng.uniform(-1, 1, (pattern.rows, pattern.width))
    return _arguments(pattern, table, rng.uniform(-1, 1, (len(pattern.offsets) - 1, pattern.width)))


def run_pattern(model, pattern: AccessPattern, table: np.ndarray, src: np.ndarray, ahead: int = AHEADS[1],
                streamed: bool = False):
    """(updated table, out) of one run of the pattern's kernel: what its sums are (for the
    tests; with scattered rows shared between groups on several cores, `updated` races)."""
    args = _arguments(pattern, table, src)
    kernel(model, pattern, ahead, streamed)["pattern"](*args)
    return args[1].numpy(), args[3].numpy()


def _arguments(pattern: AccessPattern, table: np.ndarray, src: np.ndarray) -> list:
    """The kernel's tensors: table, updated (the scatter's target), src, out, offsets, index."""
    import tvm

    dev, dtype = tvm.cpu(), pattern.dtype
    groups = len(pattern.offsets) - 1
    return [tvm.runtime.tensor(np.asarray(table, dtype), dev),
            tvm.runtime.tensor(np.full((pattern.rows, pattern.width), np.nan, dtype), dev),
            tvm.runtime.tensor(np.asarray(src, dtype).reshape(groups, pattern.width), dev),
            tvm.runtime.empty((groups, pattern.width), dtype, dev),
            tvm.runtime.tensor(pattern.offsets, dev), tvm.runtime.tensor(pattern.index, dev)]


def _vector(width: int) -> int:
    """A step's elements: all W in one (sums in registers) unless W is wider than VECTOR."""
    return max(d for d in range(1, min(width, VECTOR) + 1) if width % d == 0)


def _lanes(model, vector: int) -> int:
    """Elements per vector register of a step: whole registers (an odd-sized vector, e.g.
    80 lanes, compiles to lane shuffles)."""
    lanes = 1
    while lanes < model.lanes("float32") and vector % (2 * lanes) == 0:
        lanes *= 2
    return lanes


def streamable(model, pattern: AccessPattern) -> bool:
    """Whether the pattern is also timed with its output streamed: a gather alone whose
    [G, W] float32 output is STREAM_MIN_BYTES or more, on an x86 host, each step's vector
    whole cache lines (so each row is; the output starts on one, as TVM tensors do)."""
    from .ops import cpu_ir

    groups = len(pattern.offsets) - 1
    return (pattern.gather and not pattern.scatter and pattern.dtype == "float32"
            and groups * pattern.width * 4 >= STREAM_MIN_BYTES and cpu_ir.has_streaming_stores(model.features())
            and _vector(pattern.width) % cpu_ir.line_words("float32") == 0)


_kernels: dict = {}


def kernel(model, pattern: AccessPattern, ahead: int, streamed: bool = False):
    """The pattern's kernel (built once per process per row width, `ahead`, kind, dtype and
    `streamed`): groups over the cores, each group's rows walked `vector` elements at a
    time (a vectorised lane loop), float32 sums, each entry prefetching the row `ahead`
    entries on (as an optimised gather does: a roofline must be the pattern's best), in the
    table (read) and in the scattered output (for writing) as the pattern has them;
    `streamed` (only where streamable): the gather's output rows stored past the caches,
    tasks of STREAMED_TASK_GROUPS groups each ending with a fence. The row width is a
    constant of the kernel, as it is of the operators' kernels built for their network
    channels (ops/fixed_channels.py): with it symbolic, voxel_pooling_backward's kernel ran
    faster than its pattern (7.09 against 7.15 ms; 6.81 with the width fixed, 2026-11-28)."""
    width, gather, scatter, dtype = pattern.width, pattern.gather, pattern.scatter, pattern.dtype
    vector = _vector(width)
    key = (model.key, width, ahead, gather, scatter, dtype, streamed)
    if key in _kernels:
        return _kernels[key]
    import tvm
    from tvm.script import tirx as T

    from .ops import cpu_ir
    from .ops.point_vectors import scratch_scope
    from .ops.prefetch import prefetch_words

    scratch = scratch_scope(model.kind)  # the per-group accumulator
    f32 = "float32"
    lanes = _lanes(model, vector)
    parts = vector // lanes  # whole vector registers per step
    K = STREAMED_TASK_GROUPS if streamed else 1  # groups per parallel task
    line_vector = cpu_ir.line_vector(lanes, "float32")  # a streamed store's registers: whole lines
    stream = f"tvm_ops_stream_x{line_vector}_float32"
    task_annotations = {"pragma_import_llvm": cpu_ir.stream_ir(model.features(), line_vector, "float32")} \
        if streamed else None

    @T.prim_func(s_tir=True)
    def pattern(table_h: T.handle, updated_h: T.handle, src_h: T.handle, out_h: T.handle, offsets_h: T.handle,
                index_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        R, W, G, G1, E = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        table = T.match_buffer(table_h, (R, W), dtype)
        updated = T.match_buffer(updated_h, (R, W), dtype)
        src = T.match_buffer(src_h, (G, W), dtype)
        out = T.match_buffer(out_h, (G, W), dtype)
        offsets = T.match_buffer(offsets_h, (G1,), "int32")
        index = T.match_buffer(index_h, (E,), "int32")
        if scatter:  # a scattered output is written whole: zeroed first, as the kernels do
            for r in T.parallel(R):
                for step in range(W // vector):
                    for part in T.unroll(parts):
                        for lane in T.vectorized(lanes):
                            updated[r, step * vector + part * lanes + lane] = T.Cast(dtype, 0)
        for t in T.parallel(T.ceildiv(G, K), annotations=task_annotations):
            for k in range(T.min(K, G - t * K)):  # (from 0: a loop from t * K ran every g as 0)
                g = T.Bind(t * K + k)
                for step in range(W // vector):
                    acc = T.alloc_buffer((vector,), f32, scope=scratch)
                    for part in T.unroll(parts):
                        for lane in T.vectorized(lanes):
                            acc[part * lanes + lane] = T.float32(0)
                    for e in range(offsets[g], offsets[g + 1]):
                        row = T.Bind(index[e])
                        if ahead > 0:  # the rows read, for reading; the rows added to, for writing
                            later = T.Bind(index[T.min(e + ahead, E - 1)])
                            if gather:
                                prefetch_words(lambda i: table[later, step * vector + i], vector, 0)
                            if scatter:
                                prefetch_words(lambda i: updated[later, step * vector + i], vector, 1)
                        for part in T.unroll(parts):
                            for lane in T.vectorized(lanes):
                                at = T.meta_var(step * vector + part * lanes + lane)
                                if gather:
                                    acc[part * lanes + lane] = acc[part * lanes + lane] + T.Cast(f32, table[row, at])
                                if scatter:
                                    updated[row, at] = updated[row, at] + src[g, at]
                    if gather and streamed:  # float32: the sums themselves, whole lines per store
                        for part in T.unroll(vector // line_vector):
                            T.evaluate(T.call_extern("void", stream, T.address_of(
                                out[g, step * vector + part * line_vector]),
                                acc[T.Ramp(part * line_vector, 1, line_vector)]))
                    elif gather:
                        for part in T.unroll(parts):
                            for lane in T.vectorized(lanes):
                                out[g, step * vector + part * lanes + lane] = T.Cast(dtype, acc[part * lanes + lane])
            if streamed:
                T.evaluate(T.call_extern("void", "tvm_ops_store_fence"))

    # the row width fixed: table first, so its (R, W) names the variables the others share
    fixed = pattern.specialize({pattern.params[0]: tvm.tirx.decl_buffer((tvm.tirx.Var("R", "int32"), width), dtype,
                                                                         "table")})
    lib = tvm.tirx.build(tvm.IRModule({"pattern": fixed.with_attr("global_symbol", "pattern")}),
                         target=model.tvm_target())
    _kernels[key] = lib
    return lib
