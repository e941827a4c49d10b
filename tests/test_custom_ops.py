"""The torch functions' plain eager path (tvm_ops/custom_ops.py): a plain call runs the
implementation without the dispatcher and gives the custom op's outputs and gradients, bit
for bit; every other call (modes, the profiler, meta tensors, subclasses) takes the custom op."""

import pytest

torch = pytest.importorskip("torch")

from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import tvm_ops.functional as tf  # noqa: E402
from tvm_ops import custom_ops  # noqa: E402

from .conftest import assert_compiles_alike, torch_devices  # noqa: E402


class Untouched(TorchFunctionMode):
    """A function mode that changes nothing: calls under it take the custom op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


# Each call's floating inputs pass through `cast` when it runs (a differentiable dtype change,
# as a model's lower-precision activations reach an op): by default none.
def as_is(tensor):
    return tensor


def three_interpolate_call(g, device, cast=as_is):
    features = torch.randn(2, 5, 7, generator=g).to(device).requires_grad_()
    indices = torch.randint(-1, 8, (2, 4, 3), generator=g, dtype=torch.int32).to(device)
    weight = torch.rand(2, 4, 3, generator=g).to(device)
    return lambda: (tf.three_interpolate(cast(features), indices, cast(weight)),), (features,)


def three_nn_call(g, device, cast=as_is):
    unknown, known = (torch.randint(-64, 65, (2, n, 3), generator=g).float().div(32).to(device) for n in (6, 5))
    return lambda: tf.three_nn(cast(unknown), cast(known)), ()


def ms_deform_attn_call(g, device, cast=as_is):
    shapes, starts = torch.tensor([[3, 4], [2, 2]], device=device), torch.tensor([0, 12], device=device)
    value = torch.randn(1, 16, 2, 3, generator=g).to(device).requires_grad_()
    locations = (torch.rand(1, 2, 2, 2, 2, 2, generator=g) * 1.2 - 0.1).to(device).requires_grad_()
    weights = torch.rand(1, 2, 2, 2, 2, generator=g).to(device).requires_grad_()
    return (lambda: (tf.ms_deform_attn(cast(value), shapes, starts, cast(locations), cast(weights)),),
            (value, locations, weights))


def border_align_call(g, device, cast=as_is):
    features = torch.randn(1, 8, 3, 4, generator=g).to(device).requires_grad_()
    centre = torch.rand(1, 12, 2, generator=g) * 3
    boxes = torch.cat([centre, centre + torch.rand(1, 12, 2, generator=g) * 2 + 0.5], -1).to(device)
    return lambda: (tf.border_align(cast(features), cast(boxes), 2),), (features,)


def voxel_pooling_call(g, device, cast=as_is):
    geom = torch.stack([torch.randint(-1, 5, (1, 10), generator=g), torch.randint(-1, 4, (1, 10), generator=g),
                        torch.randint(0, 2, (1, 10), generator=g)], -1).int().to(device)
    features = torch.randn(1, 10, 5, generator=g).to(device).requires_grad_()
    return lambda: (tf.voxel_pooling(geom, cast(features), (4, 3, 1)),), (features,)


def dynamic_scatter_call(reduce_type):
    def call(g, device, cast=as_is):
        feats = torch.randn(12, 4, generator=g).to(device).requires_grad_()
        coors = torch.randint(-1, 3, (12, 3), generator=g, dtype=torch.int32).to(device)
        return lambda: tf.dynamic_scatter(cast(feats), coors, reduce_type), (feats,)

    return call


CALLS = {"three_interpolate": three_interpolate_call, "three_nn": three_nn_call, "ms_deform_attn": ms_deform_attn_call,
         "border_align": border_align_call, "voxel_pooling": voxel_pooling_call,
         **{f"dynamic_scatter_{r}": dynamic_scatter_call(r) for r in ("max", "sum", "mean")}}


def outputs_and_gradients(call, differentiable):
    outputs = call()
    floating = [out for out in outputs if out.is_floating_point() and out.requires_grad]
    grads = []
    if floating:
        loss = sum((out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum() for out in floating)
        grads = torch.autograd.grad(loss, differentiable)
    return [out.detach() for out in outputs], list(grads)


def count_custom_op_calls(monkeypatch) -> list:
    """Every CustomOp's custom op wrapped: the names of those that ran, in order."""
    ran = []
    for value in vars(tf).values():
        if isinstance(value, custom_ops.CustomOp):
            op = value.op
            monkeypatch.setattr(value, "op", lambda *args, op=op, name=value.name: ran.append(name) or op(*args))
    return ran


