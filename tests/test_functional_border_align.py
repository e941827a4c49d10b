"""tvm_ops.functional.border_align: a BorderDet-style border branch trained with it and with a
stock-PyTorch border align, finite differences, torch.library registration, torch.compile."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tvm_ops.functional as tf  # noqa: E402

from .conftest import assert_compiles_alike, assert_exports_alike, assert_trains_alike, torch_devices  # noqa: E402


# --- stock PyTorch border align (bilinear gathers, max over the samples), from the math -------
def stock_border_align(input, boxes, pool_size):
    """input [N, 4C, H, W], boxes [N, H*W, 4] -> [N, C, H*W, 4]; autograd through the gathers
    and the max (whose gradient goes to the first maximal sample, as the argmax rule)."""
    N, Q, H, W = input.shape
    C = Q // 4
    feat = input.view(N, 4, C, H * W)
    values = []
    for i in range(pool_size + 1):
        x0, y0, x1, y1 = boxes.unbind(-1)  # [N, K]
        # top (x0,y0)->(x1,y0), left (x0,y0)->(x0,y1), bottom (x1,y1)->(x0,y1), right (x1,y1)->(x1,y0)
        starts = [(x0, y0), (x0, y0), (x1, y1), (x1, y1)]
        ends = [(x1, y0), (x0, y1), (x0, y1), (x1, y0)]
        per_border = []
        for s in range(4):
            (sx, sy), (ex, ey) = starts[s], ends[s]
            if i == pool_size:
                x, y = ex, ey
            else:
                # start + i * step, the float32 step and the sum rounded once (the contract)
                x = (sx.double() + i * ((ex - sx) / pool_size).double()).float() if s % 2 == 0 else sx
                y = (sy.double() + i * ((ey - sy) / pool_size).double()).float() if s % 2 == 1 else sy
            per_border.append(bilinear(feat[:, s], y, x, H, W))  # [N, C, K]
        values.append(torch.stack(per_border, -1))  # [N, C, K, 4]
    return torch.stack(values, -1).max(-1).values


def bilinear(feat, y, x, H, W):
    """feat [N, C, H*W] sampled at (y, x) [N, K] with the roi_align rule -> [N, C, K]."""
    inside = (y >= -1) & (y <= H) & (x >= -1) & (x <= W)
    y = torch.where(inside, y.clamp(min=0), torch.zeros_like(y))
    x = torch.where(inside, x.clamp(min=0), torch.zeros_like(x))
    y0, x0 = y.long(), x.long()
    top_y, top_x = y0 >= H - 1, x0 >= W - 1
    y_low, x_low = torch.where(top_y, H - 1, y0), torch.where(top_x, W - 1, x0)
    y_high, x_high = torch.where(top_y, H - 1, y0 + 1), torch.where(top_x, W - 1, x0 + 1)
    ly = torch.where(top_y, torch.zeros_like(y), y - y0)
    lx = torch.where(top_x, torch.zeros_like(x), x - x0)

    def at(yy, xx):
        index = (yy * W + xx).unsqueeze(1).expand(-1, feat.shape[1], -1)
        return feat.gather(2, index)

    value = ((1 - ly) * (1 - lx)).unsqueeze(1) * at(y_low, x_low) + ((1 - ly) * lx).unsqueeze(1) * at(y_low, x_high) \
        + (ly * (1 - lx)).unsqueeze(1) * at(y_high, x_low) + (ly * lx).unsqueeze(1) * at(y_high, x_high)
    return torch.where(inside.unsqueeze(1), value, torch.zeros_like(value))


def make_boxes(N, H, W, seed=0, spill=0.0):
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing="ij")
    centre = torch.stack([xs, ys], -1).view(1, H * W, 2).expand(N, -1, -1)
    half = torch.rand(N, H * W, 2, generator=g) * (1.5 + spill) + 0.3
    return torch.cat([centre - half, centre + half], -1)


class BorderBranch(nn.Module):
    """BorderDet's border branch in small: a conv to 4C border features, border align, and a
    1x1 conv over the pooled borders to a score per box."""

    def __init__(self, align, channels=8, pool_size=6):
        super().__init__()
        self.align, self.pool_size = align, pool_size
        self.features = nn.Conv2d(6, 4 * channels, 3, padding=1)
        self.head = nn.Conv2d(channels, 3, 1)

    def forward(self, image, boxes):
        pooled = self.align(self.features(image), boxes, self.pool_size)  # [N, C, K, 4]
        return self.head(pooled).mean(-1)  # [N, 3, K]


@pytest.mark.parametrize("device", torch_devices())
def test_border_branch_trains_the_same_as_stock_pytorch(device):
    torch.manual_seed(2)
    ours = BorderBranch(tf.border_align).to(device)
    theirs = BorderBranch(stock_border_align).to(device)
    theirs.load_state_dict(ours.state_dict())
    N, H, W = 2, 5, 7
    g = torch.Generator().manual_seed(3)
    image = torch.randn(N, 6, H, W, generator=g).to(device)
    boxes = make_boxes(N, H, W, seed=4, spill=2.0).to(device)  # some corners outside the map
    target = torch.randn(N, 3, H * W, generator=g).to(device)
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    assert_trains_alike(ours, theirs, (image, boxes), target, lr=0.3)
    assert not torch.equal(ours.features.weight, start["features.weight"])


@pytest.mark.parametrize("device", torch_devices())
def test_forward_and_gradient_match_stock_pytorch_in_float16_too(device):
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(1, 12, 4, 5, generator=g).to(device, dtype).requires_grad_(True)
        boxes = make_boxes(1, 4, 5, seed=6, spill=1.0).to(device, dtype)
        out = tf.border_align(x, boxes, 5)
        expected = stock_border_align(x.float(), boxes.float(), 5)
        torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
        grad = torch.randn(out.shape, generator=g).to(device, dtype)
        (ours,) = torch.autograd.grad(out, x, grad)
        x32 = x.detach().float().requires_grad_(True)
        (theirs,) = torch.autograd.grad(stock_border_align(x32, boxes.float(), 5), x32, grad.float())
        torch.testing.assert_close(ours.float(), theirs, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")  # float32 ops: loose tolerances
def test_gradient_matches_finite_differences():
    x = torch.randn(1, 8, 3, 4, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    boxes = make_boxes(1, 3, 4, seed=8)
    assert torch.autograd.gradcheck(lambda t: tf.border_align(t, boxes, 4), (x,), eps=1e-3, atol=2e-3, rtol=2e-2)


def test_opcheck_passes_for_both_ops():
    x = torch.randn(1, 3, 4, 8, requires_grad=True)  # NHWC, as the custom op takes it
    boxes = make_boxes(1, 3, 4, seed=9)
    torch.library.opcheck(torch.ops.tvm_ops.border_align_forward.default, (x, boxes, 4))
    _, argmax = torch.ops.tvm_ops.border_align_forward(x.detach(), boxes, 4)
    grad = torch.randn(1, 12, 4, 2)
    torch.library.opcheck(torch.ops.tvm_ops.border_align_backward.default, (grad, boxes, argmax, 4, 3, 4))
    # the gradient of an NCHW map, in its layout
    torch.library.opcheck(torch.ops.tvm_ops.border_align_backward.default, (grad, boxes, argmax, 4, 3, 4, True))


def test_the_gradient_comes_back_in_the_maps_own_layout():
    """A map's gradient as the backward gives it (before autograd would copy it into the
    map's layout): NCHW memory for an NCHW map, NHWC for a channels-last one; the same values."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(2, 8, 5, 6, generator=g)
    boxes = make_boxes(2, 5, 6, seed=13)
    weights = torch.randn(2, 2, 30, 4, generator=g)
    grads = []
    for layout in (torch.contiguous_format, torch.channels_last):
        leaf = torch.empty_like(x, memory_format=layout).copy_(x).requires_grad_()
        leaf.register_hook(grads.append)
        (tf.border_align(leaf, boxes, 3) * weights).sum().backward()
    nchw, nhwc = grads
    assert nchw.is_contiguous() and nhwc.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(nchw, nhwc)


