"""Autotuning: records, resume, dispatch to the best record, failed and pruned candidates."""

import json
import os

import numpy as np
import pytest

from tvm_ops import build, checks, dispatch, records, runner, targets
from tvm_ops.testing import material
from tvm_ops.tuning import tune
from tvm_ops.errors import BadParamError
from tvm_ops.ops import NAMES, get

from .conftest import computed_kernels, tuning_record

OP = get("three_interpolate_backward")
TESTING = material(OP)
CASE = "net_16x16x64_m512"  # small: builds and measurements take well under a second
SHAPE_CLASS = "B=16 C=16 N=64 M=512"
pytestmark = pytest.mark.xdist_group("tune")


def rows_of(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def model():
    return targets.resolve("llvm")


def call_inputs(b, c, n, m, seed=1):
    rng = np.random.default_rng(seed)
    inputs = {"grad_output": rng.uniform(-1, 1, (b, c, n)).astype(np.float32),
              "indices": rng.integers(0, m, (b, n, 3)).astype(np.int32),
              "weights": rng.uniform(0, 1, (b, n, 3)).astype(np.float32)}
    return inputs, {"m": m}


def test_shape_class_buckets_sizes_and_params():
    assert records.shape_class({"B": 16, "N": 64}, {}) == "B=16 N=64"
    # within a factor of about 1.4 of a power of two: the same class
    assert records.shape_class({"N": 90}, {}) == records.shape_class({"N": 64}, {}) == "N=64"
    assert records.shape_class({"N": 91}, {}) == "N=128"
    assert records.shape_class({"N": 0}, {"reduce_type": "max", "pool": 10}) == "N=0 pool=8 reduce_type=max"


def test_tune_records_resumes_and_dispatches(tmp_path, model, monkeypatch):
    path = tmp_path / "tuning.jsonl"
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    defaults = OP.schedules["llvm"].defaults
    # before any record: the hand-tuned default
    assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).origin == "hand-tuned"

    first = tune.tune(OP, "float32", model, CASE, trials=4, records_path=path, repeat=3, workers=1)
    rows = rows_of(path)
    assert len(rows) == 4 and first.new == 4 and first.shape_class == SHAPE_CLASS
    assert rows[0]["knobs"] == defaults  # the baseline comes first
    assert len({json.dumps(r["knobs"], sort_keys=True) for r in rows}) == 4  # no repetition
    for r in rows:
        assert r["status"] == "ok" and r["correct"] and r["median_s"] > 0 and r["spread_s"] >= 0
        assert r["op"] == OP.name and r["dtype"] == "float32" and r["target"] == model.key
        assert r["shape_class"] == SHAPE_CLASS and r["case"] == CASE and r["tvm_version"] and r["timestamp"]
        assert r["sizes"] == {"B": 16, "C": 16, "N": 64, "M": 512}

    builds = build.build_count
    again = tune.tune(OP, "float32", model, CASE, trials=4, records_path=path, repeat=3, workers=1)
    assert again.new == 0 and len(rows_of(path)) == 4 and build.build_count == builds
    assert len(again.records) == 4

    # one more trial continues where the first run stopped
    more = tune.tune(OP, "float32", model, CASE, trials=5, records_path=path, repeat=3, workers=1)
    assert more.new == 1 and len(rows_of(path)) == 5

    best = min(rows_of(path), key=lambda r: r["median_s"])
    chosen = dispatch.default_variant(OP, "float32", model, SHAPE_CLASS)
    assert chosen.origin == f"tuned:{CASE}" and chosen.knobs == best["knobs"]
    # a shape of another class (and a build for no shape) keeps the hand-tuned default
    other = records.shape_class({"B": 2, "C": 5, "N": 9, "M": 4}, {})
    assert dispatch.default_variant(OP, "float32", model, other).origin == "hand-tuned"
    assert dispatch.default_variant(OP, "float32", model).origin == "hand-tuned"
    assert [v.origin for v in dispatch.variants(OP, "float32", model)][0] == "hand-tuned"

    # calls dispatch by their shape class and stay correct: a call of the tuned class
    # loads the tuned library, one of another class the hand-tuned one
    loaded = []
    OP.clear_call_cache()  # every call below takes the full path, as a call after new records would
    real_kernels = dispatch.kernels
    monkeypatch.setattr(dispatch, "kernels", lambda op, dtype, m, cls=None, one_core=False: loaded.append(cls) or
                        real_kernels(op, dtype, m, cls, one_core))
    for b, c, n, m in ((16, 16, 64, 512), (15, 17, 60, 480), (2, 5, 9, 4)):
        inputs, params = call_inputs(b, c, n, m)
        out = OP.call(inputs, params, model, {})
        np.testing.assert_allclose(out, TESTING.reference(inputs, params)["grad_features"], rtol=1e-5, atol=1e-6)
    assert loaded[:2] == [SHAPE_CLASS, SHAPE_CLASS] and loaded[2] == other
    assert [dispatch.default_variant(OP, "float32", model, cls).origin for cls in loaded] == \
        [f"tuned:{CASE}", f"tuned:{CASE}", "hand-tuned"]

    monkeypatch.delenv("TVM_OPS_RECORDS")
    # other file: no records
    assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).origin == "hand-tuned"


