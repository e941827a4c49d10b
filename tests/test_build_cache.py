"""Build, cache and load: fresh processes reuse libraries, corrupt ones are rebuilt, CUDA compiles."""

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

import tvm_ops
from tvm_ops import build, dispatch, runner, targets
from tvm_ops.ops import NAMES, get

from .conftest import gpu_skip_reason

OP = get("three_interpolate_forward")  # libraries built in under a second (this file builds dozens), with knobs and float16

# CHILD's call of OP: its reference written out, in float64
CALL = """
def call():
    rng = np.random.default_rng(0)
    features = rng.uniform(-1, 1, (2, 5, 4)).astype(np.float32)
    idx = rng.integers(0, 4, (2, 20, 3)).astype(np.int32)
    w = rng.uniform(0, 1, (2, 20, 3)).astype(np.float32)
    out = tvm_ops.three_interpolate_forward(features, idx, w)
    ref = np.zeros((2, 5, 20))
    for b in range(2):
        for n in range(20):
            for k in range(3):
                ref[b, :, n] += features[b, :, idx[b, n, k]].astype(np.float64) * w[b, n, k]
    assert np.allclose(out, ref, rtol=1e-5, atol=1e-6), "wrong result"
"""

# One call in a fresh process; prints how many libraries it had to compile and whether it
# imported TVM's Python package.
CHILD = """
import os, sys, numpy as np, tvm_ops
from tvm_ops import build
if os.environ.get("FORBID_SCHEDULING"):  # a warm process must find its library by key alone
    def forbidden(self):
        raise AssertionError("scheduled a kernel to find a cached library")
    build.Variant.scheduled_module = forbidden
""" + CALL + """
call()
print(build.build_count, "tvm" in sys.modules)
"""

# The call once with each cache folder given, each found as a fresh process finds it (no
# library loaded; one process, as TVM's import and start-up take most of a child's time);
# prints {folder name: libraries compiled}.
CHILD_PER_CACHE = """
import json, os, sys, numpy as np, tvm_ops
from tvm_ops import build, dispatch
""" + CALL + """
built = {}
for folder in sys.argv[1:]:
    os.environ["TVM_OPS_CACHE_DIR"] = folder
    dispatch._loaded.clear()
    tvm_ops.clear_call_cache()
    before = build.build_count
    call()
    built[os.path.basename(folder)] = build.build_count - before
print(json.dumps(built))
"""


def child_report(cache: Path, extra_env=None) -> tuple[int, bool]:
    """(libraries compiled, TVM imported) of CHILD run with `cache`."""
    env = dict(os.environ, TVM_OPS_CACHE_DIR=str(cache), **(extra_env or {}))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    built, imported = done.stdout.strip().splitlines()[-1].split()
    return int(built), imported == "True"


def child(cache: Path, extra_env=None) -> int:
    return child_report(cache, extra_env)[0]


def child_variant():
    """The library CHILD's call loads: its tiny call runs one-core (the policy's choice)."""
    return dispatch.default_variant(OP, "float32", targets.resolve("llvm"), one_core=True)


def entries(cache: Path):
    return sorted(p for p in cache.iterdir() if p.name.startswith(f"{OP.name}-float32-llvm"))


