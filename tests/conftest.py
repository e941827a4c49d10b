import os
import shutil

import pytest


def pytest_configure(config):
    # Every test session builds into its own cache, so the suite exercises the
    # build path and never depends on libraries left by an earlier run.
    import tempfile

    os.environ["TVM_OPS_CACHE_DIR"] = tempfile.mkdtemp(prefix="tvm_ops_test_cache_")
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
