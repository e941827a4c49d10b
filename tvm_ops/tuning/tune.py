"""Schedule autotuning: search the knobs of schedules/<op>.yaml for one target and shape class.

The search space is the product of the target's knob candidates, walked in a
seeded random order without repetition, the hand-tuned default first (the
baseline). A candidate whose plan() raises (the policy's on-chip budget,
divisibility, ...) is recorded as pruned before anything is built. The others
are built in parallel processes into the library cache, then measured one at a
time. By default (LocalWorker) that happens in a child process, TVM's
PopenWorker (what meta_schedule's LocalRunner measures in), holding the case's
inputs and reference: a candidate that crashes or hangs kills only the child,
which is started again for the next one. The exact library is loaded, run once
on outputs pre-filled with NaN (unwritten elements fail) and checked against
the float64 reference with the spec's thresholds, and only a correct library
is timed (median and interquartile spread of single runs of op.launch on
pre-allocated tensors). Crashes, timeouts and wrong results are recorded as
failed and the run goes on.

With `--rpc-tracker HOST:PORT --rpc-key KEY` (TrackerRunner, RpcHarness) the
measuring moves to a server obtained from TVM's RPC tracker: the library is
uploaded and loaded remotely, the case's inputs are copied to remote tensors,
the kernel calls op.launch makes (traced on the host with tensor placeholders,
see trace_launch) are replayed on them, the result is checked against the
reference, and every call is timed with the remote time_evaluator. A launch
that does anything but call kernels on its tensors and declared workspaces
(host-side views or fills) raises NotSupportedError there.

Records are JSON lines appended as they come (paths.records_path() by
default); a trial whose (op, dtype, target, shape class, knobs) already has a
record is not repeated, so an interrupted run resumes where it stopped.
The shape class (records.shape_class: sizes and parameters bucketed to powers
of two) is what calls dispatch by: dispatch.default_variant() picks the best
correct record of the call's class, else the hand-tuned default.

Records carry "runner": "local" or "rpc:<key>": a resumed run only reuses
records of its own runner, and calls dispatch to local ones only.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import itertools
import json
import logging
import socket
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import bench, build, checks, dispatch, interop, paths, records, runner
from ..errors import BadParamError, ExecutionFailedError, NotSupportedError
from ..invocation import CallPlan, new_tensors, output_specs
from ..targets import TargetModel
from ..testing import material
from ..worker_pool import spawned_pool

log = logging.getLogger(__name__)


def knobs_key(knobs: dict) -> str:
    return json.dumps(knobs, sort_keys=True, default=str)


def record_id(op: str, dtype: str, target: str, shape_class: str, knobs: dict, runner: str = "local") -> str:
    parts = (op, dtype, target, shape_class, knobs_key(knobs)) + (() if runner == "local" else (runner,))
    text = "|".join(parts)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def search_space(op, model: TargetModel, seed: int = 0) -> list[dict]:
    """Every knob combination, the hand-tuned default first, the rest in a seeded random order."""
    sched = op.schedules[model.kind]
    names = list(sched.candidates)
    combos = [dict(zip(names, values)) for values in itertools.product(*(sched.candidates[n] for n in names))]
    default = dict(sched.defaults)
    rest = [c for c in combos if knobs_key(c) != knobs_key(default)]
    order = np.random.default_rng(seed).permutation(len(rest))
    return [default] + [rest[i] for i in order]


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()


def _build_one(op_name: str, dtype: str, model: TargetModel, knobs: dict, origin: str, one_core: bool,
               out_dir: str) -> str:
    """Build (or find in the cache) one candidate's library; runs in a worker process."""
    return build.build_by_name(op_name, dtype, model, knobs, origin, one_core, out_dir, rebuild=False)[0]


@dataclass
class Prepared:
    """A case's generated host inputs and parameters, checked: what every harness starts from."""

    generated: tuple  # (inputs, params) from the op's testing material
    problem: checks.Problem  # checked on the host tensors
    shape_class: str  # what the records are keyed by (records.shape_class)


