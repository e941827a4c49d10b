"""TVM's own auto-scheduler (meta_schedule) as a baseline for the hand-tuned schedules.

For one spec case (fixed shapes) `compare` measures TVM's auto-scheduler against the hand schedules:

1. runs the op once with the hand-tuned kernels, recording every kernel call's
   arguments (copies of the arrays it received, scalars by value): these give each
   kernel's concrete shapes and real data (valid indices, workspaces that earlier
   kernels filled);
2. specialises each called kernel's PrimFunc from `op.computes` (the compute at the
   hand-tuned plan, before the schedule recipe) to those shapes and scalars;
3. tunes it with `tvm.s_tir.meta_schedule` for the same TVM target the library is
   built for, `trials` measured candidates per kernel, the candidates measured by
   TVM's LocalRunner on the recorded arguments (random data would send scatter
   indices out of bounds);
4. compiles the best schedule per kernel and runs the whole op with those kernels
   in place of the hand-tuned ones (launch calls kernels by name, so a dict of
   callables does), checks the outputs against the float64 reference with the
   spec's thresholds, and times it against the hand-tuned default (and the best
   tuning record of the case's shape class, if any) in the same process,
   interleaved.

A kernel meta_schedule cannot handle (no candidate sampled, every candidate failed
to build or run, a wrong result) keeps its hand-tuned kernel; the result says which
kernels are meta-scheduled and why the others are not.

Two deliberate departures from meta_schedule's defaults, both stated in the output:
- the DisallowDynamicLoop postprocessor is dropped: every compute here guards its
  tail with loops like `range(T.min(m_tile, M - vmb * m_tile))`, whose extent
  depends on a block iterator even at fixed shapes, so with it no candidate is ever
  sampled. The LLVM build handles those loops (the hand-tuned kernels have them);
- the cost model is "random" (xgboost is not a dependency; with budgets of 8-32
  trials a learned model has nothing to learn from anyway).

Tuning runs in a child process: meta_schedule's runner worker and its logging stay
there, and the timings in this process are not disturbed by leftover workers (on a
2-core machine, tuning workers left in the timing process distort its timings). Candidates are built in that child with meta_schedule's own build
function (LocalBuilder's fresh worker per batch costs 1-2 minutes here) and measured
by TVM's LocalRunner in a worker process. Both configurations are timed on 64-byte
aligned copies of the case's tensors (see align_tensors).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import inspect
import json
import logging
import pickle
import re
import shutil
import statistics
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import build, dispatch, host_buffers, paths
from ..errors import BadParamError, NotSupportedError
from ..targets import TargetModel
from ..worker_pool import spawned_pool
from . import tune

log = logging.getLogger(__name__)
HAND_TUNED, META_SCHEDULE = "hand-tuned", "meta_schedule"


def available() -> str:
    """'' when meta_schedule can run here, else why not (a missing dependency)."""
    try:
        import cloudpickle  # noqa: F401 - meta_schedule's worker pools need both
        import psutil  # noqa: F401
        from tvm.s_tir import meta_schedule  # noqa: F401
    except ImportError as exc:
        return f"meta_schedule is not usable: {exc}"
    return ""


@dataclass
class KernelResult:
    name: str
    used: str = HAND_TUNED  # which kernel the op ran with: META_SCHEDULE or HAND_TUNED
    reason: str = ""  # why meta_schedule's kernel is not used ('' when it is)
    measured: int = 0  # candidates meta_schedule built and ran successfully
    failed: int = 0  # candidates that failed to build or run
    ms_best_s: float | None = None  # meta_schedule's own measurement of its best candidate
    tune_s: float = 0.0  # wall time of this kernel's tuning
    schedule: str = ""  # the best trace's primitives, e.g. "parallel=32 vectorize=64 unroll=16"


@dataclass
class Comparison:
    op: str
    case: str
    dtype: str
    target: str
    trials: int  # measured candidates allowed per kernel
    kernels: list = field(default_factory=list)  # KernelResult per kernel the case calls
    times: dict = field(default_factory=dict)  # configuration -> (median s, spread s)
    check: str = ""  # '' when the meta_schedule configuration passed the reference check
    tune_wall_s: float = 0.0

    @property
    def ms_kernels(self) -> list[str]:
        return [k.name for k in self.kernels if k.used == META_SCHEDULE]

    def lines(self) -> list[str]:
        out = [f"meta_schedule vs hand-tuned: {self.op} {self.case} {self.dtype} {self.target}, "
               f"{self.trials} trials per kernel (random cost model, DisallowDynamicLoop dropped), "
               f"tuning wall {self.tune_wall_s:.1f} s"]
        for k in self.kernels:
            best = f"{k.ms_best_s * 1e3:.3f} ms" if k.ms_best_s is not None else "-"
            head = (f"  kernel {k.name}: {k.used}; {k.measured} candidates measured, {k.failed} failed, "
                    f"best {best} (meta_schedule's runner), tuned in {k.tune_s:.1f} s")
            out.append(head + (f"; schedule: {k.schedule}" if k.schedule else ""))
            if k.reason:
                out.append(f"    {'note' if k.used == META_SCHEDULE else 'not used'}: {k.reason}")
        hand = self.times.get(HAND_TUNED)
        for name, (median, spread) in self.times.items():
            ratio = f"  hand-tuned/this x{hand[0] / median:.2f}" if hand and name != HAND_TUNED else ""
            out.append(f"  {name:28s} {median * 1e3:9.3f} ms  (spread {spread * 1e3:.3f} ms){ratio}")
        uses = self.ms_kernels
        rest = [k.name for k in self.kernels if k.used != META_SCHEDULE]
        out.append(f"  meta_schedule on kernels {', '.join(uses) or '(none)'}; hand-tuned {', '.join(rest) or '(none)'}")
        out.append(f"  outputs of the meta_schedule configuration: "
                   f"{'pass (float64 reference, spec thresholds)' if not self.check else 'FAIL: ' + self.check}")
        return out


# --- recording the calls of one launch --------------------------------------------------------

def record_calls(harness: tune.Harness, kernels: dict) -> dict:
    """{kernel name: [args of its first call]} of one launch, arrays copied before the call."""
    calls: dict = {}

    def recorder(name):
        real = kernels[name]

        def call(*args):
            snapshot = []
            for a in args:
                if isinstance(a, np.ndarray) or _host_tvm_tensor(a):
                    snapshot.append(np.array(np.from_dlpack(a), copy=True))
                elif isinstance(a, (int, float, np.integer, np.floating)) and not isinstance(a, bool):
                    snapshot.append(a.item() if isinstance(a, np.generic) else a)
                else:
                    raise NotSupportedError(f"kernel {name} gets a {type(a).__name__}; only numpy arrays "
                                            f"and scalars can be recorded (CPU targets)")
            if name not in calls:
                calls[name] = snapshot
            elif not _same_signature(calls[name], snapshot):
                calls[name] = None  # one specialisation cannot serve calls of different shapes
            real(*args)
        return call

    harness.run(_swap(kernels, {name: recorder(name) for name in kernels}))
    return calls


def _host_tvm_tensor(value) -> bool:
    """Whether `value` is a TVM tensor in host memory (a call plan's reused workspaces that only
    kernels take, invocation.CallPlan): recorded as a numpy copy like the arrays."""
    import tvm_ffi

    return isinstance(value, tvm_ffi.Tensor) and value.__dlpack_device__()[0] == 1  # kDLCPU


def _swap(kernels: dict, replacements: dict) -> dict:
    """A copy of a library's kernels (build.Kernels: a dict with the plan launch reads) with some replaced."""
    if hasattr(kernels, "like"):
        return kernels.like({**kernels, **replacements})
    return {**kernels, **replacements}


