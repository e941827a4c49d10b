"""tvm_ops.functional.dynamic_scatter / DynamicScatter: an MVXNet-style dynamic voxel feature
encoder trained with them and with stock PyTorch (torch.unique + scatter_reduce / index_add_),
finite differences, torch.library registration, torch.compile with the data-dependent voxel
count."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import tvm_ops  # noqa: E402
import tvm_ops.functional as tf  # noqa: E402

from .conftest import assert_compiles_alike, assert_exports_alike, assert_trains_alike, torch_devices  # noqa: E402

DEVICES = torch_devices()


# --- stock PyTorch dynamic scatter, from the math --------------------------------------------
def stock_dynamic_scatter(feats, coors, reduce_type="max"):
    """The kept rows' torch.unique (lexicographic), then amax (scatter_reduce) or a sum
    (index_add_), / count for the mean: autograd differentiates them."""
    kept = (coors >= 0).all(1)
    rows, inverse, counts = torch.unique(coors[kept], dim=0, sorted=True, return_inverse=True, return_counts=True)
    points = feats[kept]
    shape = (rows.shape[0], feats.shape[1])
    if reduce_type == "max":
        out = feats.new_zeros(shape).scatter_reduce(0, inverse[:, None].expand_as(points), points, "amax",
                                                    include_self=False)
    else:
        out = feats.new_zeros(shape).index_add(0, inverse, points)
        if reduce_type == "mean":
            out = out / counts[:, None].to(feats.dtype)
    return out, rows.int()


def point_cloud(seed=0, points=300, grid=(3, 6, 6), dropped=12, channels=4):
    """Points in a small grid (several per voxel), some with a negative coordinate."""
    g = torch.Generator().manual_seed(seed)
    coors = torch.stack([torch.randint(0, n, (points,), generator=g) for n in grid], 1).int()
    bad = torch.randperm(points, generator=g)[:dropped]
    coors[bad, torch.randint(0, len(grid), (dropped,), generator=g)] = -1
    feats = torch.randn(points, channels, generator=g)
    return feats, coors


class DynamicVoxelEncoder(nn.Module):
    """MVXNet's dynamic VFE in small: a point MLP, each voxel's max and mean of it (the
    mean through a second linear layer), the voxel features a linear layer of both."""

    def __init__(self, scatter, channels=4, hidden=12, out=6):
        super().__init__()
        self.scatter = scatter
        self.point_mlp = nn.Linear(channels, hidden)
        self.mean_mlp = nn.Linear(channels, hidden)
        self.out = nn.Linear(2 * hidden, out)

    def forward(self, points, coors):
        voxel_max, _ = self.scatter(torch.relu(self.point_mlp(points)), coors, "max")
        voxel_mean, _ = self.scatter(self.mean_mlp(points), coors, "mean")
        return self.out(torch.cat([voxel_max, voxel_mean], 1))


@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_voxel_encoder_trains_the_same_as_stock_pytorch(device):
    torch.manual_seed(1)
    ours = DynamicVoxelEncoder(tf.dynamic_scatter).to(device)
    theirs = DynamicVoxelEncoder(stock_dynamic_scatter).to(device)
    theirs.load_state_dict(ours.state_dict())
    feats, coors = (t.to(device) for t in point_cloud())
    voxels = stock_dynamic_scatter(feats, coors)[0].shape[0]
    target = torch.randn(voxels, 6, generator=torch.Generator().manual_seed(2)).to(device)
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    assert_trains_alike(ours, theirs, (feats, coors), target, lr=0.2)
    for name, value in ours.state_dict().items():
        assert not torch.equal(value, start[name]), f"{name} did not move"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_forward_and_gradient_match_stock_pytorch(reduce_type, device):
    feats, coors = (t.to(device) for t in point_cloud(seed=3, points=500, grid=(4, 9, 7), channels=21))
    feats.requires_grad_(True)
    out, voxel_coors = tf.dynamic_scatter(feats, coors, reduce_type)
    f = feats.detach().clone().requires_grad_(True)
    expected, expected_coors = stock_dynamic_scatter(f, coors, reduce_type)
    assert voxel_coors.dtype == torch.int32 and torch.equal(voxel_coors, expected_coors)
    exact = reduce_type == "max"  # a sum in point order is not index_add_'s order
    torch.testing.assert_close(out, expected, rtol=0 if exact else 1e-6, atol=0 if exact else 1e-6)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4)).to(device)
    (ours,) = torch.autograd.grad(out, feats, grad)
    (theirs,) = torch.autograd.grad(expected, f, grad)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert not voxel_coors.requires_grad


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")  # float32 ops: loose tolerances
@pytest.mark.parametrize("reduce_type", ["max", "sum", "mean"])
def test_gradient_matches_finite_differences(reduce_type):
    feats, coors = point_cloud(seed=5, points=12, grid=(2, 2, 2), dropped=2, channels=3)
    feats.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda f: tf.dynamic_scatter(f, coors, reduce_type)[0], (feats,), eps=1e-3,
                                    atol=2e-3, rtol=2e-2)


def test_opcheck_passes_for_both_ops():
    feats, coors = point_cloud(seed=6, points=40, grid=(2, 3, 3), dropped=4)
    for reduce_type in ("max", "mean"):
        torch.library.opcheck(torch.ops.tvm_ops.dynamic_scatter_forward.default,
                              (feats.clone().requires_grad_(True), coors, reduce_type))
        voxel_feats, _, point2voxel_map, counts = torch.ops.tvm_ops.dynamic_scatter_forward(feats, coors, reduce_type)
        torch.library.opcheck(torch.ops.tvm_ops.dynamic_scatter_backward.default,
                              (torch.randn(voxel_feats.shape), feats, voxel_feats, point2voxel_map, counts,
                               reduce_type))


@pytest.mark.parametrize("device", DEVICES)
def test_encoder_compiles_without_graph_breaks_for_any_point_count(device):
    torch.manual_seed(7)
    inputs, resized = (tuple(t.to(device) for t in point_cloud(seed=seed, points=points))
                       for seed, points in ((8, 300), (9, 410)))
    assert_compiles_alike(DynamicVoxelEncoder(tf.dynamic_scatter).to(device), inputs, resized)


def test_encoder_exports_with_the_eager_numbers():
    torch.manual_seed(7)
    assert_exports_alike(DynamicVoxelEncoder(tf.dynamic_scatter), point_cloud(seed=8))


def test_no_grad_runs_the_forward_alone(monkeypatch):
    from tvm_ops.ops import dynamic_scatter_backward as backward

    def refuse(*args, **kwargs):
        raise AssertionError("the backward ran")

    monkeypatch.setattr(backward, "dynamic_scatter_backward", refuse)
    feats, coors = point_cloud(seed=9)
    feats.requires_grad_(True)
    with torch.no_grad():
        out, _ = tf.dynamic_scatter(feats, coors, "mean")
    assert out.grad_fn is None and out.shape[0] == torch.unique(coors[(coors >= 0).all(1)], dim=0).shape[0]


def test_the_module_scatters_batched_coordinates_like_mmcv_per_sample():
    feats, coors = point_cloud(seed=10, points=400, grid=(2, 3, 5, 5))
    coors[:, 0] = coors[:, 0].sort().values  # mmdet3d's order: batch index non-decreasing
    layer = tf.DynamicScatter([0.2, 0.2, 4], [0, -40, -3, 70.4, 40, 1], average_points=True)
    voxels, voxel_coors = layer(feats, coors)
    # mmcv's module: one call per batch index 0 .. coors[-1, 0], the index put back in front
    expected, expected_coors = [], []
    for b in range(int(coors[-1, 0]) + 1):
        mine = coors[:, 0] == b
        v, c = stock_dynamic_scatter(feats[mine], coors[mine][:, 1:], "mean")
        expected.append(v)
        expected_coors.append(torch.nn.functional.pad(c, (1, 0), value=b))
    torch.testing.assert_close(voxels, torch.cat(expected), rtol=1e-6, atol=1e-6)
    assert torch.equal(voxel_coors, torch.cat(expected_coors))
    three = tf.DynamicScatter([0.2, 0.2, 4], [0, -40, -3, 70.4, 40, 1], average_points=False)
    torch.testing.assert_close(three(feats, coors[:, 1:]), tf.dynamic_scatter(feats, coors[:, 1:], "max"))
    assert "average_points=False" in repr(three)


def test_int64_coordinates_are_taken_when_they_fit():
    feats, coors = point_cloud(seed=11)
    ours = tf.dynamic_scatter(feats, coors.long(), "sum")
    torch.testing.assert_close(ours, tf.dynamic_scatter(feats, coors, "sum"))


def test_int64_coordinates_below_int32_are_dropped_like_any_negative_one():
    # a point with a negative coordinate is dropped however negative; above int32 a row
    # cannot be held and is refused (below)
    feats, coors = point_cloud(seed=13)
    far = coors.long()
    far[::3, 1] = -(2**40)
    near = coors.clone()
    near[::3, 1] = -1
    torch.testing.assert_close(tf.dynamic_scatter(feats, far, "sum"), tf.dynamic_scatter(feats, near, "sum"))
    assert (far[::3, 1] == -(2**40)).all()  # the caller's tensor is left as it was


def test_bad_input_reaches_the_caller_as_a_bad_param_error():
    feats, coors = point_cloud(seed=12)
    with pytest.raises(tvm_ops.BadParamError, match="dynamic_scatter: coors holds values outside int32"):
        tf.dynamic_scatter(feats, torch.full_like(coors, 2**40, dtype=torch.int64))
    with pytest.raises(tvm_ops.BadParamError, match="reduce_type must be one of"):
        tf.dynamic_scatter(feats, coors, "min")
    with pytest.raises(tvm_ops.BadParamError, match=r"coors.shape\[0\] \(N\) must equal"):
        tf.dynamic_scatter(feats, coors[:-1])
