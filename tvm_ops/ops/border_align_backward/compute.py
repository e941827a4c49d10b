"""Kernels of border_align_backward: a hand-written CPU loop nest and the CUDA atomics.

The CPU kernel (`_owner_func`) is a hand-written loop nest: TensorIR written in its
scheduled form, not a compute plus a schedule. Its owners take tasks from a shared counter,
stage per-box values in local arrays between vectorised lane loops, look weights up per lane
and stream their tile rows out, none of which a TensorIR schedule primitive expresses. The
operator's module docstring describes the plans; schedule.py binds the CUDA kernels and adds
nothing to the CPU one.

Its x86-only LLVM IR (the vpermps lookup, the streamed stores and their SFENCE) comes from
ops/cpu_ir.py, chosen by the target's features. The portable fallback, for an x86 CPU
without AVX-512 or another architecture such as aarch64: corner_adds=per_sample instead of
per_position (the plan switches; same bits, slower), and plain stores with no fence for
the tile rows.
"""

from __future__ import annotations

from tvm.script import tirx as T

from .. import cpu_ir, task_queue
from ..border_align_sampling import sample_xy
from ..point_vectors import scratch_scope
from ..prefetch import prefetch_words
from . import CAST, CHANNEL_GROUP, SCATTER, TAIL

# corner_adds=per_sample computes the sample positions of a box 16 at a time
SAMPLE_BLOCK_BITS = 4
SAMPLE_BLOCK = 1 << SAMPLE_BLOCK_BITS
# map positions ahead that an owner's final tile store prefetches its grad_input columns
TILE_STORE_AHEAD = 8
# corner_adds=per_position: a map position's weight per sample is one 16-entry vector, looked
# up per lane with a variable permute; the last entry stands for "no sample" (weight 0), so
# it serves pool_size < 15 (larger pool sizes take per_sample)
POSITION_TABLE = 16


def _all_finite_ir(lanes: int) -> str:
    """LLVM IR of tvm_ops_all_finite_x<lanes>(<lanes x float>): 1 if no lane is inf or NaN."""
    v = f"<{lanes} x float>"
    inf = f"<{', '.join(['float 0x7FF0000000000000'] * lanes)}>"
    return (f"declare {v} @llvm.fabs.v{lanes}f32({v})\n"
            f"declare i1 @llvm.vector.reduce.and.v{lanes}i1(<{lanes} x i1>)\n"
            f"define i32 @tvm_ops_all_finite_x{lanes}({v} %g) alwaysinline {{\nentry:\n"
            f"  %a = call {v} @llvm.fabs.v{lanes}f32({v} %g)\n"
            f"  %f = fcmp olt {v} %a, {inf}\n"
            f"  %r = call i1 @llvm.vector.reduce.and.v{lanes}i1(<{lanes} x i1> %f)\n"
            f"  %z = zext i1 %r to i32\n  ret i32 %z\n}}\n")


def _lookup(table, index, lanes):
    """Per lane, table[index[lane]] (table: a float32x16 expression, index: lanes int32)."""
    return T.call_pure_extern(f"float32x{lanes}", f"tvm_ops_lookup16_x{lanes}", table, index[T.Ramp(0, 1, lanes)])


def _reduce_ir(ops_lanes) -> str:
    """LLVM IR of tvm_ops_s<op>_x<lanes>(<lanes x i32>) for each (op, lanes), op min or max:
    the smallest or largest lane (each intrinsic declared once)."""
    return "".join(
        f"declare i32 @llvm.vector.reduce.s{op}.v{lanes}i32(<{lanes} x i32>)\n"
        f"define i32 @tvm_ops_s{op}_x{lanes}(<{lanes} x i32> %v) alwaysinline {{\nentry:\n"
        f"  %r = call i32 @llvm.vector.reduce.s{op}.v{lanes}i32(<{lanes} x i32> %v)\n  ret i32 %r\n}}\n"
        for op, lanes in sorted(set(ops_lanes)))


