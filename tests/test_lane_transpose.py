"""The register transpose of ops/lane_transpose.py for every square size it takes (4, 8 and
16 lanes, whatever this host's own), float32 and float16 rows, out of place and in place."""

import re

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_ops import targets
from tvm_ops.ops.lane_transpose import transpose_macro

SHAPE_MARGIN = (3, 2, 3)  # the square sits inside a larger buffer, away from its first row and lane


def square_transpose(V: int, dtype: str, src_at: tuple, dst_at: tuple, in_place: bool):
    """A kernel transposing the V x V square at src_at of its first buffer to dst_at of its
    second (of the first, in place)."""
    transpose = transpose_macro(V)
    shape = (SHAPE_MARGIN[0], V + SHAPE_MARGIN[1], V + SHAPE_MARGIN[2])

    @T.prim_func(s_tir=True)
    def kernel(a: T.handle, b: T.handle):
        src = T.match_buffer(a, shape, dtype)
        out = T.match_buffer(b, shape, dtype)
        x_lo = T.alloc_buffer((V // 2, V), "float32")
        x_hi = T.alloc_buffer((V // 2, V), "float32")
        y_lo = T.alloc_buffer((V // 2, V), "float32")
        y_hi = T.alloc_buffer((V // 2, V), "float32")
        if in_place:
            transpose(src, src_at, src, src_at, x_lo, x_hi, y_lo, y_hi)
        else:
            transpose(src, src_at, out, dst_at, x_lo, x_hi, y_lo, y_hi)

    return kernel, shape


@pytest.mark.parametrize("in_place", [False, True], ids=["copy", "in_place"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("V", [4, 8, 16])
def test_the_square_is_transposed_and_nothing_else_written(V, dtype, in_place):
    src_at, dst_at = (1, 1, 2), (2, 2, 1)
    kernel, shape = square_transpose(V, dtype, src_at, dst_at, in_place)
    lib = tvm.compile(kernel, target=targets.resolve("llvm").tvm_target())
    src = np.random.default_rng(V).standard_normal(shape).astype(dtype)
    out = np.full(shape, 7, dtype)
    src_t, out_t = tvm.runtime.tensor(src), tvm.runtime.tensor(out)
    lib(src_t, out_t)

    def square(at):
        return (at[0], slice(at[1], at[1] + V), slice(at[2], at[2] + V))

    expected_src, expected_out = src.copy(), out.copy()
    if in_place:
        expected_src[square(src_at)] = src[square(src_at)].T
    else:
        expected_out[square(dst_at)] = src[square(src_at)].T
    np.testing.assert_array_equal(src_t.numpy(), expected_src)
    np.testing.assert_array_equal(out_t.numpy(), expected_out)


def test_an_avx2_square_takes_one_shuffle_per_new_row_in_each_round():
    # 8 lanes: three rounds of 8 rows, each row one vunpck / vshufps / vperm2f128-class
    # instruction (the bit-swapping rounds took 32: a half-width-1 round of two vshufps a row)
    kernel, _ = square_transpose(8, "float32", (0, 0, 0), (1, 0, 0), in_place=False)
    lib = tvm.tirx.build(kernel, target=targets.resolve({"kind": "llvm", "mcpu": "haswell"}).tvm_target())
    shuffles = re.findall(r"^\s+(v(?:unpck\w+|shufps|perm2f128|insertf128|permps|permpd|blendps))\b",
                          lib.inspect_source("asm"), re.M)
    assert len(shuffles) == 24, shuffles