def align_tensors(harness: tune.Harness) -> None:
    """Replace the harness's numpy tensors by copies that start on a cache line (64 bytes).

    TVM declares every buffer parameter 64-byte aligned; numpy's large arrays are only
    16-byte aligned. meta_schedule vectorises parameter buffers (e.g. dynamic_scatter's
    max_init: parallel x vectorize 64 over the workspace), and LLVM's aligned vector
    moves then fault on numpy data, so both configurations run on aligned copies.
    """
    for tensors in (harness.inputs, harness.results):  # workspaces are allocated line-aligned
        for name, value in list(tensors.items()):
            tensors[name] = host_buffers.line_aligned(value)


def _same_signature(a: list, b: list) -> bool:
    def sig(args):
        return [(x.shape, x.dtype.str) if isinstance(x, np.ndarray) else x for x in args]
    return sig(a) == sig(b)


def specialise(func, args: list):
    """`func` with every buffer bound to its argument's concrete shape and every scalar to its value."""
    import tvm

    if len(func.params) != len(args):
        raise BadParamError(f"kernel takes {len(func.params)} arguments, the launch passed {len(args)}")
    binds = {}
    for param, arg in zip(func.params, args):
        if not isinstance(arg, np.ndarray):
            binds[param] = tvm.tirx.const(arg, str(param.ty.dtype))  # a scalar param: PrimType
            continue
        # specialize binds plain variables only: a dim like 4 * C is passed on as the very same
        # expression, and becomes a constant once C is bound by another buffer
        shape = [n if isinstance(d, (tvm.tirx.Var, tvm.tirx.IntImm)) else d for n, d in zip(arg.shape, param.ty.shape)]
        # the kernel's own alignment claim (element-aligned kernels take any numpy view)
        binds[param] = tvm.tirx.decl_buffer(shape, str(arg.dtype), name=str(param),
                                            data_alignment=param.ty.data_alignment)
    fixed = func.specialize(binds)
    free = sorted({str(d) for p in fixed.params if hasattr(p.ty, "shape") for d in p.ty.shape
                   if not isinstance(d, tvm.tirx.IntImm)})
    if free:
        raise BadParamError(f"sizes {', '.join(free)} stay symbolic after binding the arguments' shapes")
    return fixed


