"""tvm_ops.functional.three_nn / three_interpolate: a PointNet++ feature-propagation module
trained with them and with stock PyTorch formulations, finite differences, torch.library
registration, torch.compile."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tvm_ops.functional as tf  # noqa: E402

from .conftest import assert_compiles_alike, assert_exports_alike, assert_trains_alike, torch_devices  # noqa: E402

DEVICES = torch_devices()


# --- stock PyTorch three_nn / three_interpolate, from the math ----------------------------
def stock_three_nn(unknown, known):
    """Every squared distance, a stable sort (equal distances keep the lower index first, the
    scan rule), the first three; sqrt as mmcv's three_nn."""
    d2 = (unknown[:, :, None].float() - known[:, None].float()).square().sum(-1)
    dist2, idx = torch.sort(d2, dim=-1, stable=True)
    return dist2[..., :3].sqrt(), idx[..., :3].int()


def stock_three_interpolate(features, indices, weight):
    """Gather of the three features per point, weighted and summed (autograd through gather)."""
    batch, channels, m = features.shape
    index = indices.long().clamp(0, m - 1)
    weight = torch.where((indices >= 0) & (indices < m), weight, torch.zeros_like(weight))
    gathered = features.gather(2, index.reshape(batch, 1, -1).expand(batch, channels, -1))
    return (gathered.reshape(batch, channels, -1, 3) * weight[:, None]).sum(-1)


def grid_points(batch, count, generator, half=128):
    """Multiples of 1/64: float32 distances exact, so both three_nn pick the same points."""
    return torch.randint(-half, half + 1, (batch, count, 3), generator=generator).float() / 64


class FeaturePropagation(nn.Module):
    """PointNet++'s feature propagation in small: the coarse level's features (a 1x1 conv of
    its inputs) interpolated to the dense points by inverse-distance weights of their three
    nearest coarse points, concatenated with the dense level's skip features, a 1x1 conv."""

    def __init__(self, three_nn, three_interpolate, coarse_in=5, coarse=6, skip=4, out=7):
        super().__init__()
        self.three_nn, self.three_interpolate = three_nn, three_interpolate
        self.coarse = nn.Conv1d(coarse_in, coarse, 1)
        self.mlp = nn.Conv1d(coarse + skip, out, 1)

    def forward(self, dense_xyz, coarse_xyz, skip_features, coarse_inputs):
        dist, idx = self.three_nn(dense_xyz, coarse_xyz)
        recip = 1.0 / (dist + 1e-8)
        weight = recip / recip.sum(dim=2, keepdim=True)
        interpolated = self.three_interpolate(self.coarse(coarse_inputs), idx, weight)
        return self.mlp(torch.cat([interpolated, skip_features], dim=1))


def problem(seed=0, batch=2, dense=45, coarse=11):
    g = torch.Generator().manual_seed(seed)
    return (grid_points(batch, dense, g), grid_points(batch, coarse, g), torch.randn(batch, 4, dense, generator=g),
            torch.randn(batch, 5, coarse, generator=g), torch.randn(batch, 7, dense, generator=g))


@pytest.mark.parametrize("device", DEVICES)
def test_feature_propagation_trains_the_same_as_stock_pytorch(device):
    torch.manual_seed(1)
    ours = FeaturePropagation(tf.three_nn, tf.three_interpolate).to(device)
    theirs = FeaturePropagation(stock_three_nn, stock_three_interpolate).to(device)
    theirs.load_state_dict(ours.state_dict())
    dense_xyz, coarse_xyz, skip, coarse_in, target = (t.to(device) for t in problem())
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    assert_trains_alike(ours, theirs, (dense_xyz, coarse_xyz, skip, coarse_in), target, lr=0.2)
    for name, value in ours.state_dict().items():
        assert not torch.equal(value, start[name]), f"{name} did not move"


@pytest.mark.parametrize("device", DEVICES)
def test_three_nn_matches_stock_pytorch_and_is_not_differentiable(device):
    dense_xyz, coarse_xyz = (t.to(device) for t in problem(seed=2, dense=70, coarse=13)[:2])
    dense_xyz.requires_grad_(True)
    dist, idx = tf.three_nn(dense_xyz, coarse_xyz)
    expected_dist, expected_idx = stock_three_nn(dense_xyz.detach(), coarse_xyz)
    assert dist.dtype == torch.float32 and idx.dtype == torch.int32
    torch.testing.assert_close(dist, expected_dist, rtol=0, atol=0)
    assert torch.equal(idx, expected_idx)
    assert not dist.requires_grad and not idx.requires_grad
    # float16 coordinates: float32 distances of the same values
    dist16, idx16 = tf.three_nn(dense_xyz.detach().half(), coarse_xyz.half())
    assert dist16.dtype == torch.float32 and torch.equal(idx16, expected_idx)


