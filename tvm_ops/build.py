"""Build, cache and load kernel libraries.

One library per (operator, dtype, target) holds all of the operator's kernels,
with symbolic shapes, so one build serves every shape. A library lives in a
directory named by a content hash of the scheduled TensorIR, the target, the
knobs and the TVM version: change any of them and the name changes, so a stale
library is never loaded. Each directory holds lib.so, the generated source (LLVM IR and
assembly, or CUDA C and PTX), and manifest.json with the library's sha256,
which is verified before loading, so a truncated or corrupt file is rebuilt
rather than handed to dlopen.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from . import records, targets

log = logging.getLogger(__name__)
FORMAT_VERSION = 3  # 2: knobs in the content hash; 3: CUDA without fast math
_lock = threading.Lock()
_loaded: dict = {}
build_count = 0  # libraries compiled by this process (tests count rebuilds)


def cache_dir() -> Path:
    """Where built libraries go: $TVM_OPS_CACHE_DIR, else ~/.cache/tvm_ops."""
    # asked on every call (the tuning records live here): worked out once per value of the
    # variables it depends on
    return _cache_dir(os.environ.get("TVM_OPS_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME"),
                      os.environ.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_dir(explicit: str | None, xdg_cache_home: str | None, _home: str | None) -> Path:
    if explicit:
        return Path(explicit)
    return Path(xdg_cache_home or Path.home() / ".cache") / "tvm_ops"


def search_dirs() -> list[Path]:
    """Build directories to load from, in order: $TVM_OPS_BUILD_DIR (from `build --out`), the cache."""
    dirs = [Path(os.environ["TVM_OPS_BUILD_DIR"])] if os.environ.get("TVM_OPS_BUILD_DIR") else []
    return dirs + [cache_dir()]


@dataclass(frozen=True)
class Variant:
    """Everything that decides a library's content."""

    op: object  # Operator
    dtype: str
    model: targets.TargetModel
    knobs: dict
    origin: str  # "hand-tuned" (schedules/<op>.yaml defaults) or a tuning record

    def scheduled_module(self):
        import tvm

        plan = self.op.plan(self.model, self.knobs)
        funcs = {}
        for name, func in self.op.computes(self.dtype, plan, self.model).items():
            sch = tvm.s_tir.Schedule(func)
            self.op.schedule(sch, name, self.model, plan)
            funcs[name] = sch.mod["main"].with_attr("global_symbol", name)
        return tvm.IRModule(funcs), plan

    def content_hash(self, module) -> str:
        import tvm

        digest = hashlib.sha256()
        # the knobs too: a knob that only changes what launch does (which kernels it calls)
        # leaves the code alike, but the manifest's knobs must be the library's own; show_meta:
        # strings such as the inline LLVM IR of pragma_import_llvm print as metadata
        for part in (module.script(show_meta=True), json.dumps(self.model.tvm_target().export(), sort_keys=True, default=str),
                     json.dumps(self.knobs, sort_keys=True, default=str), tvm.__version__, str(FORMAT_VERSION)):
            digest.update(part.encode())
        return digest.hexdigest()[:16]

    def entry_name(self, digest: str) -> str:
        return f"{self.op.name}-{self.dtype}-{self.model.key}-{digest}"


def default_variant(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None) -> Variant:
    """The best tuning record of `shape_class` (origin "tuned:<case>"), else the hand-tuned defaults.

    Without a shape class (a build for no particular shape) only the hand-tuned defaults apply.
    """
    record = records.best(op, dtype, model, shape_class) if shape_class is not None else None
    if record is not None:
        return Variant(op, dtype, model, dict(record["knobs"]), f"tuned:{record.get('case')}")
    knobs = dict(op.schedules[model.kind].defaults)
    return Variant(op, dtype, model, knobs, "hand-tuned")


def variants(op, dtype: str, model: targets.TargetModel) -> list[Variant]:
    """What `build` compiles for (op, dtype, target): the hand-tuned default and every tuned class's best."""
    found = [default_variant(op, dtype, model)]
    for shape_class in records.tuned_classes(op, dtype, model):
        variant = default_variant(op, dtype, model, shape_class)
        if all(v.knobs != variant.knobs for v in found):
            found.append(variant)
    return found


# TVM compiles CUDA with --use_fast_math: approximate division and denormals flushed to
# zero (also in comparisons). These kernels promise IEEE float32 arithmetic like their CPU
# builds (dynamic_scatter_backward's mean and max are bit-exact), so their builds undo it.
PRECISE_CUDA_ENV = {"TVM_CUDA_NVCC_NO_FAST_MATH": "1",
                    "TVM_CUDA_NVRTC_EXTRA_OPTS": "--ftz=false --prec-div=true --prec-sqrt=true"}