# a cell index beyond any map (per_position's empty range starts here and ends at -1)
NO_CELL = 1 << 20
# a block of samples past any argmax's (INT32_MAX // SAMPLE_BLOCK < 1 << 27)
NO_BLOCK = 1 << 27


def _reduce(op, rows, row):
    """min or max of rows[row, 0:16] (int32)."""
    return T.call_pure_extern("int32", f"tvm_ops_s{op}_x{POSITION_TABLE}", rows[row, T.Ramp(0, 1, POSITION_TABLE)])


def _all_finite(values, lanes):
    return T.call_pure_extern("int32", f"tvm_ops_all_finite_x{lanes}", values[T.Ramp(0, 1, lanes)]) != 0


@T.macro(hygienic=False)
def _spread(vn, vk, vs, c0, lanes, lane_loop, atomic):
    """Channels c0 .. c0 + lanes - 1 of (n, k, border s): the sample their argmax names, its
    4 bilinear corners, added into ACC (tile [H, W, lanes] on the CPU, grad_input-shaped
    [N, H, W, 4C] float32 with atomicAdd on CUDA).

    Two lane loops with the per-lane values staged in local arrays: keeping each expression
    small keeps TVM's simplifier fast (one expression tree per store took minutes), and the
    store indices read staged values, not argmax_idx. The argmax, the sample's (x, y) and its
    validity are staged too, each computed once: as inline expressions the three stores
    repeated the sample's expression (and on CUDA every index's division of the fused
    thread index) a dozen times, and TVM's passes took ~75 s on the CUDA kernel, <1 s
    staged. Invalid lanes get corner (0, 0) and a zero gradient (Select, not a branch, so
    the CPU loop stays one vector body)."""
    scratch = T.meta_var(scratch_scope("cuda" if atomic else "llvm"))
    SY = T.alloc_buffer((lanes,), "float32", scope=scratch)  # clamped sample y (0 if invalid)
    SX = T.alloc_buffer((lanes,), "float32", scope=scratch)
    SG = T.alloc_buffer((lanes,), "float32", scope=scratch)  # gradient, 0 if invalid
    SA = T.alloc_buffer((lanes,), "int32", scope=scratch)  # argmax
    SV = T.alloc_buffer((lanes,), "int32", scope=scratch)  # 1: a sample on or next to the map
    for l in lane_loop(lanes):
        SA[l] = AM[vn, vk, vs, c0 + l]
        hit = T.meta_var(SA[l] >= 0 and SA[l] <= pool_size)
        # an argmax outside [0, pool_size] (even INT32_MIN/MAX) becomes sample 0, masked below
        x, y = T.meta_var(sample_xy(BX, vn, vk, vs, T.Select(hit, SA[l], 0), pool_size))
        SY[l] = y
        SX[l] = x
        SV[l] = T.Select(hit and SY[l] >= T.float32(-1) and SY[l] <= T.Cast("float32", H)
                         and SX[l] >= T.float32(-1) and SX[l] <= T.Cast("float32", W), 1, 0)
        SG[l] = T.Select(SV[l] == 1, T.Cast("float32", GO[vn, vk, vs, c0 + l]), T.float32(0))
        SY[l] = T.Select(SV[l] == 1, T.max(SY[l], T.float32(0)), T.float32(0))
        SX[l] = T.Select(SV[l] == 1, T.max(SX[l], T.float32(0)), T.float32(0))
    for l in lane_loop(lanes):
        yi = T.meta_var(T.Cast("int32", SY[l]))
        xi = T.meta_var(T.Cast("int32", SX[l]))
        y_lo = T.meta_var(T.min(yi, H - 1))
        x_lo = T.meta_var(T.min(xi, W - 1))
        y_hi = T.meta_var(T.min(yi + 1, H - 1))
        x_hi = T.meta_var(T.min(xi + 1, W - 1))
        ly = T.meta_var(T.Select(yi >= H - 1, T.float32(0), SY[l] - T.Cast("float32", yi)))
        lx = T.meta_var(T.Select(xi >= W - 1, T.float32(0), SX[l] - T.Cast("float32", xi)))
        hy = T.meta_var(T.float32(1) - ly)
        hx = T.meta_var(T.float32(1) - lx)
        if atomic:
            if SG[l] != T.float32(0):  # a thread with nothing to add issues no atomics
                col = T.meta_var(vs * C + c0 + l)
                T.evaluate(T.cuda.atomic_add(T.address_of(ACC[vn, y_lo, x_lo, col]), SG[l] * (hy * hx)))
                T.evaluate(T.cuda.atomic_add(T.address_of(ACC[vn, y_lo, x_hi, col]), SG[l] * (hy * lx)))
                T.evaluate(T.cuda.atomic_add(T.address_of(ACC[vn, y_hi, x_lo, col]), SG[l] * (ly * hx)))
                T.evaluate(T.cuda.atomic_add(T.address_of(ACC[vn, y_hi, x_hi, col]), SG[l] * (ly * lx)))
        else:
            # in order: at the map edge two corners are the same pixel
            ACC[y_lo, x_lo, l] = ACC[y_lo, x_lo, l] + SG[l] * (hy * hx)
            ACC[y_lo, x_hi, l] = ACC[y_lo, x_hi, l] + SG[l] * (hy * lx)
            ACC[y_hi, x_lo, l] = ACC[y_hi, x_lo, l] + SG[l] * (ly * hx)
            ACC[y_hi, x_hi, l] = ACC[y_hi, x_hi, l] + SG[l] * (ly * lx)


