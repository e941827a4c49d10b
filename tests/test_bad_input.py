"""Unusual but legal inputs just work; wrong ones get the library's own error, not a raw one."""

import warnings

import numpy as np
import pytest

import tvm_ops
from tvm_ops import runner
from tvm_ops.ops import NAMES, get
from tvm_ops.testing import material

from .conftest import gpu_skip_reason, requires_torch
from .test_call_path import generated
from .test_cli import cli

GO = np.random.default_rng(0).uniform(-1, 1, (1, 2, 3)).astype(np.float32)
IDX = np.array([[[0, 1, 1], [1, 0, 0], [1, 1, 1]]], np.int32)
W = np.full((1, 3, 3), 0.5, np.float32)
EXPECTED = tvm_ops.three_interpolate_backward(GO, IDX, W, 2)


def read_only(array):
    frozen = array.copy()
    frozen.flags.writeable = False
    return frozen


@pytest.mark.parametrize("make", [read_only, lambda a: np.frombuffer(a.tobytes(), a.dtype).reshape(a.shape)],
                         ids=["flagged", "immutable_memory"])
def test_read_only_inputs_just_work(make):
    for _ in range(2):  # the checked call and the repeated one
        np.testing.assert_array_equal(tvm_ops.three_interpolate_backward(make(GO), make(IDX), make(W), 2), EXPECTED)


def test_big_endian_inputs_are_converted():
    np.testing.assert_array_equal(
        tvm_ops.three_interpolate_backward(GO.astype(">f4"), IDX.astype(">i4"), W.astype(">f4"), 2), EXPECTED)


@pytest.mark.parametrize("out, why", [(read_only(np.zeros((1, 2, 2), np.float32)), "is read-only"),
                                      (np.zeros((1, 2, 2), ">f4"), "non-native byte order")])
def test_unusable_out_buffers_are_refused(out, why):
    with pytest.raises(tvm_ops.BadParamError, match=why):
        tvm_ops.three_interpolate_backward(GO, IDX, W, out=out)


def test_a_scalar_parameter_is_named_as_such():
    with pytest.raises(tvm_ops.BadParamError, match=r"must equal m = 2, got 5"):
        tvm_ops.three_interpolate_backward(GO, IDX, W, 2, out=np.zeros((1, 2, 5), np.float32))


@requires_torch
@pytest.mark.parametrize("name", NAMES)
def test_meta_tensors_get_a_bad_param_error(name):
    import torch

    op = get(name)
    case = next(c for c in op.spec.cases if c.expect == "ok" and all(c.shape.values()))
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(name, case.name, "float32"))
    with pytest.raises(tvm_ops.BadParamError, match="tensors on meta"):
        op.call({k: torch.from_numpy(v).to("meta") for k, v in inputs.items()}, params, "llvm", {})


@pytest.mark.parametrize("command", ["test", "bench"])
def test_an_unknown_case_fails_like_tune(command):
    done = cli(command, "--case", "nope")
    assert done.returncode == 2 and "error [BAD_PARAM]: no spec case named 'nope'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_test_command_for_cuda_without_a_gpu_says_arch_mismatch():
    if gpu_skip_reason() is None:
        pytest.skip("a GPU is visible here")
    done = cli("test", "--target", "cuda", "--op", "three_interpolate_backward")
    assert done.returncode == 2 and done.stderr.startswith("error [ARCH_MISMATCH]")
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_large_copy_of_a_broadcast_input_is_logged(monkeypatch, caplog):
    from tvm_ops import interop

    monkeypatch.setattr(interop, "COPY_WARN_BYTES", 200)
    broadcast = np.broadcast_to(GO[:, :1], (1, 40, 3))
    with caplog.at_level("WARNING", logger="tvm_ops.interop"):
        tvm_ops.three_interpolate_backward(broadcast, IDX, W, 2)
    assert "copying a strided or broadcast input of shape [1, 40, 3]" in caplog.text