def test_tune_a_custom_shape(tmp_path, model):
    path = tmp_path / "tuning.jsonl"
    base = next(c for c in OP.spec.cases if c.name == CASE)
    case = tune.with_shape(OP, base, {"N": 32, "M": 100})
    assert case.name == f"{CASE}[N=32,M=100]" and case.shape == {"B": 16, "C": 16, "N": 32, "M": 100}
    result = tune.tune(OP, "float32", model, case, trials=2, records_path=path, repeat=3, workers=1)
    assert result.shape_class == "B=16 C=16 N=32 M=128"
    assert [r["sizes"] for r in rows_of(path)] == [{"B": 16, "C": 16, "N": 32, "M": 100}] * 2
    with pytest.raises(BadParamError, match="--shape names Q, but case"):
        tune.with_shape(OP, base, {"Q": 3})


def sabotage(monkeypatch, knob: str, value, mutate) -> None:
    """Libraries built with knobs[knob] == value get their kernels' bodies from `mutate(func)`.

    The tune calls below use workers=1, so builds happen in this process and see the patch;
    the mutated libraries get keys of their own, so they never share a cache entry with a good one."""
    import tvm

    real, real_key = build.Variant.scheduled_module, build.Variant.key.func

    def scheduled_module(self):
        module = real(self)
        if self.knobs.get(knob) != value:
            return module
        return tvm.IRModule({gv.name_hint: f.with_body(mutate(f)) for gv, f in module.functions.items()})

    def key(self):
        # one key per mutation: a library cached by one sabotage must not serve another
        return real_key(self) + (f"-sabotaged-{mutate.__name__}" if self.knobs.get(knob) == value else "")

    monkeypatch.setattr(build.Variant, "scheduled_module", scheduled_module)
    monkeypatch.setattr(build.Variant, "key", property(key))


def does_nothing(func):
    """The kernel returns at once: its output keeps whatever it held (NaN, in the tuner's check)."""
    from tvm import tirx

    return tirx.Evaluate(tirx.const(0, "int32"))


def aborts(func):
    """The kernel kills its process before doing anything (a crashing candidate)."""
    from tvm import tirx

    return tirx.SeqStmt([tirx.Evaluate(tirx.call_extern("int32", "abort")), func.body])