@pytest.mark.parametrize("device", torch_devices())
@pytest.mark.parametrize("name", CALLS)
def test_a_plain_call_skips_the_custom_op_and_gives_its_outputs_and_gradients(name, device, monkeypatch):
    ran = count_custom_op_calls(monkeypatch)
    call, differentiable = CALLS[name](torch.Generator().manual_seed(5), device)
    plain = outputs_and_gradients(call, differentiable)
    assert ran == []  # forward and backward ran their implementations directly
    with Untouched():
        through_op = outputs_and_gradients(call, differentiable)
    assert ran and all(op.startswith("tvm_ops::") for op in ran)
    for mine, theirs in zip(plain[0] + plain[1], through_op[0] + through_op[1], strict=True):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert len(plain[1]) == len(differentiable)


def test_no_grad_and_inputs_without_grad_take_the_implementation(monkeypatch):
    ran = count_custom_op_calls(monkeypatch)
    call, (features,) = three_interpolate_call(torch.Generator().manual_seed(1), "cpu")
    with torch.no_grad():
        (out,) = call()
    features.requires_grad_(False)
    (again,) = call()
    assert ran == [] and not out.requires_grad and not again.requires_grad and torch.equal(out, again)


def test_outputs_of_a_non_differentiable_op_never_require_grad(monkeypatch):
    ran = count_custom_op_calls(monkeypatch)
    unknown = torch.rand(1, 4, 3, requires_grad=True)
    dist, idx = tf.three_nn(unknown, torch.rand(1, 5, 3))
    assert ran == [] and not dist.requires_grad and not idx.requires_grad


CONTEXTS = {"function mode": Untouched, "torch.device": lambda: torch.device("cpu"),
            "dispatch mode": lambda: FlopCounterMode(display=False), "profiler": torch.profiler.profile}


@pytest.mark.parametrize("context", CONTEXTS)
def test_modes_and_the_profiler_see_the_custom_op(context, monkeypatch):
    ran = count_custom_op_calls(monkeypatch)
    call, _ = three_interpolate_call(torch.Generator().manual_seed(2), "cpu")
    with CONTEXTS[context]() as session:
        (out,) = call()
    assert ran == ["tvm_ops::three_interpolate_forward"] and out.shape == (2, 5, 4)
    if context == "profiler":
        assert "tvm_ops::three_interpolate_forward" in {event.name for event in session.events()}


def test_meta_tensors_and_tensor_subclasses_take_the_custom_op(monkeypatch):
    ran = count_custom_op_calls(monkeypatch)
    out = tf.three_interpolate(torch.empty(2, 5, 7, device="meta"), torch.empty(2, 4, 3, dtype=torch.int32,
                                                                                device="meta"),
                               torch.empty(2, 4, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 5, 4)

    class Tagged(torch.Tensor):
        pass

    call, _ = three_interpolate_call(torch.Generator().manual_seed(3), "cpu")
    (plain,) = call()
    features = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(3)).as_subclass(Tagged)
    tagged = tf.three_interpolate(features, torch.zeros(2, 4, 3, dtype=torch.int32), torch.ones(2, 4, 3))
    assert ran == ["tvm_ops::three_interpolate_forward"] * 2 and isinstance(tagged, torch.Tensor)
    assert plain.shape == tagged.shape