def prepare(op, case, dtype: str) -> Prepared:
    inputs, params = material(op).make_inputs(case, dtype, runner.case_rng(op.name, case.name, dtype))
    problem = checks.check(op.spec, inputs, params, {}, op.rules)
    if problem.empty:
        raise BadParamError(f"{op.name}: case {case.name} has no elements: nothing to tune")
    return Prepared((inputs, params), problem, records.problem_class(op.spec, problem))


def find_case(op, name: str | None):
    """The spec case called `name`; None: the op's first network case that runs."""
    if name is None:
        return next(c for c in op.spec.cases if c.set == "network" and c.expect == "ok")
    case = next((c for c in op.spec.cases if c.name == name), None)
    if case is None:
        raise BadParamError(f"{op.name}: no spec case named {name!r}; see `python -m tvm_ops list`")
    return case


def with_shape(op, case, overrides: dict):
    """`case` with some of its sizes replaced (`tune --shape N=8192`); named after the change."""
    if not overrides:
        return case
    unknown = sorted(set(overrides) - set(case.shape))
    if unknown:
        raise BadParamError(f"{op.name}: --shape names {', '.join(unknown)}, but case {case.name} has the sizes "
                            f"{', '.join(case.shape)}")
    for name, size in overrides.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise BadParamError(f"{op.name}: --shape {name} must be a non-negative integer, got {size!r}")
    shape = dict(case.shape, **overrides)
    large = checks.large_tensor(op.spec, shape)  # said before a tensor of the size is made
    if large is not None:
        raise BadParamError(f"{op.name}: --shape makes {large[0]} {checks.LARGE_TENSOR} elements or more; "
                            f"the kernels index in int32")
    suffix = ",".join(f"{k}={v}" for k, v in overrides.items())
    return dataclasses.replace(case, name=f"{case.name}[{suffix}]", shape=shape)


class Harness:
    """One case's inputs, reference and pre-allocated tensors; runs any library of the op on them."""

    def __init__(self, op, case, dtype: str, model: TargetModel, prepared: Prepared | None = None):
        self.op, self.model, self.dtype = op, model, dtype
        inputs, params = (prepared or prepare(op, case, dtype)).generated
        on_target = runner.to_target(model, inputs)
        problem = checks.check(op.spec, on_target, params, {}, op.rules)
        # kernel-ready inputs and pre-allocated outputs, run as a call with out= (CallPlan)
        self.inputs = {name: interop.contiguous(info) for name, info in problem.inputs.items()}
        # outputs of a counted size (data-dependent) take the case's: its inputs are made to have it
        sizes = dict(problem.sizes, **{s: case.shape[s] for s in op.spec.counted})
        self.results = new_tensors(problem, output_specs(op, problem, sizes), zero=True)
        self.problem = checks.check(op.spec, self.inputs, params, self.results, op.rules)
        self._plan = None  # the CallPlan of the kernels run last
        self.reference = material(op).reference(inputs, params)
        self.sync = None
        if model.kind == "cuda":
            import torch

            self.sync = torch.cuda.synchronize

    def run(self, kernels: build.Kernels) -> None:
        if self._plan is None or self._plan.kernels is not kernels:
            self._plan = CallPlan(self.op, self.problem, kernels)
        self._plan.run(self.inputs, self.results)
        if self.sync is not None:
            self.sync()

    def check(self, kernels: dict) -> str:
        """Run once on poisoned outputs; '' when every output passes the spec thresholds, else why not."""
        for value in self.results.values():
            if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
                value.fill(np.nan)  # a kernel that leaves elements unwritten fails
        self.run(kernels)
        return "; ".join(runner.compare(self.op, self.dtype, self.results, self.reference)[1])

    def time(self, kernels: dict, repeat: int, budget_s: float) -> tuple[float, float]:
        """(median, interquartile spread) in seconds of single runs, at most ~budget_s in all."""
        # warm up (thread pool, page faults, caches) for 3 runs and at least 0.2 s
        warm, runs, start = 0.0, 0, time.perf_counter()
        while runs < 3 or time.perf_counter() - start < min(0.2, budget_s / 4):
            warm = bench.single_calls_median(lambda: self.run(kernels), 1)
            runs += 1
        n = max(3, min(repeat, int(budget_s / max(warm, 1e-9))))
        times = [bench.single_calls_median(lambda: self.run(kernels), 1) for _ in range(n)]
        q1, _, q3 = statistics.quantiles(times, n=4)
        return statistics.median(times), q3 - q1