def test_failing_candidate_is_recorded_and_skipped(tmp_path, model, monkeypatch):
    path = tmp_path / "tuning.jsonl"
    space = tune.search_space(OP, model)[:4]
    bad_tile = next(k["c_tile"] for k in space[1:] if k["c_tile"] != space[0]["c_tile"])
    sabotage(monkeypatch, "c_tile", bad_tile, does_nothing)
    result = tune.tune(OP, "float32", model, CASE, trials=4, records_path=path, repeat=3, workers=1)
    rows = rows_of(path)
    assert len(rows) == 4 and all(r["runner"] == "local" for r in rows)
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed and all(r["knobs"]["c_tile"] == bad_tile for r in failed)
    assert all(not r["correct"] and r["median_s"] is None and "wrong result" in r["error"] for r in failed)
    assert all(r["status"] == "ok" for r in rows if r["knobs"]["c_tile"] != bad_tile)
    assert result.best["knobs"]["c_tile"] != bad_tile
    assert records.best(OP, "float32", model, SHAPE_CLASS, path)["knobs"]["c_tile"] != bad_tile


def test_crashing_candidate_is_recorded_and_the_run_goes_on(tmp_path, model, monkeypatch):
    path = tmp_path / "tuning.jsonl"
    space = tune.search_space(OP, model)[:4]
    bad_tile = next(k["c_tile"] for k in space[1:] if k["c_tile"] != space[0]["c_tile"])
    # the candidate calls abort(): it kills the measuring child process, not the tuner
    sabotage(monkeypatch, "c_tile", bad_tile, aborts)
    tune.tune(OP, "float32", model, CASE, trials=4, records_path=path, repeat=3, workers=1)
    rows = rows_of(path)
    assert len(rows) == 4
    crashed = [r for r in rows if r["knobs"]["c_tile"] == bad_tile]
    assert crashed and all(r["status"] == "failed" and r["error"] and not r["correct"] for r in crashed)
    assert all("crashed the measuring process" in r["error"] for r in crashed)
    # candidates measured after the crash, by a fresh child process, still count
    after = rows[rows.index(crashed[0]) + 1:]
    assert all(r["status"] == "ok" for r in rows if r["knobs"]["c_tile"] != bad_tile)
    assert any(r["status"] == "ok" for r in after) or rows[-1] in crashed