@T.macro(hygienic=False)
def _sample_adds(b, lanes, lane_loop):
    """per_sample's adds for samples b*16 .. b*16 + 15: per valid sample j the lanes whose
    argmax is j add their gradient at its 4 corners, each a contiguous tile row (vector
    load/FMA/store); the other lanes add +0."""
    for j in range(SAMPLE_BLOCK):
        if OK[j] != 0:
            hy = T.meta_var(T.float32(1) - LY[j])
            hx = T.meta_var(T.float32(1) - LX[j])
            for l in lane_loop(lanes):
                g = T.meta_var(T.Select(AS[l] == b * SAMPLE_BLOCK + j, GS[l], T.float32(0)))
                # in order: at the map edge two corners are the same pixel
                ACC[YL[j], XL[j], l] = ACC[YL[j], XL[j], l] + g * (hy * hx)
                ACC[YL[j], XH[j], l] = ACC[YL[j], XH[j], l] + g * (hy * LX[j])
                ACC[YH[j], XL[j], l] = ACC[YH[j], XL[j], l] + g * (LY[j] * hx)
                ACC[YH[j], XH[j], l] = ACC[YH[j], XH[j], l] + g * (LY[j] * LX[j])


@T.macro(hygienic=False)
def _cell_adds(along_x, lanes):
    """_position_adds for one orientation (along_x: a Python bool, so each gets its own loop)."""
    # the moving axis' lo, hi and fraction, and the fixed axis' fraction, per sample
    m_lo, m_hi = T.meta_var((XL, XH) if along_x else (YL, YH))
    m_fr, f_fr = T.meta_var((LX, LY) if along_x else (LY, LX))
    f_lo_of = T.meta_var(YL if along_x else XL)
    for j in T.vectorized(POSITION_TABLE):
        SPAN[0, j] = T.Select(OK[j] != 0, m_lo[j], NO_CELL)
        SPAN[1, j] = T.Select(OK[j] != 0, m_hi[j], -1)
        SPAN[2, j] = T.Select(OK[j] != 0, f_lo_of[j], -1)
    first: T.let = _reduce("min", SPAN, 0)
    last: T.let = _reduce("max", SPAN, 1)
    f_lo: T.let = _reduce("max", SPAN, 2)
    f_hi: T.let = T.min(f_lo + 1, (H if along_x else W) - 1)
    lanes_ = T.meta_var(T.Ramp(0, 1, lanes))
    samples = T.meta_var(T.Ramp(0, 1, POSITION_TABLE))
    one, zero = T.meta_var((T.Broadcast(T.float32(1), POSITION_TABLE), T.Broadcast(T.float32(0), POSITION_TABLE)))
    for cell in range(first, last + 1):
        # the tables as vector expressions (staged in local arrays they cost a stack store
        # per cell): per sample, 1 - m_fr at its lo cell, m_fr at its hi one (both at the
        # map edge, where m_fr is 0: the sum is exact), times the fixed axis' weight
        at = T.meta_var(T.Broadcast(cell, POSITION_TABLE))
        w_cell = T.meta_var(T.Select(SPAN[0, samples] == at, one - m_fr[samples], zero)
                            + T.Select(SPAN[1, samples] == at, m_fr[samples], zero))
        y0, x0 = T.meta_var((f_lo, cell) if along_x else (cell, f_lo))
        ACC[y0, x0, lanes_] = ACC[y0, x0, lanes_] + GS[lanes_] * _lookup((one - f_fr[samples]) * w_cell, AS, lanes)
        if f_hi != f_lo:  # at the map edge the hi row is the lo row, with weight 0
            y1, x1 = T.meta_var((f_hi, cell) if along_x else (cell, f_hi))
            ACC[y1, x1, lanes_] = ACC[y1, x1, lanes_] + GS[lanes_] * _lookup(f_fr[samples] * w_cell, AS, lanes)