class _Ref:
    """A placeholder for one of launch's tensors while its kernel calls are traced."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"<tensor {self.name}>"


def trace_launch(op, problem: checks.Problem, plan: dict) -> list[tuple[str, tuple]]:
    """[(kernel name, args)] that op.launch makes on `problem`; an arg is a _Ref or a scalar.

    Raises NotSupportedError when launch does anything but call kernels with its given
    tensors (inputs, outputs, declared workspaces) and scalars: reshaped views, host-side
    fills, workspaces it allocates itself.
    """
    if op.spec.counted:
        raise NotSupportedError(f"{op.name}: launch cannot run over RPC: the output sizes "
                                f"({', '.join(op.spec.counted)}) are read on the host between its kernels")
    calls = []

    def recorder(name):
        def call(*args):
            for a in args:
                if not isinstance(a, (_Ref, int, float, np.integer, np.floating)) or isinstance(a, bool):
                    raise NotSupportedError(f"kernel {name} gets a host-side {type(a).__name__}")
            calls.append((name, args))
        return call

    names = list(problem.inputs) + [t.name for t in op.spec.outputs] + list(op.workspaces(problem, plan))
    tensors = {name: _Ref(name) for name in names}
    recorders = build.Kernels({name: recorder(name) for name in op.kernel_names})
    recorders.plan = plan
    try:
        op.launch(recorders, problem, tensors)
    except NotSupportedError as exc:
        raise NotSupportedError(f"{op.name}: launch cannot run over RPC on this case ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - launch touched a placeholder as a host tensor
        raise NotSupportedError(f"{op.name}: launch cannot run over RPC on this case: it needs host-side "
                                f"tensors ({type(exc).__name__}: {exc})") from None
    if not calls:
        raise NotSupportedError(f"{op.name}: launch runs no kernel on this case; nothing to measure over RPC")
    return calls


def _worker_setup(op_name: str, case, dtype: str, model: TargetModel) -> None:
    """In a LocalWorker's process: generate the case (the same seeded inputs) and its reference."""
    from ..ops import get

    global _WORKER_HARNESS
    _WORKER_HARNESS = Harness(get(op_name), case, dtype, model)


def _worker_measure(entry: str, repeat: int, budget_s: float) -> tuple[str, float, float]:
    harness = _WORKER_HARNESS
    kernels = build.load(Path(entry), harness.op)
    problems = harness.check(kernels)
    if problems:
        return problems, 0.0, 0.0
    return ("", *harness.time(kernels, repeat, budget_s))


_WORKER_HARNESS = None


class LocalWorker:
    """The default: candidates are measured in a child process, TVM's PopenWorker (the process
    meta_schedule's LocalRunner measures in), which holds the case's inputs and reference.

    A candidate that crashes (a segfault, an abort in a kernel) or hangs past the timeout
    takes down only the child: the tuner records it as failed and the next candidate gets a
    fresh child, set up again from the same seeded case."""

    name = "local"

    def __init__(self, op, case, dtype: str, model: TargetModel, timeout: float):
        from tvm.support.popen_pool import PopenWorker

        self.timeout = timeout
        self.worker = PopenWorker(initializer=_worker_setup, initargs=(op.name, case, dtype, model))

    def measure(self, entry: Path, repeat: int) -> tuple[str, float, float]:
        """('' or why the result is wrong, median s, interquartile spread s) of one library."""
        budget = min(self.timeout, 10.0)
        self.worker.send(_worker_measure, (str(entry), repeat, budget), timeout=self.timeout + budget)
        try:
            return self.worker.recv()
        except ChildProcessError:
            self.worker.kill()
            raise ChildProcessError("the candidate crashed the measuring process") from None
        except TimeoutError:
            self.worker.kill()
            raise TimeoutError(f"the candidate ran past {self.timeout + budget:g} s") from None

    def close(self) -> None:
        self.worker.kill()