def _plain_compute(op, dtype: str, model: TargetModel, kernel: str):
    """The kernel's compute (no schedule recipe) at the hand-tuned plan."""
    plan = op.plan(model, dict(op.schedules[model.kind].defaults))
    return build.parsed_computes(op, dtype, plan, model)[kernel]


# --- the tuning, in a child process ----------------------------------------------------------

def _import_tensor_intrin() -> None:
    """Import tvm.s_tir.tensor_intrin (TuneContext does) with inspect.getmodule memoised for frames.

    The module parses ~500 TVMScript functions, each parse calling inspect.stack() from
    inside import frames; their '<frozen importlib>' file names make inspect.getmodule
    rescan sys.modules every time: 75-110 s on this 2-core machine, 4 s memoised.
    The original getmodule is restored before returning.
    """
    original, memo = inspect.getmodule, {}

    def getmodule(obj, _filename=None):
        if _filename is not None and isinstance(obj, (types.FrameType, types.CodeType)):
            if _filename not in memo:
                memo[_filename] = original(obj, _filename)
            return memo[_filename]
        return original(obj, _filename)

    inspect.getmodule = getmodule
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.getmodule = original


def _alloc_recorded(pointer: str, device, args_info, alloc_repeat: int) -> list:
    """meta_schedule's f_alloc_argument: the recorded arrays of the kernel being tuned.

    Runs in the runner's worker process, which serves every kernel in turn: `pointer` is
    a file naming the current kernel's args.pkl.
    """
    import tvm

    with open(Path(pointer).read_text(), "rb") as f:
        arrays = [a for a in pickle.load(f) if isinstance(a, np.ndarray)]
    if [tuple(a.shape) for a in arrays] != [tuple(info[2]) for info in args_info]:
        raise ValueError(f"recorded shapes {[a.shape for a in arrays]} do not match {args_info}")
    return [[tvm.runtime.tensor(a, device) for a in arrays] for _ in range(alloc_repeat)]


def _postprocs():
    from tvm.s_tir import meta_schedule as ms

    return [p for p in ms.postproc.Postproc.create("llvm") if type(p).__name__ != "DisallowDynamicLoop"]


