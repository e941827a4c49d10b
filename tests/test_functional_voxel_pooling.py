"""tvm_ops.functional.voxel_pooling: a BEVDepth-style lift-splat-pool step trained with it and
with a stock PyTorch pooling, finite differences, torch.library registration, torch.compile,
no_grad, the accepted index dtypes and voxel_num forms."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import tvm_ops  # noqa: E402
import tvm_ops.functional as tf  # noqa: E402

from .conftest import assert_compiles_alike, assert_exports_alike, assert_trains_alike, torch_devices  # noqa: E402

VOXELS = (12, 10, 4)  # X, Y, Z


# --- the stock PyTorch pooling, written from the math ----------------------------------------
def stock_pooling(geom_xyz, input_features, voxel_num):
    """Sum the features of the points in each voxel with index_add: [B, ..., 3] int and
    [B, ..., C] -> [B, C, Y, X]; a point outside the grid is dropped."""
    X, Y, Z = (int(v) for v in voxel_num)
    B, C = input_features.shape[0], input_features.shape[-1]
    x, y, z = geom_xyz.reshape(B, -1, 3).long().unbind(-1)
    feat = input_features.reshape(B, -1, C)
    kept = (x >= 0) & (x < X) & (y >= 0) & (y < Y) & (z >= 0) & (z < Z)
    b = torch.arange(B, device=x.device).view(B, 1).expand_as(x)
    voxel = ((b * Y + y) * X + x)[kept]
    out = feat.new_zeros(B * Y * X, C).index_add(0, voxel, feat[kept])
    return out.view(B, Y, X, C).permute(0, 3, 1, 2)


def random_points(shape=(2, 3, 7, 5), channels=11, seed=0):
    """geom [*shape, 3] int32 spilling a voxel past each edge of x and y, z = Z for a fifth
    of the points (about 40% dropped), features [*shape, C] float32."""
    g = torch.Generator().manual_seed(seed)
    X, Y, Z = VOXELS
    geom = torch.stack([torch.randint(-1, X + 1, shape, generator=g), torch.randint(-1, Y + 1, shape, generator=g),
                        torch.randint(0, Z + 1, shape, generator=g)], -1).int()
    return geom, torch.randn(*shape, channels, generator=g)


@pytest.mark.parametrize("device", torch_devices())
def test_forward_and_gradient_match_the_stock_pooling(device):
    geom, feat = (t.to(device) for t in random_points())
    ours_in, stock_in = feat.clone().requires_grad_(True), feat.clone().requires_grad_(True)
    ours, stock = tf.voxel_pooling(geom, ours_in, VOXELS), stock_pooling(geom, stock_in, VOXELS)
    assert ours.shape == (2, 11, VOXELS[1], VOXELS[0]) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, stock, rtol=1e-5, atol=1e-6)
    grad = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1)).to(device)
    ours.backward(grad)
    stock.backward(grad)
    assert ours_in.grad.shape == feat.shape
    assert torch.equal(ours_in.grad, stock_in.grad)  # both gather the voxel's gradient: the same bits
    dropped = (ours_in.grad == 0).all(-1)
    assert 0.2 < dropped.float().mean() < 0.8  # points inside the grid and outside it


def test_returns_a_permuted_view_of_a_bev_buffer_as_bevdepth():
    geom, feat = random_points()
    out = tf.voxel_pooling(geom, feat, VOXELS)
    assert not out.is_contiguous() and out.permute(0, 2, 3, 1).is_contiguous()


@pytest.mark.filterwarnings("ignore:Input #0 requires gradient and is not a double")  # float32 only
def test_gradients_match_finite_differences():
    # the function is linear in the features: float32 finite differences are exact up to rounding
    geom, feat = random_points((2, 4, 3), channels=3, seed=2)
    feat.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: tf.voxel_pooling(geom, f, VOXELS), (feat,), eps=1e-2, atol=1e-3,
                                    rtol=1e-3, fast_mode=False)


def test_opcheck_passes_for_both_ops():
    geom, feat = random_points((2, 40), channels=5, seed=3)
    for needs_grad in (False, True):
        torch.library.opcheck(torch.ops.tvm_ops.voxel_pooling_forward.default,
                              (geom, feat.clone().requires_grad_(needs_grad), *VOXELS))
    _, memo = tvm_ops.voxel_pooling_forward(geom, feat, *VOXELS)
    grad = torch.randn(2, VOXELS[1], VOXELS[0], 5)
    torch.library.opcheck(torch.ops.tvm_ops.voxel_pooling_backward.default, (grad, memo))


# --- a BEVDepth-style lift, splat and pool step ------------------------------------------------
D, H, W, C_IN, C = 6, 4, 5, 8, 16  # depth bins, image rows and columns, image / BEV channels


class LiftSplat(nn.Module):
    """BEVDepth's pipeline in miniature: per pixel a depth distribution (softmax over D bins)
    and context features, their outer product [B, D, h, w, C] as the frustum's features,
    pooled into the BEV grid by `pool`, then a small BEV convolution head."""

    def __init__(self, pool):
        super().__init__()
        self.pool = pool
        self.depth_net = nn.Conv2d(C_IN, D + C, 3, padding=1)
        self.bev_head = nn.Sequential(nn.Conv2d(C, C, 3, padding=1), nn.ReLU(), nn.Conv2d(C, 1, 1))

    def forward(self, images, geom_xyz, voxel_num):
        x = self.depth_net(images)
        depth = x[:, :D].softmax(1)  # [B, D, h, w]
        context = x[:, D:]  # [B, C, h, w]
        frustum = depth.unsqueeze(-1) * context.permute(0, 2, 3, 1).unsqueeze(1)  # [B, D, h, w, C]
        return self.bev_head(self.pool(geom_xyz, frustum.contiguous(), voxel_num))


def frustum_geometry(batch, seed=4):
    """Voxel coordinates [B, D, h, w, 3] int32 of a fixed random camera frustum: pixel rays
    scaled by each bin's depth, a random yaw and offset per sample, quantised to 0.5 m
    voxels of the VOXELS grid; some points fall outside it, many share a voxel."""
    g = torch.Generator().manual_seed(seed)
    depth = torch.linspace(1.0, 5.5, D).view(D, 1, 1)
    u = (torch.arange(W) - (W - 1) / 2).view(1, 1, W) / 2.5
    v = (torch.arange(H) - (H - 1) / 2).view(1, H, 1) / 4.0
    cam = torch.stack(torch.broadcast_tensors(u * depth, depth, -v * depth), -1)  # [D, h, w, 3] (x, y, z)
    yaw = torch.rand(batch, generator=g) * 0.6 - 0.3
    rot = torch.zeros(batch, 3, 3)
    rot[:, 0, 0], rot[:, 0, 1], rot[:, 1, 0], rot[:, 1, 1], rot[:, 2, 2] = yaw.cos(), -yaw.sin(), yaw.sin(), yaw.cos(), 1
    shift = torch.tensor([3.0, 0.2, 0.8]) + torch.rand(batch, 3, generator=g) * 0.4
    ego = torch.einsum("bij,dhwj->bdhwi", rot, cam) + shift.view(batch, 1, 1, 1, 3)
    return (ego / 0.5).floor().int()


def twin_models(seed=5):
    torch.manual_seed(seed)
    ours = LiftSplat(tf.voxel_pooling)
    stock = LiftSplat(stock_pooling)
    stock.load_state_dict(ours.state_dict())
    return ours, stock


@pytest.mark.parametrize("device", torch_devices())
def test_lift_splat_pool_trains_like_the_stock_pooling(device):
    ours, stock = (model.to(device) for model in twin_models())
    batch = 2
    g = torch.Generator().manual_seed(6)
    images = torch.randn(batch, C_IN, H, W, generator=g).to(device)
    geom = frustum_geometry(batch)
    kept = ((geom >= 0) & (geom < torch.tensor(VOXELS, dtype=torch.int32))).all(-1)
    assert 0.3 < kept.float().mean() < 1  # most of the frustum inside the grid, not all
    target = torch.randn(batch, 1, VOXELS[1], VOXELS[0], generator=g).to(device)
    assert_trains_alike(ours, stock, (images, geom.to(device), VOXELS), target)
    # the training moved every parameter (the comparison is not of untouched weights), the
    # depth network's too: its gradient came through the pooling's backward
    for p, p0 in zip(ours.parameters(), twin_models()[0].parameters()):
        assert not torch.equal(p.cpu(), p0)


def test_compiles_without_graph_breaks_and_gives_the_eager_numbers():
    images = torch.randn(2, C_IN, H, W, generator=torch.Generator().manual_seed(7))
    assert_compiles_alike(twin_models()[0], (images, frustum_geometry(2), VOXELS))


def test_exports_with_the_eager_numbers():
    images = torch.randn(2, C_IN, H, W, generator=torch.Generator().manual_seed(7))
    assert_exports_alike(twin_models()[0], (images, frustum_geometry(2), VOXELS))


class GridAsBuffer(nn.Module):
    """BEVDepth keeps voxel_num as a module buffer and passes the tensor."""

    def __init__(self):
        super().__init__()
        self.register_buffer("voxel_num", torch.tensor(VOXELS))

    def forward(self, geom, features):
        return tf.voxel_pooling(geom, features, self.voxel_num)


def test_a_voxel_num_tensor_is_refused_by_tracing_with_a_clear_error_and_runs_eagerly_otherwise():
    geom = frustum_geometry(1)
    features = torch.randn(*geom.shape[:-1], 3, generator=torch.Generator().manual_seed(8))
    model = GridAsBuffer()
    eager = model(geom, features)
    with pytest.raises(tvm_ops.BadParamError, match="Python ints"):
        torch.export.export(model, (geom, features))
    with pytest.raises(Exception, match="Python ints"):  # dynamo reports the error it traced
        torch.compile(model, fullgraph=True, backend="aot_eager")(geom, features)
    # without fullgraph the call leaves the graph and reads the tensor eagerly
    torch.testing.assert_close(torch.compile(model, backend="aot_eager")(geom, features), eager, rtol=0, atol=0)


def test_no_grad_runs_the_forward_alone(monkeypatch):
    from tvm_ops.ops import voxel_pooling_backward as backward

    def refuse(*args, **kwargs):
        raise AssertionError("the backward ran")

    monkeypatch.setattr(backward, "voxel_pooling_backward", refuse)
    geom, feat = random_points()
    feat.requires_grad_(True)
    with torch.no_grad():
        out = tf.voxel_pooling(geom, feat, VOXELS)
    assert out.grad_fn is None and out.shape == (2, 11, VOXELS[1], VOXELS[0])
    with pytest.raises(AssertionError, match="the backward ran"):
        tf.voxel_pooling(geom, feat, VOXELS).sum().backward()


# --- accepted forms and checks -------------------------------------------------------------
def test_voxel_num_as_ints_sequences_and_tensors():
    geom, feat = random_points()
    expected = tf.voxel_pooling(geom, feat, VOXELS)
    for voxel_num in ([12, 10, 4], np.array(VOXELS), torch.tensor(VOXELS), torch.tensor(VOXELS, dtype=torch.int32)):
        assert torch.equal(tf.voxel_pooling(geom, feat, voxel_num), expected)
    assert tf.voxel_pooling_train is tf.voxel_pooling  # BEVDepth's name


def test_int64_geometry_drops_the_points_int32_would_wrap():
    geom, feat = random_points()
    wide = geom.long()
    wide[0, 0, 0, 0] = torch.tensor([2**32 + 1, 2**32 + 1, 0])  # .int() would make it (1, 1, 0): inside
    wide[1, 0, 0, 0] = torch.tensor([-(2**32) + 3, 1, 1])  # .int() would make it (3, 1, 1)
    expected = stock_pooling(wide, feat, VOXELS)
    torch.testing.assert_close(tf.voxel_pooling(wide, feat, VOXELS), expected, rtol=1e-5, atol=1e-6)
    wrapped = tf.voxel_pooling(wide.int(), feat, VOXELS)
    assert not torch.allclose(wrapped, expected)  # the test's points really matter


@pytest.mark.parametrize("geom_shape, feat_shape", [((2, 3, 5, 3), (2, 3, 6, 4)), ((2, 15, 3), (2, 3, 5, 4)),
                                                    ((2, 15, 2), (2, 15, 4)), ((3,), (3,))])
def test_mismatched_point_dims_are_refused(geom_shape, feat_shape):
    with pytest.raises(tvm_ops.BadParamError, match="must share their leading dims"):
        tf.voxel_pooling(torch.zeros(geom_shape, dtype=torch.int32), torch.zeros(feat_shape), VOXELS)


@pytest.mark.parametrize("voxel_num", [(12, 10), [12, 10, 4.0], (12, True, 4), torch.tensor([12.0, 10.0, 4.0]),
                                       torch.tensor([12, 10])])
def test_bad_voxel_num_is_refused(voxel_num):
    geom, feat = random_points()
    with pytest.raises(tvm_ops.BadParamError, match="voxel_num must be 3 integers"):
        tf.voxel_pooling(geom, feat, voxel_num)


@pytest.mark.parametrize("geom_shape, feat_shape", [((0, 5, 3), (0, 5, 4)), ((2, 5, 3), (2, 5, 0)),
                                                    ((2, 0, 3), (2, 0, 4)), ((2, 3, 0, 3), (2, 3, 0, 4))])
def test_an_empty_batch_channel_or_point_axis_is_refused_like_the_operator(geom_shape, feat_shape):
    with pytest.raises(tvm_ops.BadParamError, match="B, N, C must be non-zero"):
        tf.voxel_pooling(torch.zeros(geom_shape, dtype=torch.int32), torch.zeros(feat_shape), VOXELS)


def test_operator_checks_reach_the_caller():
    geom, feat = random_points()
    with pytest.raises(tvm_ops.BadParamError, match="num_voxel_x must be >= 1"):
        tf.voxel_pooling(geom, feat, (0, 10, 4))
    with pytest.raises(tvm_ops.BadParamError, match="input_features must have dtype float32, got float64"):
        tf.voxel_pooling(geom, feat.double(), VOXELS)
