import os
import shutil
import sys

import pytest


SESSION_CACHE = "TVM_OPS_TEST_SESSION_CACHE"  # the session's cache, for its xdist workers


def pytest_configure(config):
    # Every test session builds into its own cache, so the suite exercises the
    # build path and never depends on libraries left by an earlier run. Its xdist
    # workers, started after this ran in the main process, inherit the folder and
    # share it: each library is built once per session, not once per worker. The
    # session's temporary folder is in it too (TMPDIR, for this process, the workers
    # and every child), so the fallback folder of an unwritable cache
    # (paths._FALLBACK) is the session's: one left by an earlier process is not searched.
    import tempfile

    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(SESSION_CACHE):
        os.environ["TVM_OPS_CACHE_DIR"] = os.environ[SESSION_CACHE]
        return
    os.environ["TVM_OPS_CACHE_DIR"] = os.environ[SESSION_CACHE] = tempfile.mkdtemp(prefix="tvm_ops_test_cache_")
    os.environ["TMPDIR"] = os.path.join(os.environ[SESSION_CACHE], "tmp")
    os.mkdir(os.environ["TMPDIR"])
    tempfile.tempdir = None  # read TMPDIR again
    assert "tvm_ops.paths" not in sys.modules, "tvm_ops.paths fixed its fallback folder before the session's TMPDIR"
    os.environ.pop("TVM_OPS_BUILD_DIR", None)
    config._tvm_ops_cache = os.environ["TVM_OPS_CACHE_DIR"]


def pytest_unconfigure(config):
    folder = getattr(config, "_tvm_ops_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def gpu_skip_reason():
    """None when a CUDA GPU is visible to TVM, else why the GPU tests are skipped."""
    import tvm

    if tvm.cuda(0).exist:
        return None
    return "no NVIDIA GPU visible to this process (CUDA numerical tests run only where one exists)"


requires_torch = pytest.mark.skipif(not has_torch(), reason="PyTorch is not installed (pip install .[torch])")


def torch_devices() -> list:
    """The devices the torch functions' tests run on: "cpu", and "cuda" skipped with its
    reason where PyTorch sees no GPU (call it after importing torch)."""
    import torch

    reason = "no CUDA GPU visible to PyTorch (the CUDA runs of the torch functions need one)"
    return ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason=reason))]


def computed_kernels(op, dtype: str, plan: dict, model) -> frozenset:
    """The names of the kernels op.computes defines for `plan`, parsed as a build parses them."""
    from tvm_ops import build

    return frozenset(build.parsed_computes(op, dtype, plan, model))


def use_knobs(monkeypatch, op, knobs: dict) -> None:
    """Make `knobs` op's CPU defaults for this test: the library a call loads and the kernels
    its launch runs both follow dispatch.default_variant (tuning records are kept out)."""
    import dataclasses

    from tvm_ops import dispatch, targets

    llvm = op.schedules["llvm"]
    patched = dataclasses.replace(llvm, defaults=dict(llvm.defaults, **knobs))
    monkeypatch.setattr(op, "schedules", dict(op.schedules, llvm=patched))
    monkeypatch.setenv("TVM_OPS_RECORDS", os.devnull)
    chosen = dispatch.default_variant(op, "float32", targets.resolve("llvm")).knobs
    assert {k: chosen[k] for k in knobs} == knobs
    op.clear_call_cache()  # calls remembered under other knobs would run their kernels


def tuning_record(op, model, shape_class: str, case: str, knobs: dict) -> dict:
    """A correct, timed, local float32 record of `op` on the CPU `model`, as `tune` writes one."""
    return {"op": op.name, "dtype": "float32", "target": model.key, "shape_class": shape_class, "case": case,
            "knobs": knobs, "status": "ok", "correct": True, "median_s": 1e-6, "runner": "local"}


def assert_close(a, b, what="", atol=1e-5):
    """The tolerance of the torch functions' training comparisons."""
    import torch

    torch.testing.assert_close(a, b, rtol=1e-4, atol=atol, msg=lambda m: f"{what}: {m}")


def assert_trains_alike(ours, theirs, inputs: tuple, target, steps: int = 5, lr: float = 0.5) -> None:
    """Train two models with the same weights `steps` SGD steps on mse(model(*inputs), target):
    outputs, losses, every gradient (present, not all zero) and every parameter agree at each
    step (rtol 1e-4; atol 1e-5 for outputs and gradients, 1e-6 for losses and, on the CPU,
    parameters). On a GPU both sides may add with atomics, in an order that varies from run to
    run: a parameter may then differ by what the gradients' tolerance allows, lr * 1e-5 a step."""
    import torch

    optimisers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (ours, theirs)]
    for step in range(steps):
        results = []
        for model, opt in zip((ours, theirs), optimisers):
            opt.zero_grad()
            out = model(*inputs)
            loss = torch.nn.functional.mse_loss(out, target)
            loss.backward()
            results.append((out, loss))
        assert_close(results[0][0], results[1][0], f"step {step} output")
        assert_close(results[0][1], results[1][1], f"step {step} loss", atol=1e-6)
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
            assert_close(p.grad, q.grad, f"step {step} grad {name}")
        for opt in optimisers:
            opt.step()
        on_cpu = all(p.device.type == "cpu" for p in ours.parameters())
        parameter_atol = 1e-6 if on_cpu else lr * 1e-5 * (step + 1)
        for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
            assert_close(p, q, f"step {step} parameter {name}", atol=parameter_atol)


def assert_compiles_alike(model, inputs: tuple, resized: tuple | None = None) -> None:
    """torch.compile(fullgraph=True: a graph break raises; backend aot_eager: the fake
    implementations and the registered backward are traced; dynamic=True: sizes symbolic)
    gives the eager output and gradients of mean(model(*inputs) ** 2), and then, for
    `resized` (inputs of other sizes, as the next batch of a point cloud or image set
    brings), the same without compiling again."""
    import torch

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for run, args in enumerate([inputs] if resized is None else [inputs, resized]):
        model.zero_grad()
        eager = model(*args)
        eager.square().mean().backward()
        eager_grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        with torch.compiler.set_stance("fail_on_recompile" if run else "default"):
            out = compiled(*args)
            out.square().mean().backward()
        # the same kernels run either way: torch's default float32 tolerances
        torch.testing.assert_close(out, eager)
        for p, g in zip(model.parameters(), eager_grads):
            torch.testing.assert_close(p.grad, g)


def assert_exports_alike(model, inputs: tuple) -> None:
    """torch.export.export traces the model through the custom ops, and the program, saved
    and loaded again (as a deployment ships it), gives the eager output bit for bit."""
    import io

    import torch

    saved = io.BytesIO()
    torch.export.save(torch.export.export(model, inputs), saved)
    saved.seek(0)
    loaded = torch.export.load(saved).module()
    torch.testing.assert_close(loaded(*inputs), model(*inputs), rtol=0, atol=0)