@pytest.mark.parametrize("device", DEVICES)
def test_interpolate_forward_and_gradient_match_stock_pytorch(device):
    g = torch.Generator().manual_seed(3)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        features = torch.randn(2, 9, 14, generator=g).to(device, dtype).requires_grad_(True)
        indices = torch.randint(-3, 17, (2, 40, 3), generator=g, dtype=torch.int32).to(device)  # some out of range
        weight = torch.rand(2, 40, 3, generator=g).to(device, dtype)
        out = tf.three_interpolate(features, indices, weight)
        f32 = features.detach().float().requires_grad_(True)
        expected = stock_three_interpolate(f32, indices, weight.float())
        torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)
        grad = torch.randn(out.shape, generator=g).to(device, dtype)
        (ours,) = torch.autograd.grad(out, features, grad)
        (theirs,) = torch.autograd.grad(expected, f32, grad.float())
        torch.testing.assert_close(ours.float(), theirs, rtol=tol, atol=tol)
    # int64 indices (what torch code often holds) are taken when they fit int32
    out64 = tf.three_interpolate(features.detach().float(), indices.long(), weight.float())
    torch.testing.assert_close(out64, stock_three_interpolate(features.detach().float(), indices, weight.float()))


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")  # float32 ops: loose tolerances
def test_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(4)
    features = torch.randn(1, 3, 6, generator=g).requires_grad_(True)
    indices = torch.randint(-1, 7, (1, 5, 3), generator=g, dtype=torch.int32)
    weight = torch.rand(1, 5, 3, generator=g)
    assert torch.autograd.gradcheck(lambda f: tf.three_interpolate(f, indices, weight), (features,), eps=1e-3,
                                    atol=2e-3, rtol=2e-2)


def test_opcheck_passes_for_the_three_ops():
    dense_xyz, coarse_xyz, *_ = problem(seed=5, batch=1, dense=20, coarse=6)
    torch.library.opcheck(torch.ops.tvm_ops.three_nn.default, (dense_xyz, coarse_xyz))
    torch.library.opcheck(torch.ops.tvm_ops.three_nn.default, (dense_xyz.clone().requires_grad_(True), coarse_xyz))
    _, idx = tf.three_nn(dense_xyz, coarse_xyz)
    weight = torch.rand(1, 20, 3)
    features = torch.randn(1, 4, 6, requires_grad=True)
    torch.library.opcheck(torch.ops.tvm_ops.three_interpolate_forward.default, (features, idx, weight))
    torch.library.opcheck(torch.ops.tvm_ops.three_interpolate_backward.default, (torch.randn(1, 4, 20), idx, weight, 6))


@pytest.mark.parametrize("device", DEVICES)
def test_feature_propagation_compiles_without_graph_breaks_for_any_point_count(device):
    torch.manual_seed(6)
    module = FeaturePropagation(tf.three_nn, tf.three_interpolate).to(device)
    inputs, resized = (tuple(t.to(device) for t in problem(seed=seed, dense=dense, coarse=coarse)[:-1])
                       for seed, dense, coarse in ((7, 45, 11), (8, 61, 17)))
    assert_compiles_alike(module, inputs, resized)


def test_feature_propagation_exports_with_the_eager_numbers():
    torch.manual_seed(6)
    assert_exports_alike(FeaturePropagation(tf.three_nn, tf.three_interpolate), problem(seed=7)[:-1])


def test_no_grad_runs_the_forward_alone(monkeypatch):
    from tvm_ops.ops import three_interpolate_backward as backward

    def refuse(*args, **kwargs):
        raise AssertionError("the backward ran")

    monkeypatch.setattr(backward, "three_interpolate_backward", refuse)
    features = torch.randn(1, 3, 6, requires_grad=True)
    with torch.no_grad():
        out = tf.three_interpolate(features, torch.zeros(1, 4, 3, dtype=torch.int32), torch.rand(1, 4, 3))
    assert out.grad_fn is None and out.shape == (1, 3, 4)


def test_bad_input_reaches_the_caller_as_a_bad_param_error():
    import tvm_ops

    with pytest.raises(tvm_ops.BadParamError, match=r"M\) must be at least 3"):
        tf.three_nn(torch.zeros(1, 4, 3), torch.zeros(1, 2, 3))
    with pytest.raises(tvm_ops.BadParamError, match="three_interpolate: indices holds values outside int32"):
        tf.three_interpolate(torch.zeros(1, 2, 5), torch.full((1, 3, 3), 2**40), torch.zeros(1, 3, 3))
