"""The target-specific LLVM IR of the hand-written CPU kernels, all of it.

Those kernels link small LLVM IR functions in through the loop annotation
`pragma_import_llvm` where TVM has no builtin. Generic IR (atomicrmw, llvm.fma, vector
reductions) compiles for every CPU and stays with its kernel; what needs an x86 instruction
is here. Each helper takes the target's LLVM features (`TargetModel.features()`) and gives
the x86 IR where the CPU has the feature, a portable form otherwise. Guarding matters: an
intrinsic of another architecture does not fail the build, LLVM aborts the process
("Cannot select: intrinsic").
"""

from __future__ import annotations

import numpy as np

from ..host_buffers import LINE_BYTES


def has_lane_lookup(features) -> bool:
    """Whether a per-lane lookup in a 16-entry float32 table is one instruction (AVX-512's
    vpermps). Without it there is no lookup: callers take a path that needs none."""
    return "avx512f" in features


def lookup16_ir(features, widths) -> str:
    """LLVM IR of tvm_ops_lookup16_x<lanes>(table <16 x float>, index <lanes x i32>) for
    each lanes in `widths` (multiples of 16): each lane's table[index & 15], one vpermps per
    16 lanes (TVM has no permute builtin; the same lookup written as element extracts became
    16 scalar loads from the stack). Only where has_lane_lookup(features)."""
    if not has_lane_lookup(features):
        raise ValueError("the 16-entry lane lookup needs AVX-512 (avx512f); this target has no such instruction")
    return ("declare <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float>, <16 x i32>)\n"
            + "".join(_lookup16_ir(lanes) for lanes in widths))


def _lookup16_ir(lanes: int) -> str:
    vi, vf = f"<{lanes} x i32>", f"<{lanes} x float>"
    body = []
    parts = []
    for q in range(0, lanes, 16):
        mask = ", ".join(f"i32 {q + j}" for j in range(16))
        body += [f"  %i{q} = shufflevector {vi} %i, {vi} poison, <16 x i32> <{mask}>",
                 f"  %p{q} = call <16 x float> @llvm.x86.avx512.permvar.sf.512(<16 x float> %t, <16 x i32> %i{q})"]
        parts.append((f"%p{q}", 16))
    while len(parts) > 1:  # concatenate neighbours: 16 + 16 -> 32 -> ...
        merged = []
        for a in range(0, len(parts), 2):
            (x, wx), (y, wy) = parts[a], parts[a + 1]
            name = f"%c{len(body)}"
            mask = ", ".join(f"i32 {j}" for j in range(wx + wy))
            body.append(f"  {name} = shufflevector <{wx} x float> {x}, <{wy} x float> {y}, <{wx + wy} x i32> <{mask}>")
            merged.append((name, wx + wy))
        parts = merged
    return (f"define {vf} @tvm_ops_lookup16_x{lanes}(<16 x float> %t, {vi} %i) alwaysinline {{\nentry:\n"
            + "\n".join(body) + f"\n  ret {vf} {parts[0][0]}\n}}\n")


def has_streaming_stores(features) -> bool:
    """Whether stores past the caches are x86's (MOVNT*, ordered by SFENCE)."""
    return "sse2" in features


def line_words(dtype: str) -> int:
    """Elements of dtype in a cache line."""
    return LINE_BYTES // np.dtype(dtype).itemsize


def whole_lines(lanes: int, dtype: str) -> bool:
    """Whether a `lanes`-wide vector of dtype is whole cache lines: what a streamed store of
    it needs (it must cover its line)."""
    return lanes % line_words(dtype) == 0


def line_vector(lanes: int, dtype: str) -> int:
    """The narrowest vector of whole `lanes`-wide registers that is whole cache lines: what a
    streamed store writes (an AVX2 register is half a float32 line: two of them, adjacent,
    fill it, as LLVM splits the wider store)."""
    words = line_words(dtype)
    return lanes if lanes % words == 0 else -(-words // lanes) * lanes


def stream_ir_if(features, lanes: int, dtype: str, stream: bool) -> str:
    """stream_ir(features, lanes, dtype) for a kernel that streams (asked for, and its vectors
    are whole lines: whole_lines), else ""."""
    return stream_ir(features, lanes, dtype) if stream and whole_lines(lanes, dtype) else ""


def on_a_line(element):
    """TIR: whether the buffer element `element` starts on a cache line (tvm_ops_line_aligned,
    defined by stream_ir)."""
    from tvm.script import tirx as T

    return T.call_extern("int32", "tvm_ops_line_aligned", T.address_of(element)) != 0


def stream_ir(features, lanes: int, dtype: str) -> str:
    """LLVM IR of tvm_ops_stream_x<lanes>_<dtype>(ptr, vector): a store of whole cache lines
    (the pointer must be line-aligned); tvm_ops_line_aligned(ptr): 1 if the pointer is;
    tvm_ops_store_fence(): called once the owner's streamed stores are done.

    x86: non-temporal stores, past the caches (no read for ownership, and the output does
    not evict the inputs), then SFENCE, as they are weakly ordered. Elsewhere plain stores,
    which need no fence (a non-temporal hint maps to other instructions with other ordering
    rules there, e.g. aarch64's STNP, unmeasured for these kernels)."""
    v = f"<{lanes} x {'float' if dtype == 'float32' else 'half'}>"
    streamed = has_streaming_stores(features)
    hint = ", !nontemporal !0" if streamed else ""
    fence = ("declare void @llvm.x86.sse.sfence()\n"
             "define void @tvm_ops_store_fence() alwaysinline {\nentry:\n"
             "  call void @llvm.x86.sse.sfence()\n  ret void\n}\n"
             "!0 = !{i32 1}\n") if streamed else (
             "define void @tvm_ops_store_fence() alwaysinline {\nentry:\n  ret void\n}\n")
    return (f"define void @tvm_ops_stream_x{lanes}_{dtype}(ptr %p, {v} %v) alwaysinline {{\nentry:\n"
            f"  store {v} %v, ptr %p, align {LINE_BYTES}{hint}\n  ret void\n}}\n"
            "define i32 @tvm_ops_line_aligned(ptr %p) alwaysinline {\nentry:\n"
            f"  %a = ptrtoint ptr %p to i64\n  %m = and i64 %a, {LINE_BYTES - 1}\n  %c = icmp eq i64 %m, 0\n"
            "  %z = zext i1 %c to i32\n  ret i32 %z\n}\n"
            + fence)