def branch_inputs(N, H, W, seed):
    return torch.randn(N, 6, H, W, generator=torch.Generator().manual_seed(seed)), make_boxes(N, H, W, seed=seed)


def test_compiles_without_graph_breaks_for_any_image_size():
    torch.manual_seed(10)
    assert_compiles_alike(BorderBranch(tf.border_align), branch_inputs(3, 7, 9, seed=11),
                          branch_inputs(5, 6, 11, seed=12))


def test_exports_with_the_eager_numbers():
    torch.manual_seed(10)
    assert_exports_alike(BorderBranch(tf.border_align), branch_inputs(2, 5, 7, seed=13))


def test_the_module_is_a_thin_layer_over_the_function():
    layer = tf.BorderAlign(5)
    assert "pool_size=5" in repr(layer)
    x, boxes = torch.randn(2, 16, 3, 4), make_boxes(2, 3, 4, seed=10)
    torch.testing.assert_close(layer(x, boxes), tf.border_align(x, boxes, 5), rtol=0, atol=0)


@pytest.mark.parametrize("pool_size", [2.7, 3.0, "3", True, 0])
def test_a_pool_size_that_is_no_positive_integer_is_refused_not_truncated(pool_size):
    from tvm_ops import BadParamError

    x, boxes = torch.randn(1, 8, 3, 4), make_boxes(1, 3, 4)
    with pytest.raises(BadParamError, match="border_align: pool_size must be"):
        tf.border_align(x, boxes, pool_size)
    with pytest.raises(BadParamError, match="border_align: pool_size must be"):
        tf.BorderAlign(pool_size)


def test_no_grad_runs_the_forward_alone(monkeypatch):
    from tvm_ops.ops import border_align_backward as backward

    def refuse(*args, **kwargs):
        raise AssertionError("the backward ran")

    monkeypatch.setattr(backward, "border_align_backward", refuse)
    x = torch.randn(1, 8, 3, 4, requires_grad=True)
    with torch.no_grad():
        out = tf.border_align(x, make_boxes(1, 3, 4), 4)
    assert out.grad_fn is None and out.shape == (1, 2, 12, 4)
