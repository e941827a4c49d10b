"""tvm_ops.functional.ms_deform_attn: a Deformable-DETR encoder layer trained with it and with a
pure-PyTorch core, finite differences, torch.library registration, torch.compile, DDP."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import tvm_ops  # noqa: E402
import tvm_ops.functional as tf  # noqa: E402
from tvm_ops import interop  # noqa: E402

from .conftest import assert_close, assert_compiles_alike, assert_exports_alike, assert_trains_alike, torch_devices  # noqa: E402

LEVELS = [[8, 10], [4, 5]]


# --- the pure-PyTorch deformable-attention core (grid_sample), written from the math --------
def grid_sample_core(value, spatial_shapes, level_start_index, locations, weights, im2col_step=64):
    """value [B, K, H, C], locations [B, Q, H, L, P, 2] in [0, 1] -> [B, Q, H*C]."""
    B, _, H, C = value.shape
    _, Q, _, L, P, _ = locations.shape
    sizes = [int(h) * int(w) for h, w in spatial_shapes.tolist()]
    per_level = value.split(sizes, dim=1)
    sampled = []
    for level, (h, w) in enumerate(spatial_shapes.tolist()):
        image = per_level[level].permute(0, 2, 3, 1).reshape(B * H, C, h, w)
        grid = (2 * locations[:, :, :, level] - 1).transpose(1, 2).reshape(B * H, Q, P, 2)
        sampled.append(F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    stacked = torch.stack(sampled, dim=3)  # [B*H, C, Q, L, P]
    w = weights.transpose(1, 2).reshape(B * H, 1, Q, L, P)
    return (stacked * w).sum((-1, -2)).view(B, H * C, Q).transpose(1, 2)


class EncoderLayer(nn.Module):
    """Deformable DETR's encoder attention: value / offset / weight projections, softmax over
    the level points, the deformable core, an output projection."""

    def __init__(self, core, dim=128, heads=4, levels=2, points=4):
        super().__init__()
        self.core, self.heads, self.levels, self.points = core, heads, levels, points
        self.value_proj = nn.Linear(dim, dim)
        self.sampling_offsets = nn.Linear(dim, heads * levels * points * 2)
        self.attention_weights = nn.Linear(dim, heads * levels * points)
        self.output_proj = nn.Linear(dim, dim)

    def forward(self, query, reference_points, features, spatial_shapes, level_start_index):
        B, Q, dim = query.shape
        K = features.shape[1]
        value = self.value_proj(features).view(B, K, self.heads, dim // self.heads)
        offsets = self.sampling_offsets(query).view(B, Q, self.heads, self.levels, self.points, 2)
        weights = self.attention_weights(query).view(B, Q, self.heads, self.levels * self.points)
        weights = weights.softmax(-1).view(B, Q, self.heads, self.levels, self.points)
        normalizer = torch.stack([spatial_shapes[:, 1], spatial_shapes[:, 0]], -1).to(query.dtype)
        locations = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        return self.output_proj(self.core(value, spatial_shapes, level_start_index, locations, weights))


def layer_inputs(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor(LEVELS, dtype=torch.int64)
    starts = torch.tensor([0, LEVELS[0][0] * LEVELS[0][1]], dtype=torch.int64)
    K = int((shapes[:, 0] * shapes[:, 1]).sum())
    features = torch.randn(batch, K, 128, generator=g)
    query = torch.randn(batch, K, 128, generator=g)
    reference = torch.rand(batch, K, len(LEVELS), 2, generator=g) * 0.9 + 0.05
    return query, reference, features, shapes, starts


def twin_layers(seed=1):
    torch.manual_seed(seed)
    ours = EncoderLayer(tf.ms_deform_attn)
    theirs = EncoderLayer(grid_sample_core)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("device", torch_devices())
def test_layer_matches_the_pure_pytorch_core_and_trains_the_same(device):
    ours, theirs = (layer.to(device) for layer in twin_layers())
    inputs = tuple(t.to(device) for t in layer_inputs())
    target = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(7)).to(device)
    assert_trains_alike(ours, theirs, inputs, target)
    # the training moved the parameters (the comparison above is not of untouched weights)
    assert not torch.equal(ours.sampling_offsets.weight.cpu(), twin_layers()[0].sampling_offsets.weight)


def tiny_case(dtype=torch.float32, seed=3):
    g = torch.Generator().manual_seed(seed)
    shapes = torch.tensor([[3, 4], [2, 2]])
    starts = torch.tensor([0, 12])
    value = torch.randn(1, 16, 2, 3, generator=g, dtype=dtype)
    # off the pixel lattice: bilinear sampling is smooth away from cell edges, where finite
    # differences are valid (edges are 0.5 / size apart: keep 0.05 / size from every one)
    loc = torch.rand(1, 2, 2, 2, 2, 2, generator=g, dtype=dtype) * 1.2 - 0.1
    for level, (h, w) in enumerate(shapes.tolist()):
        for axis, size in ((0, w), (1, h)):
            cell = loc[..., level, :, axis] * size - 0.5
            frac = cell - cell.floor()
            loc[..., level, :, axis] += torch.where(frac < 0.1, 0.1, 0.0) / size
            loc[..., level, :, axis] -= torch.where(frac > 0.9, 0.1, 0.0) / size
    attn = torch.rand(1, 2, 2, 2, 2, generator=g, dtype=dtype)
    return value, shapes, starts, loc, attn


@pytest.mark.filterwarnings("ignore:Input #.* is not a double precision")  # float32 ops: loose tolerances
def test_gradients_match_finite_differences():
    value, shapes, starts, loc, attn = (t.requires_grad_(t.is_floating_point()) for t in tiny_case())

    def fn(v, lo, a):
        return tf.ms_deform_attn(v, shapes, starts, lo, a)

    assert torch.autograd.gradcheck(fn, (value, loc, attn), eps=1e-3, atol=2e-3, rtol=2e-2, fast_mode=False)


def test_opcheck_passes_for_both_ops():
    value, shapes, starts, loc, attn = tiny_case()
    grad = torch.randn(1, 2, 2, 3)
    for needs_grad in (False, True):
        args = [value.clone().requires_grad_(needs_grad), shapes, starts, loc.clone().requires_grad_(needs_grad),
                attn.clone().requires_grad_(needs_grad), 64]
        torch.library.opcheck(torch.ops.tvm_ops.ms_deform_attn_forward.default, args)
    torch.library.opcheck(torch.ops.tvm_ops.ms_deform_attn_backward.default,
                          (value, shapes.int(), starts.int(), loc, attn, grad, 64))


def test_compiles_without_graph_breaks_for_any_batch_and_gives_the_eager_numbers():
    # traced at a batch of 3: at 2, the batch would share its size with the two levels and
    # the layer's broadcasts would pin it (then 2 runs on the same graph)
    assert_compiles_alike(twin_layers()[0], layer_inputs(batch=3), layer_inputs(batch=2, seed=2))


def test_exports_with_the_eager_numbers():
    assert_exports_alike(twin_layers()[0], layer_inputs())


def test_no_grad_runs_the_forward_alone(monkeypatch):
    from tvm_ops.ops import ms_deform_attn_backward as backward

    def refuse(*args, **kwargs):
        raise AssertionError("the backward ran")

    monkeypatch.setattr(backward, "ms_deform_attn_backward", refuse)
    value, shapes, starts, loc, attn = (t.requires_grad_(t.is_floating_point()) for t in tiny_case())
    with torch.no_grad():
        out = tf.ms_deform_attn(value, shapes, starts, loc, attn)
    assert out.grad_fn is None and out.shape == (1, 2, 6)
    with pytest.raises(AssertionError, match="the backward ran"):
        tf.ms_deform_attn(value, shapes, starts, loc, attn).sum().backward()


def test_mmcv_alias_and_index_dtypes():
    value, shapes, starts, loc, attn = tiny_case()
    expected = grid_sample_core(value, shapes, starts, loc, attn)
    for s, l in ((shapes, starts), (shapes.int(), starts.int())):
        out = tf.MultiScaleDeformableAttnFunction.apply(value, s, l, loc, attn, 64)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_index_values_outside_int32_are_refused():
    value, shapes, starts, loc, attn = tiny_case()
    huge = shapes.clone()
    huge[0, 0] = 2**31
    with pytest.raises(tvm_ops.BadParamError, match="spatial_shapes holds values outside int32"):
        tf.ms_deform_attn(value, huge, starts, loc, attn)
    with pytest.raises(tvm_ops.BadParamError, match="level_start_index holds values outside int32"):
        tf.ms_deform_attn(value, shapes, starts - 2**40, loc, attn)


@pytest.mark.parametrize("step", [1.5, 64.0, 0])
def test_an_im2col_step_that_is_no_positive_integer_is_refused(step):
    with pytest.raises(tvm_ops.BadParamError, match="ms_deform_attn: im2col_step must be"):
        tf.ms_deform_attn(*tiny_case(), step)


def test_per_version_computes_once_per_tensor_and_version():
    calls = []

    def make(t, key):
        calls.append(key)
        return t.sum().item()

    t = torch.arange(4)
    assert interop.per_version(t, "a", make) == 6 and interop.per_version(t, "a", make) == 6
    assert interop.per_version(t, "b", make) == 6  # another key: computed for it
    t.add_(1)  # a new version
    assert interop.per_version(t, "a", make) == 10
    assert calls == ["a", "b", "a"]
    entries = len(interop._per_version)
    del t
    assert len(interop._per_version) == entries - 2  # forgotten with the tensor


def test_functional_imports_torch_but_not_tvm():
    code = "import sys, tvm_ops.functional; print('tvm' in sys.modules, 'torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]


# --- DistributedDataParallel: two CPU processes, half the batch each -----------------------
def _ddp_worker(rank, world, init_file, steps):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        whole, _ = twin_layers()
        ours = nn.parallel.DistributedDataParallel(twin_layers()[0])
        inputs = layer_inputs(batch=2 * world)
        target = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(7))
        half = [x[rank::world] if x.dim() > 2 else x for x in inputs]
        opt_ddp = torch.optim.SGD(ours.parameters(), lr=0.5)
        opt_whole = torch.optim.SGD(whole.parameters(), lr=0.5)
        for step in range(steps):
            opt_ddp.zero_grad()
            F.mse_loss(ours(*half), target[rank::world]).backward()  # DDP averages the two halves' gradients
            opt_ddp.step()
            opt_whole.zero_grad()
            F.mse_loss(whole(*inputs), target).backward()
            opt_whole.step()
            for (name, p), q in zip(ours.module.named_parameters(), whole.parameters()):
                assert_close(p, q, f"rank {rank} step {step} parameter {name}")
    finally:
        dist.destroy_process_group()


def test_ddp_two_processes_train_like_one_on_the_whole_batch(tmp_path, monkeypatch):
    import torch.multiprocessing as mp

    monkeypatch.setenv("TVM_NUM_THREADS", "1")  # one core per process
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "rendezvous"), 5), nprocs=2, join=True)