@T.macro(hygienic=False)
def _position_adds(vs, lanes):
    """per_position's adds: the border moves along one axis (x for top and bottom), so its
    samples' corners are the cells of a range on that axis crossed with the two rows of the
    other (the same for every sample). Each of those map positions gets one add per row, each
    lane's weight looked up in the position's table (the weight of every sample there)."""
    # per valid sample: its lo cell, hi cell and fixed lo row (invalid: out of every range)
    SPAN = T.alloc_buffer((3, POSITION_TABLE), "int32")
    if vs % 2 == 0:
        _cell_adds(True, lanes)
    else:
        _cell_adds(False, lanes)


@T.macro(hygienic=False)
def _spread_by_sample(vn, vk, vs, c0, lanes, lane_loop, by_position):
    """CPU, same result as _spread into the tile: all lanes of (n, k, s) share the box, so
    their samples are among the pool_size + 1 of the border. Their geometry is computed 16
    samples at a time as vectors (_sample_block), only for the blocks that hold some lane's
    sample (_next_block), so the work follows the argmax values, not pool_size. Then the
    adds, each one contiguous tile row (vector load/FMA/store, no scatter): per sample
    (_sample_adds) or per map position (_position_adds, by_position; pool_size < 15, finite
    gradients). Lanes add +0 where their sample has no corner, and skipped blocks would have
    added only +0 (the tile starts at +0 and the weights are >= 0, so +0 changes no bit).
    Per lane the products are _spread's (g * (hy * hx): one vector FMA per corner, the
    weight product is per sample), so the bits match corner_adds=per_lane."""
    SY = T.alloc_buffer((SAMPLE_BLOCK,), "float32")  # clamped sample y (0 if invalid)
    SX = T.alloc_buffer((SAMPLE_BLOCK,), "float32")
    OK = T.alloc_buffer((SAMPLE_BLOCK,), "int32")    # 1: sample inside [-1, H] x [-1, W]
    YL = T.alloc_buffer((SAMPLE_BLOCK,), "int32")    # corners
    XL = T.alloc_buffer((SAMPLE_BLOCK,), "int32")
    YH = T.alloc_buffer((SAMPLE_BLOCK,), "int32")
    XH = T.alloc_buffer((SAMPLE_BLOCK,), "int32")
    LY = T.alloc_buffer((SAMPLE_BLOCK,), "float32")  # fractions
    LX = T.alloc_buffer((SAMPLE_BLOCK,), "float32")
    # the lanes' argmax and gradient, loaded once per box into registers (small constant-size
    # buffers are stack allocas that LLVM promotes; read inside the sample loop, after the
    # tile's stores, they were reloaded for every sample)
    AS = T.alloc_buffer((lanes,), "int32")
    GS = T.alloc_buffer((lanes,), "float32")
    for l in lane_loop(lanes):
        am = T.meta_var(AM[vn, vk, vs, c0 + l])
        if by_position:  # the table's last entry is no sample's: weight 0 at every position
            AS[l] = T.Select(am >= 0 and am <= pool_size, am, POSITION_TABLE - 1)
        else:  # -1: no sample (never a block's)
            AS[l] = T.Select(am >= 0 and am <= pool_size, am, -1)
        GS[l] = T.Cast("float32", GO[vn, vk, vs, c0 + l])
    if by_position:
        _sample_block(vn, vk, vs, 0, lanes, lane_loop, True)
    else:
        NB = T.alloc_buffer((lanes,), "int32")
        BLK = T.alloc_buffer((1,), "int32")  # the block to add, NO_BLOCK when none is left
        _next_block(-1, lanes)
        while BLK[0] < NO_BLOCK:
            b: T.let = BLK[0]
            _sample_block(vn, vk, vs, b, lanes, lane_loop, False)
            # b * 16 + 15 <= INT32_MAX: the last block ends at pool_size's block's end
            _next_block(b * SAMPLE_BLOCK + (SAMPLE_BLOCK - 1), lanes)