def test_a_torch_without_a_probe_sends_every_call_to_the_custom_op():
    assert custom_ops._torch_probe("_no_such_probe_in_torch")() is True
    assert custom_ops._torch_probe("_autograd._profiler_enabled") is torch._C._autograd._profiler_enabled


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_gives_the_same_gradients(reentrant):
    from torch.utils.checkpoint import checkpoint

    def step(use_checkpoint):
        call, leaves = ms_deform_attn_call(torch.Generator().manual_seed(6), "cpu")
        run = lambda *_: call()[0].tanh().sum()  # noqa: E731
        out = checkpoint(run, *leaves, use_reentrant=reentrant) if use_checkpoint else run()
        out.backward()
        return [leaf.grad for leaf in leaves]

    for plain, checkpointed in zip(step(False), step(True), strict=True):
        assert torch.equal(plain, checkpointed)


def test_a_second_derivative_is_refused_as_the_custom_op_refuses_it(monkeypatch):
    # the backward ops have no formula: create_graph reaches the backward's custom op either way
    messages = []
    for plain in (True, False):
        if not plain:
            monkeypatch.setattr(custom_ops, "plain_context", lambda: False)
        call, (features,) = three_interpolate_call(torch.Generator().manual_seed(7), "cpu")
        (grad,) = torch.autograd.grad(call()[0].square().sum(), features, create_graph=True)
        with pytest.raises(RuntimeError, match="no autograd formula") as refused:
            grad.sum().backward()
        messages.append(str(refused.value))
    assert messages[0] == messages[1]


@pytest.mark.parametrize("name", [name for name in CALLS if name != "three_nn"])
def test_batched_gradients_take_the_custom_op_and_equal_one_gradient_at_a_time(name):
    """autograd's is_grads_batched (jacobian(vectorize=True), gradcheck's batched check) hands
    the backward gradients batched by torch's older vmap: storage-less tensors, which take the
    custom op and its batching rule."""
    call, differentiable = CALLS[name](torch.Generator().manual_seed(8), "cpu")
    outputs = [out for out in call() if out.is_floating_point() and out.requires_grad]
    g = torch.Generator().manual_seed(9)
    batched_grads = [torch.randn(3, *out.shape, generator=g) for out in outputs]
    batched = torch.autograd.grad(outputs, differentiable, batched_grads, retain_graph=True, is_grads_batched=True)
    for i in range(3):
        one = torch.autograd.grad(outputs, differentiable, [grad[i] for grad in batched_grads], retain_graph=True)
        for together, alone in zip(batched, one, strict=True):
            assert torch.equal(together[i], alone)


def tensors_and_traceable(name: str, g):
    """(tensors, a function of them alone that calls the torch function `name`)."""
    if name == "three_interpolate":
        return ((torch.randn(2, 5, 7, generator=g), torch.randint(-1, 8, (2, 4, 3), generator=g, dtype=torch.int32),
                 torch.rand(2, 4, 3, generator=g)), lambda features, indices, weight: tf.three_interpolate(
                     features, indices, weight) * 2)
    if name == "three_nn":
        return (torch.rand(2, 6, 3, generator=g), torch.rand(2, 5, 3, generator=g)), \
            lambda unknown, known: tf.three_nn(unknown, known)
    if name == "ms_deform_attn":
        return ((torch.randn(1, 16, 2, 3, generator=g), torch.tensor([[3, 4], [2, 2]]), torch.tensor([0, 12]),
                 torch.rand(1, 2, 2, 2, 2, 2, generator=g), torch.rand(1, 2, 2, 2, 2, generator=g)),
                lambda value, shapes, starts, locations, weights: tf.ms_deform_attn(
                    value, shapes, starts, locations, weights))
    if name == "border_align":
        centre = torch.rand(1, 12, 2, generator=g) * 3
        return ((torch.randn(1, 8, 3, 4, generator=g), torch.cat([centre, centre + 1.5], -1)),
                lambda features, boxes: tf.border_align(features, boxes, 2))
    if name == "voxel_pooling":
        return ((torch.randint(-1, 4, (1, 10, 3), generator=g, dtype=torch.int32), torch.randn(1, 10, 5, generator=g)),
                lambda geom, features: tf.voxel_pooling(geom, features, (4, 3, 1)))
    return ((torch.randn(12, 4, generator=g), torch.randint(-1, 3, (12, 3), generator=g, dtype=torch.int32)),
            lambda feats, coors: tf.dynamic_scatter(feats, coors, "mean"))


