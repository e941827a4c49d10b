"""Compile, cache and load kernel libraries.

One library per (operator, dtype, target, knobs, one-core or not) holds the kernels its
target's launch runs, with symbolic shapes, so one build serves every shape. A library
lives in a directory named by its key: a hash of the source of the modules that shape its
kernels (the operator's own module, its compute and schedule modules and the tvm_ops
modules they import), its plan, knobs, dtype, target, one-core flag, TVM version and the
cache's FORMAT_VERSION. Any change to one of them gives a new name, so a stale
library is never loaded, and the key is found without building or scheduling anything.

Each directory holds lib.so, the generated source (LLVM IR and assembly, or CUDA C and
PTX) and manifest.json: the plan the kernels were built with (launch reads it) and the
library's sha256, verified before loading, so a truncated or corrupt file is rebuilt
rather than handed to dlopen. Which library a call uses is dispatch.py's business.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import forked, host_record, one_core, paths, runtime_library, targets
from .macro_lookup import fast_macro_lookup

log = logging.getLogger(__name__)
# 2: knobs; 3: CUDA without fast math; 4: key from sources; 5: one-core builds; 6: key from the
# target's model (no TVM needed to find a library)
FORMAT_VERSION = 6
PACKAGE_DIR = Path(__file__).resolve().parent
build_count = 0  # libraries compiled by this process (tests count rebuilds)


class _computed_once:
    """functools.cached_property without its lock: before Python 3.12 one lock per property
    is held while any instance computes it, and a fork while another thread does (a build
    in progress) leaves it held in the child for ever. Two threads may both compute a value;
    they compute equal ones."""

    def __init__(self, func):
        functools.update_wrapper(self, func)
        self.func = func

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        # found in the instance's __dict__ from then on, before this descriptor
        value = instance.__dict__[self.name] = self.func(instance)
        return value


def parsed_computes(op, dtype: str, plan: dict, model) -> dict:
    """op.computes(dtype, plan, model), parsed under the fast macro lookup (TVM's own takes
    several times longer on kernels that expand many macros; the same kernels either way)."""
    with fast_macro_lookup():
        return op.computes(dtype, plan, model)


@dataclass(frozen=True)
class Variant:
    """Everything that decides a library's content."""

    op: object  # Operator
    dtype: str
    model: targets.TargetModel
    knobs: dict
    origin: str  # "hand-tuned" (schedules/<op>.yaml defaults) or a tuning record
    one_core: bool = False  # CPU kernels with their parallel loops serial (one_core.py)

    @_computed_once
    def plan(self) -> dict:
        """The op's plan for these knobs on this target: computed once per variant."""
        return self.op.plan(self.model, self.knobs)

    def scheduled_module(self):
        import tvm

        funcs = {}
        computes = parsed_computes(self.op, self.dtype, self.plan, self.model)
        undeclared = set(computes) - set(self.op.kernel_names)
        if undeclared:  # launch and the RPC tracer look kernels up by the declared names
            raise ValueError(f"{self.op.name}: computes {sorted(undeclared)} are not in its kernel_names")
        for name, func in computes.items():
            sch = tvm.s_tir.Schedule(func)
            self.op.schedule(sch, name, self.model, self.plan)
            scheduled = one_core.serial_kernel(sch.mod["main"]) if self.one_core else sch.mod["main"]
            funcs[name] = scheduled.with_attr("global_symbol", name)
        return tvm.IRModule(funcs)

    @_computed_once
    def key(self) -> str:
        digest = hashlib.sha256()
        # the knobs too: a knob that only changes what launch does (which kernels it calls)
        # leaves the code alike, but the manifest's knobs must be the library's own; the
        # target as the model that makes it (a CUDA target's host CPU too), read without TVM
        for part in (source_digest(self.op), json.dumps(self.plan, sort_keys=True, default=str),
                     json.dumps(self.knobs, sort_keys=True, default=str), self.dtype, _target_text(self.model),
                     host_record.tvm_version(), str(FORMAT_VERSION), str(self.one_core)):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()[:16]

    @property
    def entry_name(self) -> str:
        cores = "-1core" if self.one_core else ""
        return f"{self.op.name}-{self.dtype}-{self.model.key}{cores}-{self.key}"


def _target_text(model: targets.TargetModel) -> str:
    """What makes the TVM target of `model` (TargetModel.tvm_target), as text."""
    parts = [dataclasses.asdict(model)]
    if model.kind == "cuda":  # its host code is built for this machine's CPU
        parts.append(dataclasses.asdict(targets.host_cpu()))
    return json.dumps(parts, sort_keys=True)