@T.macro(hygienic=False)
def _next_block(after, lanes):
    """BLK[0] = the lowest block of samples that holds a lane's sample > after (a vector
    min over the lanes), or NO_BLOCK."""
    for l in T.vectorized(lanes):
        NB[l] = T.Select(AS[l] > after, T.shift_right(AS[l], SAMPLE_BLOCK_BITS), NO_BLOCK)
    BLK[0] = T.call_pure_extern("int32", f"tvm_ops_smin_x{lanes}", NB[T.Ramp(0, 1, lanes)])


@T.macro(hygienic=False)
def _sample_block(vn, vk, vs, b, lanes, lane_loop, by_position):
    """Samples b*16 .. b*16 + 15 of the border: their geometry, then their adds."""
    # two loops, the second reading what the first staged (a local array written and read
    # in the same vectorised iteration is compacted to 1 element: wrong results)
    for j in T.vectorized(SAMPLE_BLOCK):
        x, y = T.meta_var(sample_xy(BX, vn, vk, vs, b * SAMPLE_BLOCK + j, pool_size))
        ok = T.meta_var(b * SAMPLE_BLOCK + j <= pool_size and y >= T.float32(-1)
                        and y <= T.Cast("float32", H) and x >= T.float32(-1) and x <= T.Cast("float32", W))
        OK[j] = T.Select(ok, 1, 0)
        SY[j] = T.Select(ok, T.max(y, T.float32(0)), T.float32(0))
        SX[j] = T.Select(ok, T.max(x, T.float32(0)), T.float32(0))
    for j in T.vectorized(SAMPLE_BLOCK):
        yi = T.meta_var(T.Cast("int32", SY[j]))
        xi = T.meta_var(T.Cast("int32", SX[j]))
        YL[j] = T.min(yi, H - 1)
        XL[j] = T.min(xi, W - 1)
        YH[j] = T.min(yi + 1, H - 1)
        XH[j] = T.min(xi + 1, W - 1)
        LY[j] = T.Select(yi >= H - 1, T.float32(0), SY[j] - T.Cast("float32", yi))
        LX[j] = T.Select(xi >= W - 1, T.float32(0), SX[j] - T.Cast("float32", xi))
    if by_position:
        # a lane's +0 is g * 0 here, NaN for an infinite or NaN gradient: such boxes take
        # the per-sample adds, which mask the gradient itself
        if _all_finite(GS, lanes):
            _position_adds(vs, lanes)
        else:
            _sample_adds(b, lanes, lane_loop)
    else:
        _sample_adds(b, lanes, lane_loop)


