"""What border_align's forward and backward share: where sample i of a box border lies.

One expression for both directions (and testing/border_align_backward.py's `border_sample`
for the float64 reference and the PyTorch peers), so the backward of the forward's argmax
is the exact gradient of its output on every box."""

from __future__ import annotations

from tvm.script import tirx as T


def sample_xy(BX, vn, vk, vs, i, pool_size):
    """(x, y) of sample i (int32, 0..pool_size) on border vs of box (vn, vk), as float32
    expressions: along the moving axis start + i * ((end - start) / pool_size) rounded once,
    the end corner itself at i == pool_size (the product can round past it); the other axis
    the start corner's."""
    fp = T.Cast("float32", pool_size)
    x0, y0, x1, y1 = (T.Cast("float32", BX[vn, vk, j]) for j in range(4))
    start_x, start_y = T.Select(vs < 2, x0, x1), T.Select(vs < 2, y0, y1)
    end_x, end_y = T.Select(vs == 0, x1, x0), T.Select(vs == 1, y1, y0)  # on the moving axis
    fi = T.Cast("float64", i)

    def along(start, end):
        # start + i * step with step = (end - start) / pool_size in float32, then rounded once:
        # the product is exact in float64 (pool_size < 2^29), so a compiler that contracts the
        # multiply-add into an FMA (LLVM, nvcc) gives the same bits as one that does not, and
        # as numpy and torch (testing/border_align_backward.py's border_sample)
        step = T.Cast("float64", (end - start) / fp)
        return T.Cast("float32", T.Cast("float64", start) + fi * step)

    x = T.Select(vs % 2 == 0, T.Select(i == pool_size, end_x, along(start_x, end_x)), start_x)
    y = T.Select(vs % 2 == 1, T.Select(i == pool_size, end_y, along(start_y, end_y)), start_y)
    return x, y