@pytest.mark.parametrize("name", ["three_interpolate", "three_nn", "ms_deform_attn", "border_align", "voxel_pooling",
                                  "dynamic_scatter"])
def test_symbolic_tracing_records_a_function_as_one_call(name):
    """torch.fx.symbolic_trace (torchvision's feature extraction, FX quantisation) cannot take
    the functions' checks, which branch on shapes and values: each is one call node, and the
    traced module gives the function's outputs."""
    tensors, traceable = tensors_and_traceable(name, torch.Generator().manual_seed(10))
    module = torch.fx.symbolic_trace(traceable)
    calls = [node.target for node in module.graph.nodes if node.op == "call_function"]
    assert calls[0] is getattr(tf, name) and all("tvm_ops" not in str(target) for target in calls[1:])
    expected = traceable(*tensors)
    for mine, theirs in zip(torch.utils._pytree.tree_leaves(module(*tensors)),
                            torch.utils._pytree.tree_leaves(expected), strict=True):
        assert torch.equal(mine, theirs)


# --- torch.autocast: every op runs in float32 -------------------------------------------------


@pytest.mark.parametrize("device", torch_devices())
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", CALLS)
def test_under_autocast_an_op_runs_in_float32_on_its_inputs_values(name, low, device):
    """Mixed-precision training: lower-precision inputs, the backward inside autocast too (as
    many training loops run it); the outputs and gradients, bit for bit, of the same call on
    the inputs' values in float32 outside autocast (float32 outputs, gradients through the casts)."""
    call, leaves = CALLS[name](torch.Generator().manual_seed(8), device, cast=lambda t: t.to(low))
    with torch.autocast(device, dtype=low):
        mixed = outputs_and_gradients(call, leaves)
    call, leaves = CALLS[name](torch.Generator().manual_seed(8), device, cast=lambda t: t.to(low).float())
    widened = outputs_and_gradients(call, leaves)
    for mine, theirs in zip(mixed[0] + mixed[1], widened[0] + widened[1], strict=True):
        assert mine.dtype == theirs.dtype and torch.equal(mine, theirs)
    assert len(mixed[1]) == len(leaves)


def test_every_op_has_its_float32_autocast_rule_for_the_cpu_and_for_gpus():
    ops = [value.name for value in vars(tf).values() if isinstance(value, custom_ops.CustomOp)]
    assert len(ops) == 11  # the six functions' forward ops, the backward ops of five (not three_nn)
    for name in ops:
        for key in ("AutocastCPU", "AutocastCUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), (name, key)


def test_a_model_compiled_under_autocast_gives_its_eager_outputs_and_gradients():
    class Propagation(torch.nn.Module):  # a float32 weight meets a bfloat16 activation
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(7, 7)

        def forward(self, features, indices, weight):
            return tf.three_interpolate(self.linear(features), indices, weight)

    g = torch.Generator().manual_seed(9)
    model = Propagation()
    inputs = (torch.randn(2, 5, 7, generator=g), torch.randint(-1, 8, (2, 4, 3), generator=g, dtype=torch.int32),
              torch.rand(2, 4, 3, generator=g))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_compiles_alike(model, inputs)


class Recorded(TorchDispatchMode):
    """Every aten op that runs under it, by name (calls under it take the custom op)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", CALLS)
def test_a_training_step_builds_no_zero_gradients_for_outputs_without_one(name):
    # autograd would build and fill a zero tensor of each non-differentiable output's size
    # per backward (voxel_pooling's pos_memo: 11 MB at BEVDepth's size)
    call, differentiable = CALLS[name](torch.Generator().manual_seed(10), "cpu")
    with Recorded() as recorded:
        outputs_and_gradients(call, differentiable)
    assert recorded.names and not [op for op in recorded.names if op.startswith(("aten.zeros", "aten.zero_"))]