@functools.lru_cache(maxsize=None)
def source_digest(op) -> str:
    """sha256 of the source of op's compute and schedule modules, of the module that makes
    one-core kernels and of every tvm_ops module they import, directly or not (found by
    reading their import statements), and of the op's own module (its plan and computes
    choose what is built; not what it imports: the call path's modules build nothing)."""
    package = type(op).__module__  # tvm_ops.ops.<op>
    # compute and schedule read the kernel names from the op's module: not a way into the call path's
    modules = _imported_modules([f"{package}.compute", f"{package}.schedule", one_core.__name__], {package})
    digest = hashlib.sha256()
    for name in sorted(modules):
        digest.update(name.encode() + b"\0" + _module_file(name).read_bytes() + b"\0")
    return digest.hexdigest()


def _module_file(name: str) -> Path | None:
    """The source file of tvm_ops module `name`, or None if it names no module."""
    base = PACKAGE_DIR.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(roots: list[str], leaves: set = frozenset()) -> set[str]:
    """The tvm_ops modules `roots` import, directly or not, and the roots; a module of `leaves`
    counts, but what it imports does not."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] != "tvm_ops":
            continue
        path = _module_file(name)
        if path is None:
            continue
        seen.add(name)
        if name in leaves:
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")
                    parent = parent[:len(parent) - node.level + 1]
                    base = ".".join(parent + ([node.module] if node.module else []))
                todo.append(base)
                todo += [f"{base}.{a.name}" for a in node.names]  # `from pkg import module`
    return seen


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
    return hashlib.sha256(paths.file_bytes(path)).hexdigest()


def _valid_entry(entry: Path, variant: Variant) -> bool:
    """Whether `entry` holds a whole library of `variant`: its manifest names the variant and
    with its plan and kernels the operator declares, and lib.so has the manifest's sha256."""
    try:
        info = manifest(entry)
        if not isinstance(info, dict) or info.get("plan") != json.loads(json.dumps(variant.plan, default=str)):
            return False  # no manifest, or not this variant's plan (as _publish wrote it)
        if (info.get("op"), info.get("dtype"), info.get("key")) != (variant.op.name, variant.dtype, variant.key):
            return False  # another library's files under this name
        kernels = info.get("kernels")
        if not isinstance(kernels, list) or not kernels or not set(kernels) <= set(variant.op.kernel_names):
            return False
        return _sha256(entry / "lib.so") == info.get("library_sha256")
    except (OSError, ValueError):  # missing or unreadable files, no JSON, no UTF-8
        return False


def _remove(path: Path) -> None:
    """Remove a folder or a file, if it can be (what is left fails the next validity check)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def build_entry(variant: Variant, out_dir: Path) -> Path:
    """Compile `variant` into out_dir/<entry>/: written to a temp dir, then renamed into
    place; when another process published the same entry first, its copy is kept. A fork
    meanwhile waits for it (its compute modules import TVM's: forked.tvm_import_guard)."""
    with forked.tvm_import_guard():
        return _build_entry(variant, out_dir)


def build_many(variants: list, out_dir: Path, jobs: int):
    """Compile each of `variants` into out_dir afresh (build_entry), `jobs` at a time, each
    in a spawned process (TVM compiles a library on one core: the msda backward's take ~50 s
    apiece on a znver3); yields (variant, entry, seconds) as each finishes. One job builds
    in this process."""
    if jobs <= 1 or len(variants) <= 1:
        for variant in variants:
            start = time.perf_counter()
            yield variant, build_entry(variant, out_dir), time.perf_counter() - start
        return
    import concurrent.futures as cf

    from .worker_pool import spawned_pool

    pool = spawned_pool(jobs)
    try:
        futures = {pool.submit(build_by_name, v.op.name, v.dtype, v.model, v.knobs, v.origin, v.one_core,
                               str(out_dir), True): v for v in variants}
        for done in cf.as_completed(futures):
            entry, seconds = done.result()
            yield futures[done], Path(entry), seconds
    finally:  # a failed build (or Ctrl-C) stops the builds not yet started
        pool.shutdown(wait=True, cancel_futures=True)


def build_by_name(op_name: str, dtype: str, model: targets.TargetModel, knobs: dict, origin: str,
                  one_core: bool, out_dir: str, rebuild: bool) -> tuple[str, float]:
    """(entry, seconds): one library compiled afresh (rebuild) or found else built
    (find_or_build), from plain values: what a spawned worker process is handed."""
    from .ops import get

    variant = Variant(get(op_name), dtype, model, knobs, origin, one_core)
    start = time.perf_counter()
    entry = build_entry(variant, Path(out_dir)) if rebuild else find_or_build(variant, Path(out_dir))
    return str(entry), time.perf_counter() - start


def _build_entry(variant: Variant, out_dir: Path) -> Path:
    global build_count
    import tvm

    entry = out_dir / variant.entry_name
    target = variant.model.tvm_target()
    linker = _linker(variant.model)
    module = variant.scheduled_module()
    built = {gv.name_hint for gv in module.get_global_vars()}
    kernels = [name for name in variant.op.kernel_names if name in built]  # in launch order
    with tvm.transform.PassContext(opt_level=3), precise_cuda_math():
        lib = tvm.tirx.build(module, target=target)
    build_count += 1
    try:
        return _publish(lib, variant, str(target), linker, out_dir, entry, kernels)
    except OSError as exc:  # a full disk, a read-only folder, another user's entry
        from .errors import ExecutionFailedError

        raise ExecutionFailedError(f"cannot write the library {entry.name} into {out_dir} ({exc}); free space "
                                   f"there, remove what stands at that path, or point TVM_OPS_CACHE_DIR at a "
                                   f"writable folder") from exc


def _publish(lib, variant: Variant, target_spec: str, linker, out_dir: Path, entry: Path, kernels: list) -> Path:
    """Write the built `lib` (holding `kernels`) to a staging folder in out_dir, then rename it to `entry`."""
    import tvm

    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out_dir)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out_dir))
    try:
        # mkdtemp makes it private (0700): the entry it becomes is readable by every user
        # of a shared cache, as a folder made by mkdir is
        os.chmod(staging, 0o755)
        with precise_cuda_math():
            sources = _write_sources(lib, variant.model, staging)
        lib.export_library(str(staging / "lib.so"), fcompile=linker)
        info = {
            "op": variant.op.name, "dtype": variant.dtype, "target": variant.model.key,
            "target_spec": target_spec, "tvm_version": tvm.__version__, "key": variant.key,
            "knobs": variant.knobs, "plan": variant.plan, "origin": variant.origin, "one_core": variant.one_core,
            "kernels": kernels, "sources": sources,
            "library_sha256": _sha256(staging / "lib.so"),
        }
        (staging / "manifest.json").write_text(json.dumps(info, indent=2, default=str))
        if os.path.lexists(entry) and not _valid_entry(entry, variant):
            _remove(entry)  # a corrupt copy of ours (a dangling link included)
        try:
            os.replace(staging, entry)
        except OSError:
            if not _valid_entry(entry, variant):
                raise
            # another process published it first: keep its copy
    finally:  # also on Ctrl-C: no half-written staging directory stays behind
        shutil.rmtree(staging, ignore_errors=True)
    return entry