def test_the_first_call_of_a_library_logs_its_build(tmp_path, monkeypatch, caplog):
    from tvm_ops import dispatch

    monkeypatch.setenv("TVM_OPS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dispatch, "_loaded", {})
    tvm_ops.clear_call_cache()
    with caplog.at_level("INFO", logger="tvm_ops"):
        tvm_ops.three_interpolate_backward(GO, IDX, W, 2)
    tvm_ops.clear_call_cache()
    assert "building three_interpolate_backward-float32" in caplog.text and "first use" in caplog.text


def legal_call(name):
    """The public function of `name` and the keyword arguments of a legal spec case with no
    empty dimension (a random case where there is one, else a boundary one)."""
    import inspect

    op = get(name)
    legal = [c for c in op.spec.cases if c.expect == "ok" and c.set != "network" and all(c.shape.values())]
    case = next((c for c in legal if c.set == "random"), legal[0])
    inputs, params = generated(op, case)
    function = getattr(tvm_ops, name)
    named = inspect.signature(function).parameters
    return function, {**inputs, **{k: v for k, v in params.items() if k in named}}


def as_list(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def other_layouts(array):
    """The same values in other memory: Fortran order, big-endian, a strided view."""
    if array.ndim > 1:
        yield "fortran", np.asfortranarray(array)
    yield "big-endian", array.astype(array.dtype.newbyteorder(">"))
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    wide[..., ::2] = array
    yield "strided", wide[..., ::2]


@pytest.mark.parametrize("name", NAMES)
def test_other_layouts_of_the_same_values_give_the_same_bits(name):
    function, kwargs = legal_call(name)
    expected = as_list(function(**kwargs))
    for key, value in kwargs.items():
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            continue
        for layout, other in other_layouts(value):
            got = as_list(function(**{**kwargs, key: other}))
            for a, b in zip(got, expected, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{key} {layout}")


@requires_torch
@pytest.mark.parametrize("name", NAMES)
def test_torch_tensors_whose_memory_is_not_their_values_are_read_as_values(name):
    """A negated view (torch's negative bit: `conj().imag`, `_neg_view`) holds the negation of
    its values in memory and an efficient zero tensor no memory at all; the kernels read
    memory, so the call path resolves both (the call on plain tensors of the same values is
    the reference)."""
    import torch

    function, kwargs = legal_call(name)
    plain = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    for key, value in kwargs.items():
        if not isinstance(value, np.ndarray) or value.ndim == 0:
            continue
        zeros = np.zeros_like(value)
        for lazy, given, values in (("negated", torch._neg_view(torch.from_numpy(-value)), value),
                                    ("zero", torch._efficientzerotensor(value.shape, dtype=plain[key].dtype), zeros)):
            try:
                want = as_list(function(**{**plain, key: torch.from_numpy(values)}))
            except tvm_ops.OpError as exc:  # zeros can be illegal (a level table): refused alike
                with pytest.raises(type(exc)):
                    function(**{**plain, key: given})
                continue
            for _ in range(2):  # the checked call, then the repeated one
                got = as_list(function(**{**plain, key: given}))
                for a, b in zip(got, want, strict=True):
                    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"{key} {lazy}")


def test_host_values_from_many_threads_at_once():
    """Small host tensors read by the checks (level tables, voxel_num) share one bounded cache:
    threads filling it past its bound at once each get their own value."""
    import sys
    import threading

    from tvm_ops import interop
    from tvm_ops.ops.ms_deform_attn_sampling import level_problems

    tables = [np.array([[i + 1, 1]], np.int32) for i in range(300)]
    expected = [level_problems(t) for t in tables]
    errors = []

    def read(offset):
        try:
            for i in range(6000):
                k = (i * 7 + offset * 13) % len(tables)
                if interop.host_values(tables[k], level_problems) != expected[k]:
                    errors.append(f"wrong value for table {k}")
        except Exception as exc:  # noqa: BLE001 - any exception is the failure reported
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def wrong_or_odd(value):
    """Inputs a caller might pass by mistake (or on purpose, for the non-finite values)."""
    if not isinstance(value, np.ndarray):
        return [None, -1, 10**12, "x", 1.5]
    # the other width of its kind (float16 only from floats: large integers overflow it)
    other_width = value.astype(np.float16 if value.dtype.kind == "f" else np.float32)
    odd = [value.astype(np.float64), value.astype(np.int64), other_width, value.tolist(),
           np.zeros((0,) + value.shape[1:], value.dtype)]
    for fill in (np.nan, np.inf, -1e30) if value.dtype.kind == "f" else (-1, -2**31, 2**31 - 1, 10**6):
        filled = value.copy()
        filled.flat[::2] = fill
        odd.append(filled)
    return odd


@pytest.mark.parametrize("name", NAMES)
def test_wrong_inputs_get_the_library_error_or_a_result(name):
    """Every input replaced in turn: a wrong dtype, a list, an empty batch, non-finite or
    out-of-range values, a wrong scalar. The call returns or raises the library's own error
    (anything else fails the test, a crash fails the run); a wrong rank is always refused."""
    function, kwargs = legal_call(name)
    for key, value in kwargs.items():
        for odd in wrong_or_odd(value):
            try:
                function(**{**kwargs, key: odd})
            except tvm_ops.OpError:
                pass
        if isinstance(value, np.ndarray) and value.ndim > 0:
            for wrong_rank in (value[None], value.reshape(value.shape + (1,))):
                with pytest.raises(tvm_ops.BadParamError):
                    function(**{**kwargs, key: wrong_rank})


@requires_torch
@pytest.mark.parametrize("function", ["three_nn", "three_interpolate", "voxel_pooling", "border_align",
                                      "dynamic_scatter", "ms_deform_attn"])
def test_a_torch_function_with_one_meta_input_gets_a_bad_param_error(function):
    # any meta tensor sends a custom op to its fake implementation, which among real tensors
    # would return uninitialised outputs
    import torch
    import tvm_ops.functional as tf

    meta = lambda t: t.to("meta")  # noqa: E731
    points, level = torch.rand(1, 5, 3), torch.tensor([[2, 2]])
    calls = {
        "three_nn": lambda: tf.three_nn(points, meta(torch.rand(1, 4, 3))),
        "three_interpolate": lambda: tf.three_interpolate(torch.rand(1, 2, 4), meta(torch.zeros(1, 5, 3, dtype=torch.int32)),
                                                          torch.rand(1, 5, 3)),
        "voxel_pooling": lambda: tf.voxel_pooling(torch.zeros(1, 5, 3, dtype=torch.int32), meta(torch.rand(1, 5, 2)),
                                                  torch.tensor([2, 2, 1])),
        "border_align": lambda: tf.border_align(torch.rand(1, 4, 3, 3), meta(torch.tensor([[[0., 0., 1., 1.]]])), 2),
        "dynamic_scatter": lambda: tf.dynamic_scatter(torch.rand(5, 2), meta(torch.zeros(5, 3, dtype=torch.int32))),
        "ms_deform_attn": lambda: tf.ms_deform_attn(torch.rand(1, 4, 1, 2), level, torch.tensor([0]),
                                                    torch.rand(1, 3, 1, 1, 1, 2), meta(torch.rand(1, 3, 1, 1, 1)), 1),
    }
    with pytest.raises(tvm_ops.BadParamError, match="is on meta but .* is on cpu"):
        calls[function]()


@requires_torch
def test_forward_mode_ad_is_refused_rather_than_a_zero_tangent():
    import torch
    import torch.autograd.forward_ad as fwAD
    import tvm_ops.functional as tf

    features, weight = torch.rand(1, 2, 4), torch.rand(1, 5, 3)
    indices = torch.zeros(1, 5, 3, dtype=torch.int32)
    interpolate = lambda f: tf.three_interpolate(f, indices, weight)  # noqa: E731
    for forward_mode in (lambda: torch.func.jvp(interpolate, (features,), (torch.ones_like(features),)),
                         lambda: torch.func.jacfwd(interpolate)(features)):
        with pytest.raises(tvm_ops.NotSupportedError, match="forward-mode AD"):
            forward_mode()
    with fwAD.dual_level(), pytest.raises(tvm_ops.NotSupportedError, match="forward-mode AD"):
        interpolate(fwAD.make_dual(features, torch.ones_like(features)))
    batch = features.expand(3, 1, 2, 4).clone()
    with fwAD.dual_level(), pytest.raises(tvm_ops.NotSupportedError, match="forward-mode AD"):
        torch.func.vmap(interpolate)(fwAD.make_dual(batch, torch.ones_like(batch)))  # the tangent under vmap
    with fwAD.dual_level():  # no tangent anywhere: a dual level alone is no forward mode, vmap or not
        assert all(torch.equal(row, interpolate(features)) for row in torch.func.vmap(interpolate)(batch))
    # reverse mode as before
    features.requires_grad_()
    interpolate(features).sum().backward()
    expected = torch.zeros_like(features)
    expected[..., 0] = weight.sum()  # every index 0: each channel's column 0 takes every weight
    torch.testing.assert_close(features.grad, expected)


@requires_torch
def test_torch_func_reverse_transforms_are_refused_in_the_library_words():
    """torch.func.grad, vjp and jacrev cannot differentiate a custom op's autograd formula
    (torch's own error names an autograd.Function the caller never wrote); vmap still works."""
    import torch
    import tvm_ops.functional as tf

    features, weight = torch.rand(1, 2, 4), torch.rand(1, 5, 3)
    indices = torch.randint(0, 4, (1, 5, 3), dtype=torch.int32)
    interpolate = lambda f: tf.three_interpolate(f, indices, weight)  # noqa: E731
    for transform in (lambda: torch.func.grad(lambda f: interpolate(f).sum())(features),
                      lambda: torch.func.vjp(interpolate, features),
                      lambda: torch.func.jacrev(interpolate)(features)):
        with pytest.raises(tvm_ops.NotSupportedError, match="torch.func.grad, vjp and jacrev"):
            transform()
    batched = torch.func.vmap(interpolate)(features.expand(3, 1, 2, 4))
    assert all(torch.equal(row, interpolate(features)) for row in batched)


def test_a_masked_array_is_refused_rather_than_its_mask_ignored():
    masked = np.ma.masked_array(GO, mask=np.ones_like(GO, bool))
    with pytest.raises(tvm_ops.BadParamError, match="grad_output is a masked array"):
        tvm_ops.three_interpolate_backward(masked, IDX, W, 2)


def test_a_dlpack_export_that_raises_value_error_gets_a_bad_param_error():
    class Unexportable:
        def __dlpack__(self, **kwargs):
            raise ValueError("no such device")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(tvm_ops.BadParamError, match="cannot read this DLPack tensor"):
        tvm_ops.three_interpolate_backward(Unexportable(), IDX, W, 2)


@requires_torch
@pytest.mark.parametrize("layout", ["sparse", "mkldnn", "nested"])
def test_torch_tensors_without_strided_memory_are_refused(layout):
    """Refused by the checks, also after a call with a dense tensor of the same shape and
    strides (a sparse tensor's strides read as zeros, a broadcast one's)."""
    import torch

    dense = torch.from_numpy(GO)
    made = {"sparse": lambda: dense.to_sparse(), "mkldnn": lambda: dense.to_mkldnn(),
            "nested": lambda: torch.nested.nested_tensor([dense[0], dense[0, :1]])}[layout]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors' prototype warning
        tensor = made()
    if layout != "nested":  # (a nested tensor has no strides)
        twin = torch.zeros(6).as_strided(tensor.shape, tensor.stride())
        tvm_ops.three_interpolate_backward(twin, torch.from_numpy(IDX), torch.from_numpy(W), 2)
    with pytest.raises(tvm_ops.BadParamError, match="grad_output is a (nested|torch.* tensor)"):
        tvm_ops.three_interpolate_backward(tensor, torch.from_numpy(IDX), torch.from_numpy(W), 2)


@requires_torch
@pytest.mark.parametrize("lazy", ["negated", "zero"])
def test_an_out_buffer_whose_memory_is_not_its_values_is_refused(lazy):
    import torch

    out = torch._neg_view(torch.zeros(1, 2, 2)) if lazy == "negated" else torch._efficientzerotensor(1, 2, 2)
    with pytest.raises(tvm_ops.BadParamError, match="negated view or a zero tensor"):
        tvm_ops.three_interpolate_backward(torch.from_numpy(GO), torch.from_numpy(IDX), torch.from_numpy(W), out=out)


@requires_torch
def test_a_write_into_an_out_buffer_is_seen_by_autograd():
    """As a torch in-place op: a graph that saved the buffer refuses its backward after the
    write, rather than using the new values."""
    import torch

    x = torch.ones(1, 2, 2, requires_grad=True)
    buffer = torch.full((1, 2, 2), 3.0)
    saved = (x * buffer).sum()  # saves buffer for x's gradient
    for _ in range(2):  # the checked call and the repeated one
        before = buffer._version
        tvm_ops.three_interpolate_backward(torch.from_numpy(GO), torch.from_numpy(IDX), torch.from_numpy(W),
                                           out=buffer)
        assert buffer._version > before
    np.testing.assert_array_equal(buffer.numpy(), EXPECTED)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


@requires_torch
def test_an_out_buffer_that_requires_grad_is_refused_in_grad_mode():
    """PyTorch's own out= functions refuse it; under no_grad the write is allowed (an
    optimiser's update), as theirs is."""
    import torch

    args = torch.from_numpy(GO), torch.from_numpy(IDX), torch.from_numpy(W)
    buffer = torch.full((1, 2, 2), np.nan, requires_grad=True)
    for _ in range(2):  # the checked call and the repeated one
        with pytest.raises(tvm_ops.BadParamError, match=r"out\['grad_features'\] requires grad"):
            tvm_ops.three_interpolate_backward(*args, out=buffer)
        assert torch.isnan(buffer).all()  # refused before any kernel
    with torch.no_grad():
        tvm_ops.three_interpolate_backward(*args, out=buffer)
    np.testing.assert_array_equal(buffer.detach().numpy(), EXPECTED)


def torch_function_arguments():
    """{function name: (function, small valid keyword arguments)} of tvm_ops.functional."""
    import torch

    import tvm_ops.functional as tf

    points = torch.zeros(1, 4, 3)
    return {
        "three_nn": (tf.three_nn, {"unknown": points, "known": points}),
        "three_interpolate": (tf.three_interpolate, {"features": torch.zeros(1, 2, 4), "weight": points,
                                                     "indices": torch.zeros(1, 4, 3, dtype=torch.int32)}),
        "ms_deform_attn": (tf.ms_deform_attn, {"value": torch.zeros(1, 4, 1, 2),
                                               "spatial_shapes": torch.tensor([[2, 2]]),
                                               "level_start_index": torch.tensor([0]),
                                               "sampling_locations": torch.zeros(1, 3, 1, 1, 2, 2),
                                               "attention_weights": torch.zeros(1, 3, 1, 1, 2)}),
        "border_align": (tf.border_align, {"input": torch.zeros(1, 4, 2, 2), "boxes": torch.zeros(1, 4, 4),
                                           "pool_size": 1}),
        "voxel_pooling": (tf.voxel_pooling, {"geom_xyz": torch.zeros(1, 4, 3, dtype=torch.int32),
                                             "input_features": torch.zeros(1, 4, 2), "voxel_num": (2, 2, 1)}),
        "dynamic_scatter": (tf.dynamic_scatter, {"feats": torch.zeros(4, 2),
                                                 "coors": torch.zeros(4, 3, dtype=torch.int32)}),
    }


TORCH_FUNCTION_TENSORS = [("three_nn", "unknown"), ("three_nn", "known"), ("three_interpolate", "features"),
                          ("three_interpolate", "indices"), ("three_interpolate", "weight"),
                          ("ms_deform_attn", "value"), ("ms_deform_attn", "spatial_shapes"),
                          ("ms_deform_attn", "level_start_index"), ("ms_deform_attn", "sampling_locations"),
                          ("ms_deform_attn", "attention_weights"), ("border_align", "input"),
                          ("border_align", "boxes"), ("voxel_pooling", "geom_xyz"),
                          ("voxel_pooling", "input_features"), ("dynamic_scatter", "feats"),
                          ("dynamic_scatter", "coors")]


@requires_torch
@pytest.mark.parametrize("function, argument", TORCH_FUNCTION_TENSORS)
@pytest.mark.parametrize("kind", ["numpy", "list", "sparse", "nested"])
def test_torch_functions_refuse_what_is_no_dense_tensor(function, argument, kind):
    """Before they reshape or permute it (torch's own error would name no argument)."""
    import torch

    call, arguments = torch_function_arguments()[function]
    call(**arguments)  # valid as given
    tensor = arguments[argument]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors' prototype warning
        arguments[argument] = {"numpy": tensor.numpy, "list": tensor.tolist, "sparse": tensor.to_sparse,
                               "nested": lambda: torch.nested.nested_tensor([tensor[0], tensor[0]])}[kind]()
    why = {"numpy": "must be a torch.Tensor, got ndarray", "list": "must be a torch.Tensor, got list",
           "sparse": "is a torch.sparse_coo tensor", "nested": "is a nested tensor"}[kind]
    with pytest.raises(tvm_ops.BadParamError, match=f"{function}: {argument} {why}"):
        call(**arguments)


@requires_torch
@pytest.mark.parametrize("shape", [(4, 2, 2), (1, 1, 4, 2, 2), ()])
def test_border_align_names_an_input_of_another_rank(shape):
    import torch

    call, arguments = torch_function_arguments()["border_align"]
    with pytest.raises(tvm_ops.BadParamError, match=r"border_align: input must have rank 4 \[N, 4C, H, W\]"):
        call(**dict(arguments, input=torch.zeros(shape)))
