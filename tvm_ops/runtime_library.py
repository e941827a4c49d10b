"""Loading a built kernel library with TVM's runtime alone.

`tvm.runtime.load_module` needs `import tvm`, whose Python package (the compiler's API:
relax, TensorIR, targets) takes a process ~1 s and ~150 MB to import, while a built
library needs only TVM's runtime library (its thread pool and workspaces, which the
kernels call) and tvm_ffi's loader. Where the installed TVM package has its runtime
library where its wheel puts it, that is what loads the kernels; otherwise (a source
build elsewhere) TVM's package is imported to load it. A process that imports TVM later (to build)
loads the same runtime library file: the loader maps it once.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from pathlib import Path

from . import forked


@functools.cache
def _runtime_loaded() -> bool:
    """Load TVM's runtime library once, symbols global (the kernels' __TVMBackend* calls
    resolve against it); False where it is not found beside the installed package."""
    spec = importlib.util.find_spec("tvm")  # finds the package without importing it
    folders = spec.submodule_search_locations if spec is not None else None
    if not folders:
        return False
    runtime = Path(folders[0]) / "lib" / "libtvm_runtime.so"
    if not runtime.is_file():
        return False
    import tvm_ffi  # noqa: F401 - loads libtvm_ffi, on which the runtime library depends

    ctypes.CDLL(str(runtime), mode=ctypes.RTLD_GLOBAL)
    return True


def load_module(path: Path, cpu_only: bool):
    """The tvm_ffi Module of the shared library at `path`; `cpu_only`: it holds CPU code alone
    (a CUDA library's device code needs TVM's CUDA runtime, which importing TVM loads)."""
    if not cpu_only or "tvm" in sys.modules or not _runtime_loaded():
        return forked.import_tvm().runtime.load_module(str(path))
    import tvm_ffi

    return tvm_ffi.load_module(str(path))