STAGING_PREFIX = ".building-"
STALE_STAGING_S = 3600  # a staging directory this old belongs to a process that died


def _remove_stale_staging(folder: Path) -> None:
    now = time.time()
    for stale in folder.glob(STAGING_PREFIX + "*"):
        try:
            if now - stale.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass  # removed by another process meanwhile


def _linker(model: targets.TargetModel):
    """export_library's compiler: None (the host's) unless `model` is a CPU of another
    architecture, whose library needs that platform's cross compiler (<mtriple>-g++)."""
    if model.kind != "llvm" or not model.mtriple or targets.triple_arch(model.mtriple) == platform.machine():
        return None
    name = f"{model.mtriple}-g++"
    if shutil.which(name) is None:
        from .errors import NotSupportedError

        raise NotSupportedError(f"linking a library for {model.mtriple} needs the cross compiler {name} on PATH "
                                f"(its kernels compile without one: Variant.scheduled_module, tvm.tirx.build, "
                                f"inspect_source('asm'))")
    from tvm.support import cc

    return cc.cross_compiler(name)


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

    from .errors import ExecutionFailedError, NotSupportedError

    if shutil.which("nvcc") is None:
        raise NotSupportedError("a CUDA library is compiled to PTX with nvcc (the proof that its kernels build), "
                                "and nvcc is not on PATH")
    try:
        with model.tvm_target():  # nvcc.compile_cuda reads the arch of the current target
            return nvcc.compile_cuda(cuda_source, target_format="ptx", arch=model.arch, compiler="nvcc")
    except RuntimeError as exc:  # nvcc's log; its fatal line says why (e.g. an arch this CUDA dropped)
        log = [line.strip() for line in str(exc).splitlines()]
        why = [line for line in log if "fatal" in line] + [line for line in log if "error:" in line]
        raise ExecutionFailedError(f"nvcc could not compile the {model.arch} kernels: "
                                   f"{why[0] if why else str(exc)[:300]}") from None


def find_entry(variant: Variant) -> Path | None:
    """An existing valid library of `variant` in the search directories, else None.

    A corrupt one is deleted from the cache (it is rebuilt there) and left alone in a
    directory of the user's ($TVM_OPS_BUILD_DIR)."""
    cache = paths.cache_dir()
    for folder in paths.search_dirs():
        entry = folder / variant.entry_name
        if os.path.lexists(entry):  # a dangling link too: it is removed from the cache like a corrupt copy
            if _valid_entry(entry, variant):
                return entry
            log.warning("library %s is corrupt or unreadable; %s", entry,
                        "removing it from the cache" if folder == cache else "ignoring it")
            if folder == cache:
                _remove(entry)
    return None