def test_policy_pruned_candidates(tmp_path, model, monkeypatch):
    path = tmp_path / "tuning.jsonl"
    plan = type(OP).plan

    def budget_plan(self, model, knobs):  # a policy that rejects the largest c_tile
        if knobs["c_tile"] == 64:
            raise ValueError("on-chip budget too small for c_tile=64")
        return plan(self, model, knobs)

    monkeypatch.setattr(type(OP), "plan", budget_plan)
    builds = build.build_count
    result = tune.tune(OP, "float32", model, CASE, trials=6, records_path=path, repeat=3, workers=1)
    rows = rows_of(path)
    pruned = [r for r in rows if r["status"] == "pruned"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 6 and all(r["knobs"]["c_tile"] != 64 for r in ok)
    assert pruned and all(r["knobs"]["c_tile"] == 64 and "on-chip budget" in r["error"] for r in pruned)
    assert build.build_count - builds <= 6  # pruned candidates were never built
    assert len(result.records) == len(rows)
    # a resumed run re-prunes nothing and rebuilds nothing
    again = tune.tune(OP, "float32", model, CASE, trials=6, records_path=path, repeat=3, workers=1)
    assert again.new == 0 and len(rows_of(path)) == len(rows)


def test_parallel_builds(tmp_path, model):
    path = tmp_path / "tuning.jsonl"
    result = tune.tune(OP, "float32", model, CASE, trials=3, records_path=path, repeat=3, workers=2)
    assert [r["status"] for r in rows_of(path)] == ["ok"] * 3 and result.best is not None
    assert "hand-tuned" in tune.table(result)


def test_cli_tune_and_list(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "r.jsonl"
    env = dict(os.environ, TVM_OPS_RECORDS=str(path))
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--trials", "2", "--records", str(path), "--workers", "1", "--repeat", "3"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "(hand-tuned)" in done.stdout and f"shape class {SHAPE_CLASS} now use tuned:{CASE}" in done.stdout
    assert len(rows_of(path)) == 2
    listed = subprocess.run([sys.executable, "-m", "tvm_ops", "list"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert "float32: hand-tuned" in listed.stdout and "float16: hand-tuned" in listed.stdout
    assert f"shape class {SHAPE_CLASS}: tuned:{CASE}" in listed.stdout
    # build compiles the hand-tuned library and the tuned class's best (when its knobs differ),
    # each parallel and one-core
    built = subprocess.run([sys.executable, "-m", "tvm_ops", "build", "--op", OP.name, "--dtype", "float32",
                            "--out", str(tmp_path / "libs")], env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    best = records.best(OP, "float32", targets.resolve("llvm"), SHAPE_CLASS, path)
    origins = [tuple(line.split()[6:8]) for line in built.stdout.splitlines() if line.startswith(OP.name)]
    expected = ["hand-tuned"] + ([f"tuned:{CASE}"] if best["knobs"] != OP.schedules["llvm"].defaults else [])
    # a line per library as it finishes (builds run side by side: in no fixed order)
    assert sorted(origins) == sorted([(o, "parallel") for o in expected] + [(o, "one-core") for o in expected])
    # --shape: another size of the same case is its own shape class
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--shape", "N=32", "--trials", "1", "--records", str(path), "--workers", "1",
                           "--repeat", "3"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "shape class B=16 C=16 N=32 M=512" in done.stdout and len(rows_of(path)) == 3
    bad = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--shape", "N:32"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "want SYMBOL=SIZE" in bad.stderr


@pytest.fixture
def rpc_tracker():
    """A real TVM RPC tracker and one server (key tvm-ops-test) on 127.0.0.1, both stopped at the end."""
    import socket

    pytest.importorskip("tornado")  # TVM's tracker runs on tornado
    from tvm.rpc import server as rpc_server
    from tvm.rpc import tracker as rpc_tracker_mod

    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    tracker = server = None
    try:
        tracker = rpc_tracker_mod.Tracker(host="127.0.0.1", port=free_port(), port_end=65535, silent=True)
        server = rpc_server.Server(host="127.0.0.1", port=free_port(), port_end=65535, key="tvm-ops-test",
                                   tracker_addr=("127.0.0.1", tracker.port), silent=True)
        yield f"127.0.0.1:{tracker.port}", "tvm-ops-test"
    finally:
        if server is not None:
            server.terminate()
        if tracker is not None:
            tracker.terminate()


def test_rpc_tune_through_tracker(tmp_path, rpc_tracker):
    import subprocess
    import sys

    addr, key = rpc_tracker
    path = tmp_path / "r.jsonl"
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--trials", "2", "--records", str(path), "--workers", "1", "--repeat", "3",
                           "--timeout", "30", "--rpc-tracker", addr, "--rpc-key", key],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"on rpc:{key}" in done.stdout
    rows = rows_of(path)
    assert len(rows) == 2
    for r in rows:
        assert r["runner"] == f"rpc:{key}", r
        assert r["status"] == "ok" and r["correct"] and r["median_s"] > 0 and r["spread_s"] >= 0, r
    # a board of another x86-64 CPU: the libraries are built here for its -mcpu and measured there
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--target", "llvm:haswell:2", "--trials", "1", "--records", str(path), "--workers", "1",
                           "--repeat", "3", "--timeout", "30", "--rpc-tracker", addr, "--rpc-key", key],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    other = [r for r in rows_of(path) if r["target"] == "llvm-haswell-2c"]
    assert len(other) == 1 and other[0]["status"] == "ok" and other[0]["runner"] == f"rpc:{key}", other
    # without a board, another CPU cannot be measured here
    done = subprocess.run([sys.executable, "-m", "tvm_ops", "tune", "--op", OP.name, "--case", CASE,
                           "--target", "llvm:haswell:2", "--trials", "1", "--records", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "is not this machine's CPU" in done.stderr
    # a local run of the same space does not reuse the remote records
    local = tune.tune(OP, "float32", targets.resolve("llvm"), CASE, trials=1, records_path=path, repeat=3,
                      workers=1)
    assert local.new == 1 and local.records[0]["runner"] == "local"


def test_launch_traces_for_rpc_with_declared_workspaces(monkeypatch):
    from tvm_ops.errors import NotSupportedError

    def traced(op, case_name=None, **extra):
        case = next(c for c in op.spec.cases if c.expect == "ok" and (case_name is None or c.name == case_name))
        case = case if not extra else __import__("dataclasses").replace(case, extra=dict(case.extra, **extra))
        inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
        problem = checks.check(op.spec, inputs, params, {}, op.rules)
        return tune.trace_launch(op, problem, op.plan(targets.resolve("llvm"), op.schedules["llvm"].defaults)), \
            problem

    calls, _ = traced(OP, CASE)
    assert [name for name, _ in calls] == [OP.kernel_names[1]]  # one vector of channels: the case has C = 16
    # dynamic_scatter's max workspaces (the voxel buckets) are declared, so they are placeholders
    # like the tensors
    scatter = get("dynamic_scatter_backward")
    calls, problem = traced(scatter, reduce_type="max")
    whole_rows = scatter.plan(targets.resolve("llvm"), scatter.schedules["llvm"].defaults)["whole_rows"]
    voxels = f"max_voxels_rows_c{problem.sizes['C']}" if problem.sizes["C"] in whole_rows else "max_voxels"
    assert [name for name, _ in calls] == ["max_buckets", voxels, "max_unbucketed"]
    assert {"order", "start"} <= {a.name for _, args in calls for a in args if isinstance(a, tune._Ref)}

    def allocating_launch(self, kernels, problem, tensors):  # a workspace launch makes on the host
        kernels[self.kernel_names[0]](np.empty(4, np.float32))

    monkeypatch.setattr(type(OP), "launch", allocating_launch)
    with pytest.raises(NotSupportedError, match="cannot run over RPC"):
        traced(OP, CASE)


@pytest.mark.parametrize("name", [name for name in NAMES if name != "dynamic_scatter_forward"])  # counted: its own test
@pytest.mark.parametrize("kind", ["llvm", "cuda"])
def test_every_launch_replays_over_rpc(name, kind):
    """Each op's launch only calls kernels on its tensors and declared workspaces (what must
    start at zero is declared too), so `tune --rpc-tracker` can replay it on a board, CPU or GPU;
    and only kernels that its target's library holds (a GPU-less check of the CUDA launch)."""
    import dataclasses

    op = get(name)
    model = targets.resolve("llvm") if kind == "llvm" else targets.cuda("sm_80")
    case = next(c for c in op.spec.cases if c.set == "network" and c.expect == "ok")
    for dtype in op.spec.float_dtypes:
        inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
        problem = checks.check(op.spec, inputs, params, {}, op.rules)
        if kind == "cuda":
            problem = dataclasses.replace(problem, kind="torch", device="cuda")
        plan = op.plan(model, op.schedules[kind].defaults)
        calls = tune.trace_launch(op, problem, plan)
        assert {kernel for kernel, _ in calls} <= computed_kernels(op, dtype, plan, model)
        used = {a.name for _, args in calls for a in args if isinstance(a, tune._Ref)}
        assert set(op.zeroed(problem, plan)) <= used | set(op.workspaces(problem, plan))
        assert {t.name for t in op.spec.outputs} <= used


def write_record(path, model, knobs):
    path.write_text(json.dumps(tuning_record(OP, model, SHAPE_CLASS, CASE, knobs)) + "\n")


@pytest.mark.parametrize("c_tile", [-3, 48, 32.0, True])
def test_a_record_with_a_knob_outside_the_candidates_is_ignored(tmp_path, model, monkeypatch, caplog, c_tile):
    """Only the values `tune` searches (the schedule file's candidates, of the same type) are
    taken from a record: calls, `build` and `list` alike keep the hand-tuned default."""
    path = tmp_path / "records.jsonl"
    write_record(path, model, dict(OP.schedules["llvm"].defaults, c_tile=c_tile))
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    OP.clear_call_cache()
    with caplog.at_level("WARNING", logger="tvm_ops.records"):
        assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).origin == "hand-tuned"
        assert all(v.origin == "hand-tuned" for v in dispatch.variants(OP, "float32", model))
    assert "ignoring the tuning record" in caplog.text and "not among the schedule file's candidates" in caplog.text
    assert f"'c_tile': {c_tile!r}" in caplog.text
    candidate = tmp_path / "candidate.jsonl"  # a candidate is taken
    write_record(candidate, model, dict(OP.schedules["llvm"].defaults, c_tile=16))
    monkeypatch.setenv("TVM_OPS_RECORDS", str(candidate))
    assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).knobs["c_tile"] == 16


def test_a_record_whose_knobs_the_plan_refuses_is_ignored(tmp_path, model, monkeypatch, caplog):
    """Calls, `build` and `list` alike keep the hand-tuned default (build used to stop on it)."""
    path = tmp_path / "records.jsonl"
    write_record(path, model, dict(OP.schedules["llvm"].defaults, c_tile=16))
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    plan = OP.plan

    def refusing_c_tile_16(target_model, knobs):  # a candidate this target cannot take
        if knobs["c_tile"] == 16:
            raise ValueError("c_tile=16 does not fit this target")
        return plan(target_model, knobs)

    monkeypatch.setattr(OP, "plan", refusing_c_tile_16)
    OP.clear_call_cache()
    with caplog.at_level("WARNING", logger="tvm_ops.records"):
        assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).origin == "hand-tuned"
        assert all(v.origin == "hand-tuned" for v in dispatch.variants(OP, "float32", model))
    assert "ignoring the tuning record" in caplog.text and "c_tile=16 does not fit this target" in caplog.text


def test_a_record_whose_library_does_not_build_falls_back_to_the_hand_tuned_default(
        tmp_path, model, monkeypatch, caplog):
    path = tmp_path / "records.jsonl"
    knobs = dict(OP.schedules["llvm"].defaults, c_tile=16)
    write_record(path, model, knobs)
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    OP.clear_call_cache()
    library = dispatch._library

    def failing_for_records(variant):
        if variant.origin != "hand-tuned":
            raise RuntimeError("LLVM failed")  # a compiler error, a library that does not load
        return library(variant)

    monkeypatch.setattr(dispatch, "_library", failing_for_records)
    inputs, params = call_inputs(16, 16, 64, 512)
    assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).knobs == knobs
    with caplog.at_level("WARNING", logger="tvm_ops.dispatch"):
        out = OP.call(inputs, params, "llvm", {})
    OP.clear_call_cache()
    np.testing.assert_allclose(out, TESTING.reference(inputs, params)["grad_features"], rtol=1e-5, atol=1e-6)
    assert "does not build or load" in caplog.text and "hand-tuned default" in caplog.text


def test_an_operator_with_a_counted_size_is_refused_over_rpc():
    from tvm_ops.errors import NotSupportedError

    op = get("dynamic_scatter_forward")
    case = next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy)
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    problem = checks.check(op.spec, inputs, params, {}, op.rules)
    with pytest.raises(NotSupportedError, match=r"output sizes \(M\) are read on the host"):
        tune.trace_launch(op, problem, op.plan(targets.resolve("llvm"), op.schedules["llvm"].defaults))