class TrackerRunner:
    """Measures on a server that TVM's RPC tracker at HOST:PORT hands out for `key` (a remote board)."""

    def __init__(self, tracker: str, key: str, timeout: float = 60.0):
        host, _, port = tracker.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536 or not key:
            raise BadParamError(f"--rpc-tracker wants HOST:PORT (a port 1-65535) and --rpc-key a key, "
                                f"got {tracker!r} / {key!r}")
        self.host, self.port, self.key, self.timeout = host, int(port), key, timeout
        self.name = f"rpc:{key}"
        self.sess = None

    def session(self):
        """The current remote session, requested from the tracker on first use (or after a failure)."""
        if self.sess is None:
            from tvm import rpc

            try:  # TVM's own connect retries a refused tracker for 60 s whatever the timeout
                socket.create_connection((self.host, self.port), timeout=min(self.timeout, 30.0)).close()
                tracker = rpc.connect_tracker(self.host, self.port)
            except (OSError, RuntimeError) as exc:
                raise ExecutionFailedError(f"cannot reach the RPC tracker {self.host}:{self.port} ({exc})") from exc
            deadline = time.monotonic() + min(self.timeout, 30.0)
            while self.key not in tracker.summary().get("queue_info", {}):
                if time.monotonic() > deadline:
                    raise NotSupportedError(f"the RPC tracker {self.host}:{self.port} has no server with "
                                            f"key {self.key!r}")
                time.sleep(0.2)
            sock = getattr(tracker, "_sock", None)
            if sock is not None:
                sock.settimeout(self.timeout)  # a busy server: fail instead of waiting forever
            self.sess = tracker.request(self.key, priority=1, session_timeout=0, max_retry=2)
        return self.sess

    def drop(self) -> None:
        self.sess = None


class RpcHarness:
    """One case's host inputs and reference, and the kernel calls of launch to replay remotely."""

    def __init__(self, op, case, dtype: str, model: TargetModel, rpc: TrackerRunner,
                 prepared: Prepared | None = None):
        self.op, self.model, self.dtype, self.rpc = op, model, dtype, rpc
        prepared = prepared or prepare(op, case, dtype)
        (inputs, params), problem = prepared.generated, prepared.problem
        if model.kind == "cuda":  # launch takes its device path; tensors stay placeholders
            problem = dataclasses.replace(problem, kind="torch", device="cuda", where="cuda")
        self.problem = problem
        trace_launch(op, problem, op.plan(model, op.schedules[model.kind].defaults))  # replayable at all?
        self.host = {name: np.ascontiguousarray(interop.contiguous(info)) for name, info in problem.inputs.items()}
        self.outputs = {}
        for t in op.spec.outputs:
            shape = checks.output_shape(op.spec, t.name, problem.sizes)
            self.outputs[t.name] = np.zeros(shape, op.output_dtype(t, problem))
        self.reference = material(op).reference(inputs, params)
        self.remote, self.remote_sess, self.uploads = None, None, 0
        rpc.session()  # no tracker or no server for the key: fail before any build

    def _device(self, sess):
        return sess.cuda() if self.model.kind == "cuda" else sess.cpu()

    def measure(self, entry: Path, repeat: int) -> tuple[str, float, float]:
        """('' or why the result is wrong, median s, interquartile spread s) of one library, remotely."""
        import tvm

        sess = self.rpc.session()
        dev = self._device(sess)
        if self.remote_sess is not sess:  # inputs are copied once per session
            self.remote = {k: tvm.runtime.tensor(v, dev) for k, v in self.host.items()}
            self.remote.update({k: tvm.runtime.tensor(v, dev) for k, v in self.outputs.items()})
            self.remote_sess = sess
        plan = build.manifest(entry)["plan"]
        calls = trace_launch(self.op, self.problem, plan)  # the knobs may choose the kernels
        for name, (shape, dtype) in self.op.workspaces(self.problem, plan).items():
            if name not in self.remote or tuple(self.remote[name].shape) != tuple(shape):
                self.remote[name] = tvm.runtime.empty(shape, dtype, dev)
        # a fresh name per upload: overwriting a library the server has loaded would crash it
        self.uploads += 1
        name = f"{entry.name}-{self.uploads}.so"
        sess.upload(str(entry / "lib.so"), target=name)
        lib = sess.load_module(name)
        zeroed = self.op.zeroed(self.problem, plan)
        for out_name, value in self.outputs.items():  # poisoned outputs: unwritten elements fail
            fill = np.nan if np.issubdtype(value.dtype, np.floating) else 0
            self.remote[out_name].copyfrom(np.full(value.shape, fill, value.dtype))
        for name in zeroed:  # what the kernels accumulate into starts at zero, as in a call
            tensor = self.remote[name]
            tensor.copyfrom(np.zeros(tuple(tensor.shape), tensor.dtype))
        args = [(kernel, [self.remote[a.name] if isinstance(a, _Ref) else a for a in call_args])
                for kernel, call_args in calls]
        for kernel, call_args in args:
            lib[kernel](*call_args)
        dev.sync()
        remote_results = {t.name: self.remote[t.name].numpy() for t in self.op.spec.outputs}
        problems = runner.compare(self.op, self.dtype, remote_results, self.reference)[1]
        if problems:
            return "; ".join(problems), 0.0, 0.0
        n = max(3, repeat)
        total = np.zeros(n)
        for kernel, call_args in args:  # one remote evaluator per kernel call, summed run by run
            # the first repeat wakes the server's thread pool and caches: dropped
            evaluator = lib.time_evaluator(kernel, dev, number=1, repeat=n + 1)
            total += np.asarray(evaluator(*call_args).results, dtype=np.float64)[1:n + 1]
        times = list(total)
        q1, _, q3 = statistics.quantiles(times, n=4)
        return "", statistics.median(times), q3 - q1