def test_cache_round_trip_in_fresh_processes(tmp_path):
    assert child(tmp_path) == 1  # first process builds
    assert child(tmp_path, {"FORBID_SCHEDULING": "1"}) == 0  # the next one loads from disk, unscheduled
    (entry,) = entries(tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["op"] == OP.name and manifest["dtype"] == "float32"
    assert manifest["tvm_version"] and len(manifest["key"]) == 16
    assert manifest["plan"] == OP.plan(targets.resolve("llvm"), manifest["knobs"])
    assert manifest["origin"] == "hand-tuned" and manifest["knobs"]
    assert {"kernels.ll", "kernels.s"} <= {p.name for p in entry.iterdir()}


def test_a_built_library_is_called_without_importing_tvm(tmp_path):
    # the first process builds (TVM's compiler); the next finds the host's CPU, the key and the
    # library without it and loads the kernels through TVM's runtime library alone
    assert child_report(tmp_path) == (1, True)
    assert child_report(tmp_path) == (0, False)


# a process that ran a built library without TVM, then builds another (importing TVM), then
# runs both: the runtime library TVM loads is the one already loaded
BUILD_AFTER_A_CALL = """
import sys, numpy as np, tvm_ops
rng = np.random.default_rng(1)
features = rng.uniform(-1, 1, (2, 5, 4))
idx = rng.integers(0, 4, (2, 20, 3)).astype(np.int32)
w = rng.uniform(0, 1, (2, 20, 3))
ref = np.einsum("bcnk,bnk->bcn", features[np.arange(2)[:, None, None], :, idx].transpose(0, 3, 1, 2), w)
def call(dtype):
    out = tvm_ops.three_interpolate_forward(features.astype(dtype), idx, w.astype(dtype))
    assert np.allclose(out, ref, rtol=1e-2, atol=1e-2), dtype
call(np.float32)
assert "tvm" not in sys.modules, "the built library's call imported TVM"
call(np.float16)  # not built yet: compiles
assert "tvm" in sys.modules
call(np.float32)
call(np.float16)
print("ok")
"""


def test_a_process_that_called_without_tvm_builds_and_runs_more(tmp_path):
    assert child_report(tmp_path) == (1, True)  # builds the float32 library
    env = dict(os.environ, TVM_OPS_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", BUILD_AFTER_A_CALL], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr


DAMAGES = ("truncate", "garbage", "delete_manifest", "manifest_null", "another_ops_entry", "a_file_in_its_place",
           "a_dangling_link", "no_kernels_listed", "kernels_empty", "kernels_not_a_list", "another_plan",
           "fifo_library", "fifo_manifest")


def damage_entry(cache: Path, damage: str) -> None:
    """Damage the one library entry in `cache` in the way `damage` names."""
    (entry,) = entries(cache)
    library = entry / "lib.so"
    if damage == "truncate":
        library.write_bytes(library.read_bytes()[:1000])
    elif damage == "garbage":
        library.write_bytes(b"\x7fELF" + os.urandom(5000))
    elif damage == "delete_manifest":
        (entry / "manifest.json").unlink()
    elif damage == "manifest_null":
        (entry / "manifest.json").write_text("null")
    elif damage == "another_ops_entry":  # a whole entry of another library (its sha256 matches) under this name
        other = build.build_entry(dispatch.default_variant(get("three_nn"), "float32", targets.resolve("llvm")),
                                  cache / "other")
        shutil.rmtree(entry)
        shutil.copytree(other, entry)
    elif damage == "a_file_in_its_place":
        shutil.rmtree(entry)
        entry.write_text("not a library folder")
    elif damage == "a_dangling_link":
        shutil.rmtree(entry)
        entry.symlink_to(cache / "gone")
    elif damage.startswith("fifo_"):  # never opened: a read would wait for a writer for ever
        fifo = library if damage == "fifo_library" else entry / "manifest.json"
        fifo.unlink()
        os.mkfifo(fifo)
    else:  # a manifest whose identity and sha256 hold but whose content launch reads does not
        manifest = json.loads((entry / "manifest.json").read_text())
        if damage == "no_kernels_listed":
            del manifest["kernels"]
        elif damage == "kernels_empty":
            manifest["kernels"] = []
        elif damage == "kernels_not_a_list":
            manifest["kernels"] = 5
        else:
            manifest["plan"] = {}
        (entry / "manifest.json").write_text(json.dumps(manifest))


def builds_per_cache(caches: list) -> dict:
    """{cache folder name: libraries CHILD_PER_CACHE's call compiled with it}."""
    done = subprocess.run([sys.executable, "-c", CHILD_PER_CACHE, *map(str, caches)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_corrupt_cache_entries_are_rebuilt(tmp_path):
    built = tmp_path / "built"
    assert child(built) == 1
    caches = [tmp_path / name for name in ("intact",) + DAMAGES]
    for cache in caches:
        shutil.copytree(built, cache, symlinks=True)
        if cache.name != "intact":
            damage_entry(cache, cache.name)
    # each damage detected, the library rebuilt and the answer right; the intact copy loaded as it is
    assert builds_per_cache(caches) == {"intact": 0} | dict.fromkeys(DAMAGES, 1)
    assert builds_per_cache(caches) == dict.fromkeys(["intact", *DAMAGES], 0)


def test_entries_are_readable_by_every_user_of_a_shared_cache(tmp_path):
    entry = build.build_entry(child_variant(), tmp_path)
    assert entry.stat().st_mode & 0o777 == 0o755


def test_a_cache_that_cannot_be_written_gets_the_librarys_error(tmp_path, monkeypatch):
    import errno

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(build.tempfile, "mkdtemp", full_disk)
    with pytest.raises(tvm_ops.ExecutionFailedError, match=f"into {tmp_path}.*No space left on device"):
        build.build_entry(child_variant(), tmp_path)


def test_a_corrupt_library_in_the_users_build_dir_is_left_there(tmp_path):
    entry = build.build_entry(child_variant(), tmp_path / "out")
    (entry / "lib.so").write_bytes(b"garbage")
    assert child(tmp_path / "cache", {"TVM_OPS_BUILD_DIR": str(tmp_path / "out")}) == 1  # built into the cache
    assert (entry / "lib.so").read_bytes() == b"garbage"
    assert len(entries(tmp_path / "cache")) == 1


def test_publishing_an_entry_another_process_published_keeps_the_first(tmp_path):
    variant = dispatch.default_variant(OP, "float32", targets.resolve("llvm"))
    first = build.build_entry(variant, tmp_path)
    inode = (first / "lib.so").stat().st_ino
    assert build.build_entry(variant, tmp_path) == first  # the second copy is dropped, no error
    assert (first / "lib.so").stat().st_ino == inode
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]


def test_build_dir_is_searched_before_the_cache(tmp_path):
    entry = build.build_entry(child_variant(), tmp_path / "out")
    assert entry.parent == tmp_path / "out"
    assert child(tmp_path / "empty_cache", {"TVM_OPS_BUILD_DIR": str(tmp_path / "out")}) == 0


def test_a_failed_build_in_a_worker_process_is_raised_here(tmp_path):
    model = targets.resolve("llvm")
    variant = dispatch.default_variant(get("three_nn"), "float32", model)
    # operators the workers cannot find: each worker's error comes back here, nothing is built
    bad = [dataclasses.replace(variant, op=types.SimpleNamespace(name=f"no_such_op_{i}")) for i in range(2)]
    with pytest.raises(tvm_ops.BadParamError, match="no_such_op_"):
        list(build.build_many(bad, tmp_path, jobs=2))
    assert not list(tmp_path.iterdir())


# a parent of two spawned workers, one busy and one waiting for work
ORPHANING_PARENT = """
import multiprocessing, os, time
from tvm_ops.worker_pool import spawned_pool
pool = spawned_pool(2)
busy = pool.submit(time.sleep, 600)
pool.submit(os.getpid).result()  # a second worker (the first is busy), then idle
assert len(multiprocessing.active_children()) == 2
print(*[worker.pid for worker in multiprocessing.active_children()], flush=True)
time.sleep(600)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is done; where nobody reaps orphans it stays listed


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_spawned_workers_exit_when_their_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", ORPHANING_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2 and all(_running(pid) for pid in workers)
    finally:
        parent.kill()  # no chance to shut its pool down
        parent.wait()
    deadline = time.monotonic() + 60
    while any(_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in workers)


def test_a_knob_a_dtype_or_a_target_changes_the_key():
    model = targets.resolve("llvm")
    base = dispatch.default_variant(OP, "float32", model)
    keys = {base.key, build.Variant(OP, "float32", model, dict(base.knobs, c_tile=16), "test").key,
            build.Variant(OP, "float16", model, base.knobs, "test").key,
            build.Variant(OP, "float32", targets.resolve("llvm:haswell"), base.knobs, "test").key}
    assert len(keys) == 4


def test_the_key_covers_the_modules_the_kernels_are_made_from(monkeypatch):
    op = get("border_align_backward")
    package = type(op).__module__
    modules = build._imported_modules([f"{package}.compute", f"{package}.schedule"], {package})
    assert {f"{package}.compute", f"{package}.schedule", "tvm_ops.ops.task_queue", "tvm_ops.ops.prefetch",
            "tvm_ops.host_buffers"} <= modules
    assert "tvm_ops.checks" not in modules  # the call path does not shape a kernel
    variant = dispatch.default_variant(op, "float32", targets.resolve("llvm"))
    before = variant.key
    real = Path.read_bytes
    # an edit of a module the compute imports indirectly (the task counter's LLVM IR)
    monkeypatch.setattr(Path, "read_bytes", lambda self: real(self) + b"#" * (self.name == "task_queue.py"))
    build.source_digest.cache_clear()
    try:
        assert build.Variant(op, "float32", variant.model, variant.knobs, "test").key != before
    finally:
        monkeypatch.undo()
        build.source_digest.cache_clear()
    assert build.Variant(op, "float32", variant.model, variant.knobs, "test").key == before


def test_the_fast_macro_lookup_parses_the_same_kernels(monkeypatch):
    # scheduled_module parses with macro_lookup's walk over the stack; TVM's own lookup must
    # find the same parser, so the kernels (and their libraries) are the same either way
    import tvm
    from tvm.script.parser.core.parser import ScriptMacro

    tvm_own = ScriptMacro.__dict__["_find_parser_def"]
    variant = dispatch.default_variant(get("dynamic_scatter_forward"), "float32", targets.resolve("llvm"))
    fast = variant.scheduled_module()
    assert ScriptMacro.__dict__["_find_parser_def"] is tvm_own  # restored
    monkeypatch.setattr(build, "fast_macro_lookup", contextlib.nullcontext)
    # structurally: a second parse in one process numbers repeated block names on (tile_step_2)
    tvm.ir.assert_structural_equal(variant.scheduled_module(), fast)


def test_a_launch_only_knob_gets_its_own_library(tmp_path):
    """three_interpolate_forward's plan knob changes which kernel launch calls, not the code:
    its libraries must still differ, or a load would find the other knob's manifest (and
    plan). dynamic_scatter_forward's split_min_points and ms_deform's private_min_ratio are
    such knobs too, in libraries that take far longer to build."""
    import tvm

    model = targets.resolve("llvm")
    base = dispatch.default_variant(OP, "float32", model)
    other = build.Variant(OP, "float32", model, dict(base.knobs, plan="gather"), "test")
    assert base.knobs["plan"] != "gather"
    # the same code (a second parse in one process numbers repeated block names on: compared structurally)
    tvm.ir.assert_structural_equal(base.scheduled_module(), other.scheduled_module())
    entries = [build.build_entry(v, tmp_path) for v in (base, other)]
    assert entries[0] != entries[1]
    assert [build.load(e, OP).plan["plan"] for e in entries] == [base.knobs["plan"], "gather"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
# every op for the H100's arch; the default arch (sm_80, no GPU visible) for one cheap op:
# the arch changes only nvcc's target line, and each op's builds cost up to ~15 s per arch
@pytest.mark.parametrize("name, arch", [(name, "sm_90") for name in NAMES] + [("three_nn", "sm_80")])
def test_cuda_kernels_build_and_compile_to_ptx(tmp_path, name, arch):
    op = get(name)
    for dtype in op.spec.float_dtypes:
        entry = build.build_entry(dispatch.default_variant(op, dtype, targets.cuda(arch)), tmp_path)
        source = (entry / "kernels.cu").read_text()
        ptx = (entry / "kernels.ptx").read_text()
        assert "__global__" in source
        assert f".target {arch}" in ptx and ".entry" in ptx
        # built without fast math: IEEE division, denormals kept (TVM's default flushes them)
        assert ".approx" not in ptx and ".ftz" not in ptx


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_nvcc_failures_are_one_clear_error(monkeypatch):
    from tvm_ops.errors import ExecutionFailedError, NotSupportedError

    with pytest.raises(ExecutionFailedError, match=r"nvcc could not compile the sm_90 kernels: .*error"):
        build.compile_ptx("__global__ void broken() { undeclared = 1; }", targets.cuda("sm_90"))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(NotSupportedError, match="nvcc is not on PATH"):
        build.compile_ptx("__global__ void fine() {}", targets.cuda("sm_90"))


def test_a_library_holds_the_kernels_its_target_launches():
    # three_interpolate_backward declares five kernels: the CPU's owners and CUDA's atomic
    # scatter and float16 cast; a CPU library holds the owners alone, and says so
    from tvm_ops.ops.three_interpolate_backward import OWNER_KERNELS, SCATTER

    op = get("three_interpolate_backward")
    variant = dispatch.default_variant(op, "float32", targets.resolve("llvm"))
    entry = build.find_or_build(variant)
    kernels = build.load(entry, op)
    assert list(kernels) == build.manifest(entry)["kernels"] == list(OWNER_KERNELS)
    assert set(op.kernel_names) > set(kernels)
    with pytest.raises(KeyError, match=f"no kernel '{SCATTER}' in this library"):
        kernels[SCATTER]


def test_border_align_takes_per_sample_adds_without_avx512():
    # per_position's lookup is AVX-512's vpermps: an AVX2 CPU's plan falls back to per_sample
    border, haswell = get("border_align_backward"), targets.resolve("llvm:haswell")
    variant = dispatch.default_variant(border, "float32", haswell)
    assert variant.knobs["corner_adds"] == "per_position"
    assert border.plan(haswell, variant.knobs)["corner_adds"] == "per_sample"
    assert border.plan(targets.resolve("llvm:znver4"), variant.knobs)["corner_adds"] == "per_position"
    # the session's cache: test_portability's haswell run loads the same library
    asm = (build.find_or_build(variant) / "kernels.s").read_text()
    assert "ymm" in asm and "zmm" not in asm and "vpermps" not in asm


def test_other_x86_cpu_targets_build_here_and_run_here_only_with_every_feature(tmp_path):
    haswell = targets.resolve("llvm:haswell:4")
    assert (haswell.cpu, haswell.cores, haswell.lanes("float32"), haswell.key) == ("haswell", 4, 8, "llvm-haswell-4c")
    assert targets.resolve("llvm:skylake-avx512").lanes("float32") == 16
    entry = build.build_entry(dispatch.default_variant(OP, "float32", haswell), tmp_path)
    assert build.manifest(entry)["target"] == haswell.key
    asm = (entry / "kernels.s").read_text()
    assert "ymm" in asm and "zmm" not in asm  # AVX2, 8 float32 lanes: no AVX-512 registers
    for bad, why in (("llvm:cortex-a72", "not an x86-64 CPU"), ("llvm:haswell:0", "positive integer")):
        with pytest.raises(tvm_ops.BadParamError, match=why):
            targets.resolve(bad)
    rng = np.random.default_rng(1)
    features = rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32)
    idx = rng.integers(0, 3, (1, 17, 3)).astype(np.int32)
    weight = np.full((1, 17, 3), 0.5, np.float32)
    host = tvm_ops.three_interpolate_forward(features, idx, weight)
    if not targets.missing_features(haswell):  # haswell's AVX2/FMA code runs on this host
        assert np.array_equal(tvm_ops.three_interpolate_forward(features, idx, weight, target="llvm:haswell"), host)
    # a CPU with features this host lacks (AVX-512 FP16, AMX: no AMD CPU has them)
    if targets.missing_features(targets.resolve("llvm:sapphirerapids")):
        with pytest.raises(tvm_ops.ArchMismatchError, match="lacks"):
            tvm_ops.three_interpolate_forward(features, idx, weight, target="llvm:sapphirerapids")


def test_cuda_target_without_gpu_is_an_arch_mismatch():
    if gpu_skip_reason() is None:
        pytest.skip("a GPU is visible here")
    with pytest.raises(tvm_ops.BadParamError, match="cannot run on target 'cuda'"):
        tvm_ops.three_interpolate_forward(np.zeros((1, 2, 3), np.float32), np.zeros((1, 3, 3), np.int32),
                                          np.zeros((1, 3, 3), np.float32), target="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_cuda_spec_cases_on_a_gpu(name):
    reason = gpu_skip_reason()
    if reason:
        pytest.skip(reason)
    op, model = get(name), targets.resolve("cuda")
    for case in op.spec.cases:
        if case.heavy:
            continue
        for dtype in case.dtypes:
            result = runner.run_case(op, case, dtype, model)
            assert result.verdict == "pass", f"{case.name} {dtype}: {result.detail}"


def test_cpu_kernels_use_every_core_by_default(tmp_path):
    code = ("import os, numpy as np, tvm, tvm_ops\n"
            "tvm_ops.three_interpolate_forward(np.ones((1, 2, 3), np.float32), np.zeros((1, 3, 3), np.int32),"
            " np.ones((1, 3, 3), np.float32))\n"
            "print(tvm.runtime.num_threads(), len(os.sched_getaffinity(0)))")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    env["TVM_OPS_CACHE_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    threads, cores = done.stdout.split()
    assert threads == cores


def test_a_read_only_cache_falls_back_to_a_temporary_folder(tmp_path, caplog):
    from tvm_ops import paths

    if os.geteuid() == 0:  # root writes anywhere: make the cache a file instead
        blocked = tmp_path / "cache"
        blocked.write_text("not a folder")
    else:
        blocked = tmp_path / "ro"
        blocked.mkdir(mode=0o500)
    with caplog.at_level("WARNING", logger="tvm_ops.paths"):
        folder = paths._writable(blocked)
    assert folder == paths._FALLBACK and folder.is_dir()
    assert "cannot be written" in caplog.text
    assert paths._FALLBACK in paths.search_dirs()


def test_a_fallback_folder_others_can_write_is_neither_searched_nor_built_into(tmp_path, monkeypatch):
    # its name in the shared temporary folder is predictable: another user could make it first
    from tvm_ops import paths

    shared = tmp_path / "fallback"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(paths, "_FALLBACK", shared)
    assert shared not in paths.search_dirs()
    blocked = tmp_path / "cache"
    blocked.write_text("not a folder")
    with pytest.raises(tvm_ops.ExecutionFailedError, match="only it can write; set TVM_OPS_CACHE_DIR"):
        paths._writable.__wrapped__(blocked)
    shared.chmod(0o700)
    assert shared in paths.search_dirs() and paths._writable.__wrapped__(blocked) == shared


def test_staging_folders_of_dead_builds_are_removed(tmp_path):
    stale, fresh = tmp_path / ".building-stale", tmp_path / ".building-fresh"
    stale.mkdir(), fresh.mkdir()
    old = time.time() - build.STALE_STAGING_S - 10
    os.utime(stale, (old, old))
    build.build_entry(dispatch.default_variant(OP, "float32", targets.resolve("llvm")), tmp_path)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a running build


PUBLISH = """
import sys
from pathlib import Path
from tvm_ops import build, dispatch, targets
from tvm_ops.ops import get
variant = dispatch.default_variant(get(sys.argv[2]), "float32", targets.resolve("llvm"))
print(build.build_entry(variant, Path(sys.argv[1])))
"""


def test_processes_publishing_the_same_library_at_once_all_succeed(tmp_path):
    # one round (each process compiles for seconds): the lost race itself is
    # test_publishing_an_entry_another_process_published_keeps_the_first's
    runs = [subprocess.Popen([sys.executable, "-c", PUBLISH, str(tmp_path), OP.name], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [run.communicate(timeout=300) + (run.returncode,) for run in runs]
    assert all(code == 0 for _, _, code in results), [err for _, err, _ in results]
    (entry,) = {out.strip() for out, _, _ in results}
    assert build._valid_entry(Path(entry), dispatch.default_variant(OP, "float32", targets.resolve("llvm")))
    assert [p.name for p in tmp_path.iterdir()] == [Path(entry).name]  # no staging folder left


def test_processes_missing_the_same_library_at_once_build_it_once(tmp_path):
    env = dict(os.environ, TVM_OPS_CACHE_DIR=str(tmp_path))
    runs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(3)]
    results = [run.communicate(timeout=300) + (run.returncode,) for run in runs]
    assert all(code == 0 for _, _, code in results), [err for _, err, _ in results]  # each answer right
    assert sum(int(out.split()[-2]) for out, _, _ in results) == 1  # one built, the others waited and loaded it
    assert [p.name for p in (tmp_path / build.LOCKS_FOLDER).iterdir()] == [child_variant().entry_name]


def test_where_no_lock_can_be_had_the_library_is_still_built(tmp_path):
    (tmp_path / build.LOCKS_FOLDER).write_text("a file where the lock folder goes")
    assert child(tmp_path) == 1
    assert child(tmp_path) == 0


def test_a_turn_held_too_long_is_not_waited_for_for_ever(tmp_path, monkeypatch, caplog):
    import fcntl

    variant = child_variant()
    locks = tmp_path / build.LOCKS_FOLDER
    locks.mkdir()
    monkeypatch.setattr(build, "BUILD_TURN_WAIT_S", 1)
    monkeypatch.setattr(build, "find_entry", lambda variant: None)  # this test's folder only
    with open(locks / variant.entry_name, "w") as held:  # a stopped process's turn: never released
        fcntl.flock(held, fcntl.LOCK_EX)
        with caplog.at_level("INFO", logger="tvm_ops"):
            entry = build.find_or_build(variant, tmp_path)
    assert build._valid_entry(entry, variant)
    assert "waiting for another process building" in caplog.text and "building it too" in caplog.text
