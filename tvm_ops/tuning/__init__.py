"""Schedule tuning: the knob search (tune) and the comparison with TVM's meta_schedule.

Both measure through TVM's popen pool (and, with --rpc-tracker, its RPC tracker), whose
dependencies are the pip extra `tvm_ops[tuning]`; nothing outside this package imports them.
"""

from __future__ import annotations

EXTRA_MODULES = ("cloudpickle", "psutil", "tornado")


def require_extras() -> None:
    """NotSupportedError naming the extra when a module the tuner needs is missing."""
    import importlib.util

    from ..errors import NotSupportedError

    missing = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise NotSupportedError(f"tuning needs {', '.join(missing)}: pip install 'tvm_ops[tuning]'")