@T.macro(hygienic=False)
def _owner_walk(vn, vs, c0, lanes, lane_loop, by_sample, by_position, ahead, stream, owned_from=None):
    """One owner: zero its tile ACC, add boxes k = 0..K-1 in order, store the tile into its
    columns of grad_input (float16: the single rounding). ahead > 0: while on box k, prefetch
    the argmax and gradient rows of box k + ahead (an owner's rows are 4C words apart, one page
    per k at C = 256, which the hardware prefetchers do not follow), and while storing map
    position pos, its grad_input columns at pos + TILE_STORE_AHEAD (4C words apart too).
    stream: the owner's columns are whole cache lines wherever grad_input starts on one.
    owned_from: None, or the first lane whose column the owner stores (the lanes before it
    are another owner's channels, added here only to keep the walk a full vector)."""
    for yy, xx in T.grid(H, W):
        for ll in lane_loop(lanes):
            ACC[yy, xx, ll] = T.float32(0)
    for k in range(K):
        if ahead > 0 and k + ahead < K:
            prefetch_words(lambda w: AM[vn, k + ahead, vs, c0 + w], lanes, 0)
            prefetch_words(lambda w: GO[vn, k + ahead, vs, c0 + w], lanes, 0)
        if by_position:
            if pool_size < POSITION_TABLE - 1:
                _spread_by_sample(vn, k, vs, c0, lanes, lane_loop, True)
            else:
                _spread_by_sample(vn, k, vs, c0, lanes, lane_loop, False)
        elif by_sample:
            _spread_by_sample(vn, k, vs, c0, lanes, lane_loop, False)
        else:
            _spread(vn, k, vs, c0, lanes, lane_loop, False)
    if stream:
        # whole lines: stream them past the caches (no read for ownership, and grad_input
        # does not evict the inputs), when the owner's columns are whole lines: grad_input
        # starts on a line, and so does every border's block of C (the owner's V words are
        # whole lines, or stream is off)
        if cpu_ir.on_a_line(GI[0, 0, 0, 0]) and C % cpu_ir.line_words(dtype) == 0:
            for pos in range(H * W):
                T.evaluate(T.call_extern("void", f"tvm_ops_stream_x{lanes}_{dtype}",
                                         T.address_of(GI[vn, pos // W, pos % W, vs * C + c0]),
                                         T.Cast(f"{dtype}x{lanes}", ACC[pos // W, pos % W, T.Ramp(0, 1, lanes)])))
            T.evaluate(T.call_extern("void", "tvm_ops_store_fence"))
        else:
            _tile_store(vn, vs, c0, lanes, lane_loop, ahead, None)
    else:
        _tile_store(vn, vs, c0, lanes, lane_loop, ahead, owned_from)


@T.macro(hygienic=False)
def _tile_store(vn, vs, c0, lanes, lane_loop, ahead, owned_from):
    """The owner's tile into its grad_input columns (lanes owned_from.. only, unless None),
    through the caches."""
    for pos in range(H * W):
        if ahead > 0 and pos + TILE_STORE_AHEAD < H * W:
            nxt = T.meta_var(pos + TILE_STORE_AHEAD)
            prefetch_words(lambda w: GI[vn, nxt // W, nxt % W, vs * C + c0 + w], lanes, 1)
        if owned_from is None:
            for ll in lane_loop(lanes):
                GI[vn, pos // W, pos % W, vs * C + c0 + ll] = T.Cast(dtype, ACC[pos // W, pos % W, ll])
        else:
            for ll in range(owned_from, lanes):
                GI[vn, pos // W, pos % W, vs * C + c0 + ll] = T.Cast(dtype, ACC[pos // W, pos % W, ll])


def _only_if(enabled: bool, condition):
    """condition, or the Python False when not enabled: TVMScript then drops the branch
    unparsed (a branch for a kernel variant that has no such owners)."""
    return condition if enabled else False


def _owner_func(dtype: str, tail: bool, lanes_per_owner: int, corner_adds: str, prefetch: int, parallel: str,
                features: frozenset):
    """CPU: owner (n, s, channel group) accumulates into a private float32 tile, then stores
    it into grad_input[n, :, :, s*C + channels] in dtype.  Main kernel: groups of
    lanes_per_owner (V) vector lanes, channels [0, C // V * V).  Tail kernel: the C % V last
    channels as 32-lane vector owners (V > 32), then 16-lane ones, then the C % 16 rest:
    when C >= 16, a 16-lane owner of C's last 16 channels that stores only the lanes no other
    owner has; when C < 16, one owner in scalar loops (per-lane corner adds there: same bits,
    and a scalar lane gains nothing from per-sample).
    The cores take tasks from a shared counter (task_queue): a task is one owner
    (parallel "group") or one (n, s) border walking its groups in turn ("border")."""
    V = lanes_per_owner
    G = CHANNEL_GROUP
    by_sample = corner_adds == "per_sample"
    by_position = corner_adds == "per_position"
    # the tail's channels go to 32-lane owners while 32 are left (a box's geometry then
    # serves 32 lanes, not 16), when V leaves tails that long
    wide = 2 * G if tail and V > 2 * G else 0
    tile_lanes = (wide or G) if tail else V  # the tail's 16-lane owners use half of each row
    llvm_ir = []  # the kernel's own LLVM IR functions
    # the main kernel's owners store V-word rows: whole lines when V words are
    stream = not tail and cpu_ir.whole_lines(V, dtype)
    if stream:
        llvm_ir.append(cpu_ir.stream_ir(features, V, dtype))
    widths = sorted({V, G} | ({wide} if wide else set()))  # the vector owners' lanes
    reductions = [("min", lanes) for lanes in widths] if by_sample or by_position else []  # _next_block
    if by_position:
        reductions += [("min", POSITION_TABLE), ("max", POSITION_TABLE)]  # _cell_adds
        llvm_ir += [cpu_ir.lookup16_ir(features, widths)] + [_all_finite_ir(lanes) for lanes in widths]
    llvm_ir.append(_reduce_ir(reductions))
    whole_border = parallel == "border"

    @T.prim_func(s_tir=True)
    def owner(go_h: T.handle, bx_h: T.handle, am_h: T.handle, gi_h: T.handle, pool_size: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, K, C, H, W = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        GO = T.match_buffer(go_h, (N, K, 4, C), dtype)
        BX = T.match_buffer(bx_h, (N, K, 4), dtype)
        AM = T.match_buffer(am_h, (N, K, 4, C), "int32")
        GI = T.match_buffer(gi_h, (N, H, W, 4 * C), dtype)
        # tail owners: `wide`-lane groups, then 16-lane groups, then the C % 16 rest
        n_wide = T.meta_var(C % V // wide if wide > 0 else 0)
        groups = T.meta_var(n_wide + (C % V - n_wide * wide + G - 1) // G if tail else C // V)
        task_groups = T.meta_var(groups if whole_border else 1)  # owners per task
        next_task = T.alloc_buffer((1,), "int32")
        next_task[0] = 0
        for _worker in T.parallel(task_queue.WORKERS, annotations=task_queue.worker_annotations(*llvm_ir)):
            with T.sblock("worker"):
                T.reads()
                T.writes()
                task = T.sblock_alloc_buffer((1,), "int32")
                task[0] = task_queue.next_task(next_task)
                while task[0] < (N * 4 if whole_border else N * 4 * groups):
                    for owner_in_task in range(task_groups):
                        with T.sblock("owner"):
                            # opaque: it only scopes the tile
                            T.reads()
                            T.writes()
                            # owner (n, s, g), n fastest: owners taken one after the
                            # other store into columns far apart (in a grad_input that does
                            # not start on a cache line, neighbouring columns share lines)
                            vn: T.let = task[0] % N
                            vs: T.let = task[0] // N % 4
                            vg: T.let = owner_in_task if whole_border else task[0] // (4 * N)
                            c0 = T.meta_var(C // V * V + n_wide * wide + (vg - n_wide) * G if tail else vg * V)
                            # the private tile (486 KB at 25x38 for V = 128)
                            ACC = T.sblock_alloc_buffer((H, W, tile_lanes), "float32")
                            if tail:
                                if _only_if(wide > 0, vg < n_wide):
                                    _owner_walk(vn, vs, C // V * V + vg * wide, wide, T.vectorized, by_sample,
                                                by_position, prefetch, False)
                                elif vg < n_wide + (C % V - n_wide * wide) // G:
                                    _owner_walk(vn, vs, c0, G, T.vectorized, by_sample, by_position, prefetch, False)
                                elif C >= G:
                                    # the last C % 16 channels: a full 16-lane owner over
                                    # C's last 16 channels that stores only its last C % 16
                                    # lanes (instead of a scalar owner: C = 40, tail kernel
                                    # 0.66 -> 0.48 ms; with a 32-lane owner before it, 0.36)
                                    _owner_walk(vn, vs, C - G, G, T.vectorized, by_sample, by_position, prefetch,
                                                False, G - C % G)
                                else:
                                    _owner_walk(vn, vs, c0, C % G, T.serial, False, False, 0, False)
                            else:
                                _owner_walk(vn, vs, c0, V, T.vectorized, by_sample, by_position, prefetch, stream)
                    task[0] = task_queue.next_task(next_task)

    return owner


def _atomic_func(dtype: str, tail: bool):
    """CUDA: one (n, k, s, c) per thread, atomicAdd into ACC [N, H, W, 4C] float32."""
    V = CHANNEL_GROUP

    @T.prim_func(s_tir=True)
    def atomic(go_h: T.handle, bx_h: T.handle, am_h: T.handle, acc_h: T.handle, pool_size: T.int32):
        T.func_attr({"tirx.noalias": True})
        N, K, C, H, W = T.int32(), T.int32(), T.int32(), T.int32(), T.int32()
        GO = T.match_buffer(go_h, (N, K, 4, C), dtype)
        BX = T.match_buffer(bx_h, (N, K, 4), dtype)
        AM = T.match_buffer(am_h, (N, K, 4, C), "int32")
        ACC = T.match_buffer(acc_h, (N, H, W, 4 * C), "float32")
        for n, k, s, c in T.grid(N, K, 4, C % V if tail else C // V * V):
            with T.sblock("scatter"):
                vn, vk, vs, vc = T.axis.remap("SSSS", [n, k, s, c])
                c0 = T.meta_var(C // V * V + vc if tail else vc)
                T.reads(GO[vn, vk, vs, c0], AM[vn, vk, vs, c0], BX[vn, vk, 0:4])
                T.writes(ACC[vn, 0:H, 0:W, vs * C + c0])
                _spread(vn, vk, vs, c0, 1, T.serial, True)

    return atomic


def _cast_func(dtype: str):
    """float32 accumulator [N, H, W, Q] -> grad_input in dtype (the single rounding)."""

    @T.prim_func(s_tir=True)
    def cast(acc_h: T.handle, gi_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        N, H, W, Q = T.int32(), T.int32(), T.int32(), T.int32()
        ACC = T.match_buffer(acc_h, (N, H, W, Q), "float32")
        GI = T.match_buffer(gi_h, (N, H, W, Q), dtype)
        for n, h, w, q in T.grid(N, H, W, Q):
            with T.sblock("cast"):
                vn, vh, vw, vq = T.axis.remap("SSSS", [n, h, w, q])
                GI[vn, vh, vw, vq] = T.Cast(dtype, ACC[vn, vh, vw, vq])

    return cast


def computes(dtype: str, kind: str, plan: dict, features: frozenset = frozenset()) -> dict:
    """The kernels; `features`: the CPU's LLVM features, which pick the IR of cpu_ir."""
    if kind == "cuda":  # float16 accumulates in float32, which `cast` rounds once
        return {SCATTER: _atomic_func(dtype, False), TAIL: _atomic_func(dtype, True), CAST: _cast_func(dtype)}
    # the CPU owners round while storing: no `cast`
    knobs = (plan["owner_lanes"], plan["corner_adds"], plan["prefetch"], plan["parallel"], features)
    return {SCATTER: _owner_func(dtype, False, *knobs), TAIL: _owner_func(dtype, True, *knobs)}