def good_record(model, **changes):
    return {**tuning_record(OP, model, SHAPE_CLASS, CASE, dict(OP.schedules["llvm"].defaults)), "median_s": 1e-5,
            **changes}


@pytest.mark.parametrize("bad", [{"median_s": "fast"}, {"median_s": [1]}, {"median_s": float("nan")},
                                 {"status": None}, {"correct": "yes"}, {"case": ["x"]}, {"shape_class": [SHAPE_CLASS]},
                                 {"target": {}}, {"runner": 1},
                                 {"knobs": {**OP.schedules["llvm"].defaults, "c_tile": [32]}}], ids=str)
def test_a_malformed_record_is_skipped_like_a_torn_line(tmp_path, model, bad):
    path = tmp_path / "records.jsonl"
    good = good_record(model, median_s=2e-5)
    malformed = {k: v for k, v in good_record(model, **bad).items() if v is not None}
    path.write_text(json.dumps(malformed) + "\n" + json.dumps(good) + "\n")
    assert records.read(path) == [good]
    assert records.best(OP, "float32", model, SHAPE_CLASS, path) == good


def test_a_record_naming_no_candidate_of_a_choice_knob_is_not_used(tmp_path, model, monkeypatch):
    """dynamic_scatter_forward's `sort` picks the grouping kernels and which workspaces start
    at zero: a value the schedule file does not list would run one plan with the other's
    zero-fills (wrong counts), so such a record is never dispatched to."""
    op = get("dynamic_scatter_forward")
    case = next(c for c in op.spec.cases if c.expect == "ok" and not c.heavy and c.set == "boundary")
    inputs, params = material(op).make_inputs(case, "float32", runner.case_rng(op.name, case.name, "float32"))
    shape_class = records.problem_class(op.spec, checks.check(op.spec, inputs, params, {}, op.rules))
    path = tmp_path / "records.jsonl"
    for value in ("bogus", "Bitonic", 3):
        knobs = dict(op.schedules["llvm"].defaults, sort=value)
        path.write_text(json.dumps(tuning_record(op, model, shape_class, case.name, knobs)) + "\n")
        assert records.best(op, "float32", model, shape_class, path) is None, value
    with pytest.raises(ValueError, match="sort must be one of radix, bitonic"):
        op.plan(model, dict(op.schedules["llvm"].defaults, sort="bogus"))


