"""What border_align's forward and backward share: where sample i of a box border lies.

One expression for both directions (and testing/border_align_backward.py's `border_sample`
for the float64 reference and the PyTorch peers), so the backward of the forward's argmax
is the exact gradient of its output on every box."""

from __future__ import annotations

from tvm.script import tirx as T


def sample_xy(BX, vn, vk, vs, i, pool_size):
    """(x, y) of sample i (int32, 0..pool_size) on border vs of box (vn, vk), as float32
    expressions: along the moving axis start + i * ((end - start) / pool_size), the end corner
    itself at i == pool_size (the product can round past it); the other axis the start
    corner's."""
    fp = T.Cast("float32", pool_size)
    x0, y0, x1, y1 = (T.Cast("float32", BX[vn, vk, j]) for j in range(4))
    start_x, start_y = T.Select(vs < 2, x0, x1), T.Select(vs < 2, y0, y1)
    end_x, end_y = T.Select(vs == 0, x1, x0), T.Select(vs == 1, y1, y0)  # on the moving axis
    fi = T.Cast("float32", i)
    x = T.Select(vs % 2 == 0, T.Select(i == pool_size, end_x, start_x + fi * ((end_x - start_x) / fp)), start_x)
    y = T.Select(vs % 2 == 1, T.Select(i == pool_size, end_y, start_y + fi * ((end_y - start_y) / fp)), start_y)
    return x, y