@contextlib.contextmanager
def precise_cuda_math():
    """TVM's CUDA compilers (NVRTC and nvcc) without fast math, for the duration."""
    saved = {k: os.environ.get(k) for k in PRECISE_CUDA_ENV}
    os.environ["TVM_CUDA_NVCC_NO_FAST_MATH"] = PRECISE_CUDA_ENV["TVM_CUDA_NVCC_NO_FAST_MATH"]
    # appended after the caller's own NVRTC options: for these kernels ours win
    os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"] = " ".join(
        filter(None, (saved["TVM_CUDA_NVRTC_EXTRA_OPTS"], PRECISE_CUDA_ENV["TVM_CUDA_NVRTC_EXTRA_OPTS"])))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _valid_entry(entry: Path) -> bool:
    manifest = entry / "manifest.json"
    try:
        recorded = json.loads(manifest.read_text())["library_sha256"]
        return _sha256(entry / "lib.so") == recorded
    except (OSError, ValueError, KeyError):
        return False


def build_entry(variant: Variant, out_dir: Path) -> Path:
    """Compile `variant` into out_dir/<entry>/ (written to a temp dir, then renamed into place)."""
    global build_count
    import tvm

    module, plan = variant.scheduled_module()
    digest = variant.content_hash(module)
    entry = out_dir / variant.entry_name(digest)
    target = variant.model.tvm_target()
    with tvm.transform.PassContext(opt_level=3), precise_cuda_math():
        lib = tvm.tirx.build(module, target=target)
        build_count += 1
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=out_dir))
        sources = _write_sources(lib, variant.model, staging)
    lib.export_library(str(staging / "lib.so"))
    manifest = {
        "op": variant.op.name, "dtype": variant.dtype, "target": variant.model.key,
        "target_spec": str(target), "tvm_version": tvm.__version__, "content_hash": digest,
        "knobs": variant.knobs, "plan": plan, "origin": variant.origin,
        "kernels": list(variant.op.kernel_names), "sources": sources,
        "library_sha256": _sha256(staging / "lib.so"),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    shutil.rmtree(entry, ignore_errors=True)
    os.replace(staging, entry)
    return entry


def _write_sources(lib, model: targets.TargetModel, folder: Path) -> list[str]:
    if model.kind == "llvm":
        (folder / "kernels.ll").write_text(lib.inspect_source("ll"))
        (folder / "kernels.s").write_text(lib.inspect_source("asm"))
        return ["kernels.ll", "kernels.s"]
    cuda_source = lib.imports[0].inspect_source()
    (folder / "kernels.cu").write_text(cuda_source)
    (folder / "kernels.ptx").write_bytes(compile_ptx(cuda_source, model))
    return ["kernels.cu", "kernels.ptx"]


def compile_ptx(cuda_source: str, model: targets.TargetModel) -> bytes:
    """CUDA C -> PTX with nvcc: proof that the generated kernels compile."""
    from tvm.support import nvcc

    with model.tvm_target():  # nvcc.compile_cuda reads the arch of the current target
        return nvcc.compile_cuda(cuda_source, target_format="ptx", arch=model.arch, compiler="nvcc")


def find_entry(variant: Variant) -> tuple[Path | None, str]:
    """(an existing valid entry or None, the content hash)."""
    module, _ = variant.scheduled_module()
    digest = variant.content_hash(module)
    for folder in search_dirs():
        entry = folder / variant.entry_name(digest)
        if entry.exists():
            if _valid_entry(entry):
                return entry, digest
            log.warning("cached library %s is corrupt; rebuilding it", entry)
            shutil.rmtree(entry, ignore_errors=True)
    return None, digest


def kernels(op, dtype: str, model: targets.TargetModel, shape_class: str | None = None) -> dict:
    """{kernel name: callable} for (op, dtype, target) and the call's shape class, built on first use."""
    variant = default_variant(op, dtype, model, shape_class)
    key = (op.name, dtype, model.key, tuple(sorted(variant.knobs.items())))
    with _lock:
        if key not in _loaded:
            entry, _ = find_entry(variant)
            if entry is None:
                entry = build_entry(variant, cache_dir())
            _loaded[key] = _load(entry, op.kernel_names, op.plan(model, variant.knobs))
        return _loaded[key]


class Kernels(dict):
    """{kernel name: callable} of one library, and the plan (tile sizes, knobs) it was built with:
    launch reads what it must match from `plan` (e.g. which kernel set a knob selected)."""

    plan: dict | None = None


def load(entry: Path, op, model: targets.TargetModel) -> Kernels:
    """The kernels of a built library directory, with the plan of the knobs in its manifest."""
    return _load(entry, op.kernel_names, op.plan(model, manifest(entry)["knobs"]))


def _load(entry: Path, names, plan: dict | None = None) -> Kernels:
    import tvm

    lib = tvm.runtime.load_module(str(entry / "lib.so"))
    kernels = Kernels({name: lib[name] for name in names})
    kernels.plan = plan
    return kernels


def manifest(entry: Path) -> dict:
    return json.loads((entry / "manifest.json").read_text())
