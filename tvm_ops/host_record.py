"""This host's CPU as TVM's LLVM names it, remembered on disk.

Which -mcpu this machine is, the features LLVM gives that CPU and those the machine has by
CPUID (the model is built without the others) are asked of TVM's LLVM, which lives in TVM's compiler: importing TVM's Python package for
it costs a process ~1 s (and ~150 MB). A call of an already built library needs none of
the compiler, so the answers are kept in the cache directory, one file per CPU: keyed by
what /proc/cpuinfo says of the first CPU (vendor, family, model, stepping, feature flags),
the machine's architecture and TVM's version. Another CPU, or the same one with a feature
masked (a virtual machine's), has another key and is asked of LLVM again. Without
/proc/cpuinfo (not Linux) nothing is kept: LLVM is asked in every process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import tempfile
from importlib import metadata
from pathlib import Path

from . import paths

log = logging.getLogger(__name__)

# the lines of a /proc/cpuinfo block that name the CPU and its features (x86-64, Arm);
# the others (clock, core numbering, bogomips) change from boot to boot or core to core
IDENTITY_KEYS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "CPU implementer",
                 "CPU architecture", "CPU variant", "CPU part", "CPU revision", "Features")


@functools.cache  # read per library key and host lookup; fixed for the process
def tvm_version() -> str:
    """TVM's version without importing it (its installed distribution's; else the package's)."""
    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:  # a source build on the path
        import tvm

        return tvm.__version__


def _identity(cpuinfo: str) -> str | None:
    """A digest of the first CPU's identity lines of /proc/cpuinfo text, or None if it has none."""
    first = cpuinfo.split("\n\n", 1)[0]
    fields = {}
    for line in first.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in IDENTITY_KEYS:
            fields[key.strip()] = " ".join(value.split())
    if not fields:
        return None
    text = json.dumps([platform.machine(), tvm_version(), sorted(fields.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.cache  # the CPU a process runs on does not change
def _this_cpu() -> str | None:
    try:
        return _identity(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None


def _path() -> Path | None:
    identity = _this_cpu()
    return None if identity is None else paths.cache_dir() / "hosts" / f"{identity}.json"


def load() -> dict | None:
    """{"cpu": LLVM's name of this CPU, "features": LLVM's features of that name, "host":
    {feature: whether this machine has it by CPUID}} kept for this CPU, or None."""
    path = _path()
    try:
        record = json.loads(paths.file_bytes(path)) if path is not None else None
    except (OSError, ValueError):
        return None
    if not (isinstance(record, dict) and isinstance(record.get("cpu"), str)
            and isinstance(record.get("features"), list) and isinstance(record.get("host"), dict)
            and all(isinstance(present, bool) for present in record["host"].values())):
        return None
    return record


def store(cpu: str, features, host: dict) -> None:
    """Keep LLVM's answers for this CPU (best effort: a cache that cannot be written keeps nothing)."""
    path = _path()
    if path is None:
        return
    record = {"cpu": cpu, "features": sorted(features), "host": host}
    staged = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as staged:
            json.dump(record, staged)
        os.replace(staged.name, path)  # whole or not at all, for processes starting beside this one
    except OSError as exc:
        log.debug("cannot keep the host's CPU description in %s: %s", path, exc)
        if staged is not None:
            Path(staged.name).unlink(missing_ok=True)