@dataclass
class TuneResult:
    records_path: Path
    shape_class: str = ""
    records: list = field(default_factory=list)  # this space's records (new and resumed), in trial order
    new: int = 0  # trials run by this call
    baseline: dict | None = None
    best: dict | None = None


def _best(records: list) -> dict | None:
    ok = [r for r in records if r["status"] == "ok" and r["correct"]]
    return min(ok, key=lambda r: r["median_s"]) if ok else None


def tune(op, dtype: str, model: TargetModel, case, trials: int = 16, records_path: Path | None = None,
         timeout: float = 60.0, repeat: int = 10, workers: int = 2, seed: int = 0, progress: bool = False,
         batch: int = 4, rpc: TrackerRunner | None = None) -> TuneResult:
    """Tune `op`'s knobs for (dtype, model) on spec case `case` (a spec.Case or its name).

    Candidates are measured in a LocalWorker process, or with `rpc` (a TrackerRunner)
    on a server from TVM's RPC tracker.
    """
    import tvm

    if isinstance(case, str):
        case = find_case(op, case)
    prepared = prepare(op, case, dtype)
    path = Path(records_path) if records_path else paths.records_path()
    runner_name = rpc.name if rpc is not None else LocalWorker.name
    head = {"op": op.name, "dtype": dtype, "target": model.key, "shape_class": prepared.shape_class}
    done = {knobs_key(r["knobs"]): r for r in records.read(path)
            if all(r.get(k) == v for k, v in head.items()) and r.get("runner", "local") == runner_name}
    head.update(runner=runner_name, case=case.name, sizes=dict(prepared.problem.sizes))
    result = TuneResult(path, prepared.shape_class)

    # Walk the space: resumed trials count, pruned ones are recorded but do not use the budget.
    todo = []
    for knobs in search_space(op, model, seed):
        if len(todo) + sum(1 for r in result.records if r["status"] != "pruned") >= trials:
            break
        key = knobs_key(knobs)
        if key in done:
            result.records.append(done[key])
            continue
        rid = record_id(op.name, dtype, model.key, prepared.shape_class, knobs, runner_name)
        record = dict(head, id=rid, knobs=knobs, median_s=None, spread_s=None, correct=False, status="pruned",
                      error="", tvm_version=tvm.__version__, timestamp=None)
        try:
            op.plan(model, knobs)
        except Exception as exc:  # noqa: BLE001 - the policy's reason is the record's
            record.update(error=f"{type(exc).__name__}: {exc}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            append_record(path, record)
            result.records.append(record)
            result.new += 1
            continue
        todo.append(record)
    result.baseline = next((r for r in result.records if knobs_key(r["knobs"]) == knobs_key(op.schedules[
        model.kind].defaults)), None)
    result.best = _best(result.records)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo) + sum(1 for r in result.records if r["status"] != "pruned"),
                   initial=sum(1 for r in result.records if r["status"] != "pruned"), unit="trial",
                   desc=f"{op.name} {case.name}")
        _postfix(bar, result)

    harness = None
    if todo:
        harness = (RpcHarness(op, case, dtype, model, rpc, prepared) if rpc is not None
                   else LocalWorker(op, case, dtype, model, timeout))
    cache = paths.cache_dir()
    one_core = dispatch.runs_on_one_core(op, prepared.problem, model)  # as the call path builds them
    pool = None
    if workers > 1 and len(todo) > 1:
        pool = spawned_pool(workers)
    try:
        for start in range(0, len(todo), max(batch, workers)):
            chunk = todo[start:start + max(batch, workers)]
            # build the chunk (in parallel), then measure it sequentially with the cores otherwise idle
            builds = []
            for record in chunk:
                args = (op.name, dtype, model, record["knobs"], f"tuned:{record['id']}", one_core, str(cache))
                builds.append(pool.submit(_build_one, *args) if pool else args)
            # every build of the chunk finishes before the first timing: a build still running
            # on the other core would slow the candidates timed early (the baseline first)
            cf.wait([job for job in builds if isinstance(job, cf.Future)], timeout=timeout)
            for record, job in zip(chunk, builds):
                _measure(op, dtype, model, harness, record, job, timeout, repeat)
                append_record(path, record)
                result.records.append(record)
                result.new += 1
                if knobs_key(record["knobs"]) == knobs_key(op.schedules[model.kind].defaults):
                    result.baseline = record
                result.best = _best(result.records)
                if bar is not None:
                    bar.update(1)
                    _postfix(bar, result)
    finally:
        if isinstance(harness, LocalWorker):
            harness.close()
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    return result