def _in_process_builder():
    """meta_schedule's own build and export functions, run in this (the child) process.

    LocalBuilder starts a fresh worker process for every batch, and each worker imports
    tvm.s_tir.tensor_intrin without the memoisation above: 1-2 minutes per batch here.
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    @derived_object
    class InProcessBuilder(ms.builder.PyBuilder):
        def build(self, build_inputs):
            results = []
            for given in build_inputs:
                try:
                    path = default_export(default_build(given.mod, given.target, None))
                    results.append(ms.builder.BuilderResult(path, None))
                except Exception as exc:  # noqa: BLE001 - a failed build is a failed trial
                    results.append(ms.builder.BuilderResult(None, f"build failed: {type(exc).__name__}: {exc}"))
            return results

    return InProcessBuilder()


def _tune_kernel(op, model: TargetModel, dtype: str, kernel: str, args_path: str, work_dir: str, trials: int,
                 seed: int, builder, runner) -> dict:
    """Tune one kernel (in the child process); counts, timings and why nothing came out."""
    from tvm.s_tir import meta_schedule as ms

    with open(args_path, "rb") as f:
        func = specialise(_plain_compute(op, dtype, model, kernel), pickle.load(f))
    start = time.perf_counter()
    out = {"error": "", "measured": 0, "failed": 0, "best_s": None}
    try:
        db = ms.tune_tir(func, model.tvm_target(), work_dir, max_trials_global=trials,
                         num_trials_per_iter=min(trials, 16), builder=builder, runner=runner,
                         space=ms.space_generator.PostOrderApply(postprocs=_postprocs()),
                         cost_model="random", seed=seed, num_tuning_cores=model.cores)
        for record in db.get_all_tuning_records():
            secs = [float(s) for s in (record.run_secs or [])]
            if secs and max(secs) < 1e9:  # meta_schedule stores 1e10 for a failed run
                out["measured"] += 1
                best = statistics.median(secs)
                out["best_s"] = best if out["best_s"] is None else min(out["best_s"], best)
            else:
                out["failed"] += 1
        if out["measured"] == 0:
            out["error"] = _why_nothing(Path(work_dir))
    except Exception as exc:  # noqa: BLE001 - the reason is the result
        out["error"] = _short(f"{type(exc).__name__}: {exc}")
    out["tune_s"] = time.perf_counter() - start
    return out


def _tune_all(op_name: str, dtype: str, jobs: list, trials: int, seed: int, timeout: float,
              pointer: str) -> dict:
    """{kernel: _tune_kernel's result} for [(kernel, args_path, work_dir)]; the child's entry point."""
    from tvm.s_tir import meta_schedule as ms

    from .. import targets
    from ..ops import get

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # the log files keep DEBUG
    _import_tensor_intrin()
    builder = _in_process_builder()
    runner = ms.runner.LocalRunner(  # one measuring worker process for all kernels
        timeout_sec=timeout, evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=20),
        f_alloc_argument=functools.partial(_alloc_recorded, pointer))
    op, model, results = get(op_name), targets.host_cpu(), {}
    with open(Path(pointer).parent / "tuning.log", "a") as log_file, contextlib.redirect_stdout(log_file):
        for kernel, args_path, work_dir in jobs:  # meta_schedule's progress tables go to tuning.log
            Path(pointer).write_text(args_path)
            results[kernel] = _tune_kernel(op, model, dtype, kernel, args_path, work_dir, trials, seed,
                                           builder, runner)
    return results


def _earlier_result(folder: Path, args: list, trials: int) -> dict | None:
    """A kernel's tuning result from an earlier run with the same arguments and trials, else None."""
    try:
        earlier = json.loads((folder / "result.json").read_text())
        with open(folder / "args.pkl", "rb") as f:
            same = _same_signature(pickle.load(f), args)
    except (OSError, ValueError, pickle.UnpicklingError):
        return None
    return earlier if same and earlier.get("trials") == trials else None


def _why_nothing(work_dir: Path) -> str:
    """The first reason in meta_schedule's task log why no candidate was measured."""
    text = "\n".join(p.read_text(errors="replace") for p in sorted((work_dir / "logs").glob("*task_*.log")))
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Error in building" in line or "Error in running" in line:
            detail = next((x.strip() for x in lines[i + 1:i + 40]
                           if x.strip() and not x.startswith(("#", " ", "@", "class", "\t"))), "")
            trial = re.search(r"Trial #\d+", line)
            where = line.index("Error in")
            return _short(f"{trial[0] + ': ' if trial else ''}{line[where:].strip()} {detail}")
    failures = re.findall(r"Postproc #\d+ \[([\w.]+)\]: (\d+) failure", text)
    worst = max(((int(n), name) for name, n in failures), default=(0, ""))
    if "Cannot sample enough initial population" in text:
        why = f" ({worst[1]} rejected {worst[0]} samples)" if worst[0] else ""
        return "meta_schedule could not sample any candidate" + why
    return "meta_schedule measured no candidate (see its logs in the work directory)"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + " ..."


# --- compiling and comparing -----------------------------------------------------------------

def _candidates(work_dir: Path, limit: int) -> list:
    """The measured tuning records of a kernel's database, fastest first (at most `limit`)."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    timed = []
    for record in db.get_all_tuning_records():
        secs = [float(x) for x in (record.run_secs or [])]
        if secs and max(secs) < 1e9:
            timed.append((statistics.median(secs), len(timed), record))
    return [record for _, _, record in sorted(timed)[:limit]]


def _compile(op, dtype: str, model: TargetModel, kernel: str, args: list, record):
    """(callable taking launch's arguments, schedule summary) of one tuning record's schedule."""
    import tvm

    func = specialise(_plain_compute(op, dtype, model, kernel), args)
    sch = tvm.s_tir.Schedule(func)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    mod = tvm.IRModule({kernel: sch.mod["main"].with_attr("global_symbol", kernel)})
    with tvm.transform.PassContext(opt_level=3):
        fn = tvm.tirx.build(mod, target=model.tvm_target())[kernel]
    tensor_at = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    scalars = {i: a for i, a in enumerate(args) if not isinstance(a, np.ndarray)}

    def call(*given):
        for i, value in scalars.items():  # specialised away: the launch must pass the same values
            if given[i] != value:
                raise NotSupportedError(f"{kernel} was specialised for argument {i} = {value}, got {given[i]}")
        fn(*(given[i] for i in tensor_at))

    return call, _summary(sch.trace)


def _pick(op, dtype, model, harness, hand: dict, k: KernelResult, args: list, work_dir: Path, limit: int):
    """meta_schedule's fastest candidate of kernel k that passes the reference check (others hand-tuned)."""
    wrong = []
    for rank, record in enumerate(_candidates(work_dir, limit)):
        summary = ""
        try:
            call, summary = _compile(op, dtype, model, k.name, args, record)
            problem = harness.check(_swap(hand, {k.name: call}))
        except Exception as exc:  # noqa: BLE001 - recorded per kernel
            problem = f"{type(exc).__name__}: {exc}"
        if not problem:
            k.used, k.schedule = META_SCHEDULE, summary
            if wrong:
                k.reason = _short(f"used candidate #{rank + 1}; faster ones: " + "; ".join(wrong))
            return call
        wrong.append(f"#{rank + 1} ({summary or 'not built'}) wrong result: {problem}")
    k.reason = _short("; ".join(wrong) or "no measured candidate")
    return None


def _summary(trace) -> str:
    """The decisions of a trace that matter for speed, e.g. 'parallel=32 vectorize=64 unroll=16 split x2'."""
    sampled, parts, counts = {}, [], {}
    for line in str(trace).splitlines():
        found = re.match(r"\s*(\w+) = sch\.sample_categorical\(candidates=\[([^\]]*)\].*decision=(\d+)", line)
        if found:
            sampled[found[1]] = found[2].split(",")[int(found[3])].strip()
            continue
        found = re.search(r'sch\.annotate\(.*ann_key="meta_schedule\.(\w+)", ann_val=(\w+)', line)
        if found:
            key = found[1].replace("unroll_explicit", "unroll")
            parts.append(f"{key}={sampled.get(found[2], found[2])}")
            continue
        found = re.search(r"sch\.(\w+)\(", line)
        if found and not found[1].startswith(("get_", "sample_", "enter_postproc")):
            counts[found[1]] = counts.get(found[1], 0) + 1
    return " ".join(parts + [f"{k} x{n}" if n > 1 else k for k, n in counts.items()]) or "(unchanged)"


def _median_rounds(configs: dict, rounds: int, repeat: int, budget_s: float) -> dict:
    """{name: (median of round medians, median spread)} of {name: (harness, kernels)}, interleaved."""
    per = {name: [] for name in configs}
    for _ in range(rounds):
        for name, (harness, kernels) in configs.items():
            per[name].append(harness.time(kernels, repeat, budget_s))
    return {name: (statistics.median(m for m, _ in got), statistics.median(s for _, s in got))
            for name, got in per.items()}


def _load_variant(variant: build.Variant) -> dict:
    return build.load(build.find_or_build(variant), variant.op)


def compare(op, case, dtype: str = "float32", model: TargetModel | None = None, trials: int = 16,
            work_dir: Path | str | None = None, seed: int = 0, timeout: float = 120.0, rounds: int = 3,
            repeat: int = 10, budget_s: float = 1.0, candidates: int = 5, reuse: bool = False) -> Comparison:
    """meta_schedule (`trials` measured candidates per kernel) against the hand-tuned default on one case.

    `case` is a spec.Case or its name; `work_dir` keeps meta_schedule's databases and logs
    (a fresh one per kernel; default: <cache>/meta_schedule/<op>-<case>-<dtype>). A kernel
    uses the fastest of its `candidates` fastest measured schedules that gives correct results.
    `reuse` keeps a kernel's database from an earlier run with the same arguments and trials
    (re-check and re-time without re-tuning).
    """
    from .. import targets

    why = available()
    if why:
        raise NotSupportedError(why)
    model = model or targets.host_cpu()
    if model.kind != "llvm":
        raise NotSupportedError("the meta_schedule comparison runs on CPU (llvm) targets only: its runner "
                                "measures in this machine's processes")
    if trials < 1:
        raise BadParamError(f"trials must be at least 1, got {trials}")
    if isinstance(case, str):
        case = tune.find_case(op, case)
    root = Path(work_dir) if work_dir else paths.cache_dir() / "meta_schedule" / f"{op.name}-{case.name}-{dtype}"
    prepared = tune.prepare(op, case, dtype)
    harness = tune.Harness(op, case, dtype, model, prepared)
    hand = _load_variant(build.Variant(op, dtype, model, dict(op.schedules[model.kind].defaults), HAND_TUNED))
    problem = harness.check(hand)  # also allocates the workspaces of the hand-tuned plan
    if problem:
        raise RuntimeError(f"{op.name} {case.name}: the hand-tuned kernels fail the reference check: {problem}")
    align_tensors(harness)
    calls = record_calls(harness, hand)
    result = Comparison(op.name, case.name, dtype, model.key, trials)

    # tune every kernel the case calls, in one child process
    jobs, tuned = [], {}
    for kernel, args in calls.items():
        k = KernelResult(kernel)
        result.kernels.append(k)
        if args is None:
            k.reason = "called with several argument shapes in one launch; one specialisation cannot serve them"
            continue
        folder = root / kernel
        earlier = _earlier_result(folder, args, trials) if reuse else None
        if earlier is not None:
            tuned[kernel] = earlier
            continue
        shutil.rmtree(folder, ignore_errors=True)  # a fresh database: exactly `trials` candidates
        folder.mkdir(parents=True)
        try:
            specialise(_plain_compute(op, dtype, model, kernel), args)
        except Exception as exc:  # noqa: BLE001 - recorded per kernel
            k.reason = _short(f"cannot specialise to the case's shapes: {type(exc).__name__}: {exc}")
            continue
        with open(folder / "args.pkl", "wb") as f:
            pickle.dump(args, f)
        jobs.append((kernel, str(folder / "args.pkl"), str(folder)))
    start = time.perf_counter()
    if jobs:
        try:
            with spawned_pool(1) as pool:
                tuned.update(pool.submit(_tune_all, op.name, dtype, jobs, trials, seed, timeout,
                                         str(root / "current_args.txt")).result())
        except cf.process.BrokenProcessPool:  # an in-process build crashed the child
            for kernel, _, _ in jobs:
                tuned[kernel] = {"error": "the tuning process died (a candidate's build crashed it?)",
                                 "measured": 0, "failed": 0, "best_s": None, "tune_s": 0.0}
    for kernel, _, folder in jobs:
        if not tuned[kernel]["error"].startswith("the tuning process died"):
            (Path(folder) / "result.json").write_text(json.dumps(dict(tuned[kernel], trials=trials)))
    result.tune_wall_s = time.perf_counter() - start

    # per kernel the fastest correct candidate; a kernel without one keeps its hand-tuned kernel
    ms_kernels = _swap(hand, {})
    for k in result.kernels:
        got = tuned.get(k.name)
        if got is None:
            continue
        k.measured, k.failed, k.ms_best_s, k.tune_s = got["measured"], got["failed"], got["best_s"], got["tune_s"]
        if got["error"]:
            k.reason = got["error"]
            continue
        call = _pick(op, dtype, model, harness, hand, k, calls[k.name], root / k.name, candidates)
        if call is not None:
            ms_kernels[k.name] = call
    result.check = harness.check(ms_kernels)

    configs = {HAND_TUNED: (harness, hand)}
    tuned_variant = dispatch.default_variant(op, dtype, model, prepared.shape_class)
    if tuned_variant.origin != HAND_TUNED:  # its own harness: its plan may want other workspaces
        configs[f"tuned knobs ({tuned_variant.origin})"] = (tune.Harness(op, case, dtype, model, prepared),
                                                            _load_variant(tuned_variant))
    if result.ms_kernels:
        configs[META_SCHEDULE] = (harness, ms_kernels)
    result.times = _median_rounds(configs, rounds, repeat, budget_s)
    return result