@pytest.mark.parametrize("knob, value", [("small_radix_bits", 16), ("small_radix_bits", 0), ("tile", 7),
                                         ("tile", 2048), ("small_sort_keys", -1), ("prefetch_points", 4.0),
                                         ("split_min_points", True)])
def test_dynamic_scatter_forward_refuses_numbers_its_buffers_are_not_sized_for(model, knob, value):
    """A Variant may be given any number: a 16-bit digit overran the 14-bit histograms (heap
    corruption, measured), so the plan refuses such knobs."""
    op = get("dynamic_scatter_forward")
    with pytest.raises(ValueError, match=f"{knob} must be"):
        op.plan(model, dict(op.schedules["llvm"].defaults, **{knob: value}))
    assert op.plan(model, dict(op.schedules["llvm"].defaults, small_radix_bits=14, tile=64))["small_radix_bits"] == 14


@pytest.mark.parametrize("where", ["a folder", "a fifo", "not utf-8"])
def test_records_that_cannot_be_read_leave_the_calls_on_the_defaults(tmp_path, model, monkeypatch, caplog, where):
    if where == "a folder":
        path = tmp_path
    elif where == "a fifo":  # its read would block until a writer came
        path = tmp_path / "records.fifo"
        os.mkfifo(path)
    else:
        path = tmp_path / "records.jsonl"
        path.write_bytes(bytes(range(256)) * 4)
    monkeypatch.setenv("TVM_OPS_RECORDS", str(path))
    OP.clear_call_cache()
    inputs, params = call_inputs(16, 16, 64, 512)
    with caplog.at_level("WARNING", logger="tvm_ops.records"):
        out = OP.call(inputs, params, "llvm", {})
    OP.clear_call_cache()
    np.testing.assert_allclose(out, TESTING.reference(inputs, params)["grad_features"], rtol=1e-5, atol=1e-6)
    assert dispatch.default_variant(OP, "float32", model, SHAPE_CLASS).origin == "hand-tuned"
    if where != "not utf-8":
        assert "cannot read the tuning records" in caplog.text