def find_or_build(variant: Variant, out_dir: Path | None = None) -> Path:
    """The library of `variant`: found in the search directories, else built into out_dir
    (default: the cache). Processes that miss the same library at once (DDP ranks or
    DataLoader workers on a cold cache) build it once: they take turns (_build_turn), and
    each looks for it again on its turn."""
    found = find_entry(variant)
    if found is not None:
        return found
    out_dir = paths.writable_cache_dir() if out_dir is None else out_dir
    entry = out_dir / variant.entry_name
    # under the fork guard: a child forked while the turn is held would share its lock
    with forked.tvm_import_guard(), _build_turn(out_dir, variant.entry_name):
        if _valid_entry(entry, variant):  # published by the process whose turn came first
            return entry
        log.info("building %s for %s (first use; this compiles for a few seconds)", variant.entry_name,
                 variant.model.key)
        return build_entry(variant, out_dir)


LOCKS_FOLDER = ".locks"  # in a cache or build folder: one empty lock file per entry ever built there


# read-only opens a lock file another user created; a fifo there does not wait for a writer
# (O_NONBLOCK); a link there is not followed
_LOCK_FLAGS = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | \
    getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def _build_turn(out_dir: Path, entry_name: str):
    """Hold the turn to build `entry_name` in out_dir: an exclusive flock of its lock file,
    which the system releases when its holder exits or dies. Where no lock can be had (a
    folder another user owns, a file system without flock, no fcntl), the builds run side
    by side: publishing an entry is atomic either way, the lock only saves the compiles."""
    fd = _lock_file(out_dir, entry_name)
    try:
        if fd is not None:
            _wait_for_turn(fd, entry_name, out_dir)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _lock_file(out_dir: Path, entry_name: str) -> int | None:
    """An open descriptor of entry_name's lock file in out_dir, or None where it cannot be had."""
    try:
        locks = out_dir / LOCKS_FOLDER
        locks.mkdir(parents=True, exist_ok=True)
        return os.open(locks / entry_name, _LOCK_FLAGS, 0o644)
    except OSError:
        return None


BUILD_TURN_WAIT_S = 600  # then build alongside: a holder that is stopped, not dead, keeps its lock


def _wait_for_turn(fd: int, entry_name: str, out_dir: Path) -> None:
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no turns
        return
    deadline, waiting = time.monotonic() + BUILD_TURN_WAIT_S, False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("another process has been building %s in %s for over %d s; building it too",
                                entry_name, out_dir, BUILD_TURN_WAIT_S)
                    return
                if not waiting:
                    log.info("waiting for another process building %s in %s", entry_name, out_dir)
                    waiting = True
                time.sleep(0.2)
    except OSError:  # no flock on this file system (ENOLCK): no turns
        pass


class Kernels(dict):
    """{kernel name: callable} of one library, and the plan (tile sizes, knobs) it was built with:
    launch reads what it must match from `plan` (e.g. which kernel set a knob selected). A
    library holds the kernels its target's launch can call, not necessarily every name the
    operator declares."""

    plan: dict | None = None
    one_core: bool = False  # built with its parallel loops serial (one_core.py)

    def like(self, kernels: dict) -> "Kernels":
        """`kernels` (name -> callable: recorders, stubs, replacements) as a library with this
        one's plan and build (what launch reads besides the kernels)."""
        library = Kernels(kernels)
        library.plan, library.one_core = self.plan, self.one_core
        return library

    def __missing__(self, name):
        raise KeyError(f"no kernel {name!r} in this library (it holds {', '.join(self)}): launch asked for a "
                       f"kernel that the computes of its target and plan do not build")


def load(entry: Path, op) -> Kernels:
    """The kernels of a built library directory, with the plan recorded in its manifest."""
    info = manifest(entry)
    # a CUDA library's device code needs TVM's CUDA runtime, which importing TVM loads
    lib = runtime_library.load_module(entry / "lib.so", cpu_only=not str(info.get("target", "")).startswith("cuda"))
    try:
        kernels = Kernels({name: lib[name] for name in info["kernels"]})
    except AttributeError as exc:  # a build whose sources changed while it ran
        from .errors import ExecutionFailedError

        raise ExecutionFailedError(f"the library {entry} lacks a kernel its manifest lists ({exc}); remove that "
                                   f"folder and it is rebuilt") from None
    kernels.plan = info["plan"]
    kernels.one_core = bool(info.get("one_core", False))
    return kernels


def manifest(entry: Path) -> dict:
    return json.loads(paths.file_bytes(entry / "manifest.json"))