def _measure(op, dtype, model, harness, record, job, timeout, repeat) -> None:
    """Build (or await the build of) one candidate, then check and time it with `harness`."""
    record["status"] = "failed"
    try:
        entry = Path(job.result(timeout=timeout) if isinstance(job, cf.Future) else _build_one(*job))
        try:
            problems, median, spread = harness.measure(entry, repeat)
        except Exception:
            if isinstance(harness, RpcHarness):
                harness.rpc.drop()  # the server may have died with the candidate: ask for a fresh one
            raise
        if problems:
            record["error"] = f"wrong result: {problems}"
        else:
            record.update(correct=True, median_s=median, spread_s=spread, status="ok")
    except cf.TimeoutError:
        record["error"] = f"build did not finish in {timeout:g} s"
    except Exception as exc:  # noqa: BLE001 - a crashing candidate is recorded and skipped
        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    record["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _postfix(bar, result: TuneResult) -> None:
    best = f"{result.best['median_s'] * 1e3:.3f} ms" if result.best else "-"
    base = (f"{result.baseline['median_s'] * 1e3:.3f} ms" if result.baseline and result.baseline["median_s"]
            else "-")
    bar.set_postfix_str(f"best {best}, hand-tuned {base}")


def table(result: TuneResult) -> str:
    """The final table: every trial of the space, fastest correct first."""
    base = result.baseline["median_s"] if result.baseline and result.baseline["median_s"] else None
    rows = sorted(result.records, key=lambda r: (r["status"] != "ok", r["median_s"] or 0))
    lines = [f"{'status':8s} {'median':>10s} {'spread':>9s} {'vs hand':>8s}  knobs"]
    for r in rows:
        median = f"{r['median_s'] * 1e3:7.3f} ms" if r["median_s"] else f"{'-':>10s}"
        spread = f"{r['spread_s'] * 1e3:6.3f} ms" if r["spread_s"] is not None else f"{'-':>9s}"
        ratio = f"x{base / r['median_s']:6.2f}" if base and r["median_s"] else f"{'-':>8s}"
        knobs = " ".join(f"{k}={v}" for k, v in r["knobs"].items())
        mark = "  (hand-tuned)" if result.baseline is r else ""
        error = f"  [{r['error'][:100]}]" if r["error"] else ""
        lines.append(f"{r['status']:8s} {median} {spread} {ratio:>8s}  {knobs}{mark}{error}")
    return "\n".join(lines)
