"""`python -m tvm_ops <command>`: build, test, bench, tune and list the operators."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from .spec import DTYPES

TARGET_HELP = ("llvm (the host CPU, default), llvm:MCPU[:CORES] (another x86-64 CPU, e.g. a board "
               "reached over RPC), llvm:aarch64[:CORES] (a generic 64-bit Arm CPU), cuda (the local GPU's arch, else sm_80) or cuda:sm_XX")


def _ops(name: str):
    from .ops import all_operators, get

    return all_operators() if name == "all" else [get(name)]


def _dtypes(op, wanted: str) -> list[str]:
    """The dtypes of `op` that `wanted` (a dtype or "all") selects: none when it has no such one."""
    return [dtype for dtype in op.spec.float_dtypes if wanted in ("all", dtype)]


FLOAT_DTYPES = tuple(d for d in DTYPES if d.startswith("float"))  # as OpSpec.float_dtypes picks them
ANY_DTYPE = FLOAT_DTYPES + ("all",)


def _positive(convert, what: str, most: float = float("inf")):
    """An argparse type: `convert` of the text, refused unless above 0 and finite (at most `most`)."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf") or value > most:  # NaN fails too
            raise argparse.ArgumentTypeError(f"want {what}, got {text!r}")
        return value

    return parse


_count = _positive(int, "a positive integer")  # runs, calls, trials, workers
MAX_SECONDS = 7 * 24 * 3600  # a week: Python's waits overflow far above it (threading.TIMEOUT_MAX, time_t)
_seconds = _positive(float, f"a positive number of seconds up to {MAX_SECONDS}", MAX_SECONDS)


def _new_file(text: str) -> str:
    """A file the command writes at its end: its folder is checked before anything runs."""
    path = Path(text)
    folder = path.parent
    if not text.strip():
        raise argparse.ArgumentTypeError("want a file name, got an empty one")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"the folder of {text} does not exist")
    if not _can_write(path):
        raise argparse.ArgumentTypeError(f"{text} cannot be written here (no permission or a read-only folder)")
    return text


def _can_write(path: Path) -> bool:
    """Whether the file can be written: opened for appending where it is a file, created and
    removed where it does not exist (permission bits alone pass root on a pseudo filesystem,
    /proc or /sys, where no file can be made)."""
    try:
        if path.is_file():
            with open(path, "a"):
                return True
        if path.exists():  # a device or a pipe, which opening could block on
            return os.access(path, os.W_OK)
        with open(path, "x"):
            pass
        path.unlink()
        return True
    except OSError:
        return False


PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # formats matplotlib writes without extra packages


def _plot_file(text: str) -> str:
    """--plot's file: a writable new file whose suffix names the picture's format."""
    if Path(text).suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(f"want a file ending in {', '.join(PLOT_SUFFIXES)} (its format), got {text!r}")
    return _new_file(text)


def _size(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"want SYMBOL=SIZE (e.g. N=8192), got {text!r}")
    return name.strip(), int(value)


def cmd_build(args) -> int:
    from . import build, dispatch, paths, targets

    from tqdm import tqdm

    model = targets.resolve(args.target)
    out = Path(args.out) if args.out else paths.writable_cache_dir()
    if out.exists() and not out.is_dir():  # said before any library is compiled
        from .errors import BadParamError

        raise BadParamError(f"--out {out} is a file; give a folder (made if missing)")
    # hand-tuned, then each tuned shape class's best, per (op, dtype)
    ops = _ops(args.op)
    todo = [v for op in ops for dtype in _dtypes(op, args.dtype) for v in dispatch.variants(op, dtype, model)]
    if not todo:
        from .errors import BadParamError

        raise BadParamError(f"{args.op} has no {args.dtype} kernels "
                            f"(its dtypes: {', '.join(ops[0].spec.float_dtypes)})")
    jobs = min(args.jobs or targets.available_cores(), len(todo))
    # no bar when not a terminal
    with tqdm(total=len(todo), unit="library", desc=f"build ({jobs} at once)", disable=None) as bar:
        for variant, entry, seconds in build.build_many(todo, out, jobs):
            bar.write(f"{variant.op.name:28s} {variant.dtype:8s} {model.key:18s} {variant.key}  "
                      f"{seconds:5.1f} s  {variant.origin:12s} "
                      f"{'one-core' if variant.one_core else 'parallel':8s} {entry}")
            bar.update()
    if args.out:
        print(f"# calls load from here with TVM_OPS_BUILD_DIR={out}")
    return 0


def _selected(ops: list, which: str, name: str | None, dtype: str, runs_only: bool = False) -> list:
    """[(op, case, dtypes)]: the cases of set `which` (`name`'s alone when given; with runs_only
    not those that expect an error) in the dtypes `dtype` selects ("all" or one) that the case
    has. BadParamError, saying why, when that is nothing: a run that does nothing and reports
    success would hide a typo."""
    from .errors import BadParamError

    named = [c for op in ops for c in op.spec.cases if c.name == name]
    if name is not None and not named:
        raise BadParamError(f"no spec case named {name!r} in {', '.join(op.name for op in ops)}; "
                            f"see `python -m tvm_ops list`")
    if named and not any(c.set == which or which == "all" for c in named):
        raise BadParamError(f"case {name} is in the {named[0].set} set, not {which}; "
                            f"add --cases {named[0].set} (or all)")
    if runs_only and named and all(c.expect != "ok" for c in named):
        raise BadParamError(f"case {name} expects {named[0].expect}: bench times cases that run "
                            f"(`test --case {name}` checks it)")
    chosen = []
    for op in ops:
        for case in op.spec.cases_in(which):
            if (name and case.name != name) or (runs_only and case.expect != "ok"):
                continue
            dtypes = [d for d in case.dtypes if dtype in ("all", d)]
            if dtypes:
                chosen.append((op, case, dtypes))
    if not chosen:
        kind = " ".join(part for part in (dtype, which) if part != "all")
        dtypes = f" (its dtypes: {', '.join(ops[0].spec.float_dtypes)})" if len(ops) == 1 else ""
        raise BadParamError(f"nothing to run: no {kind + ' ' if kind else ''}case{' ' + name if name else ''}"
                            f"{' that runs' if runs_only else ''} in {', '.join(op.name for op in ops)}{dtypes}; "
                            f"see `python -m tvm_ops list`")
    return chosen


def cmd_test(args) -> int:
    from . import runner, targets

    model = targets.resolve(args.target)
    targets.require_runnable(model)  # the cases run here: say so before generating any input
    chosen = _selected(_ops(args.op), args.cases, args.case, args.dtype)
    failures = 0
    print(f"{'op':28s} {'case':26s} {'dtype':8s} {'diff1':>9s} {'diff2':>9s} {'diff3':>9s} {'diff4':>6s}  verdict")
    for op, case, dtypes in chosen:
        for dtype in dtypes:
            r = runner.run_case(op, case, dtype, model)
            failures += r.verdict == "fail"
            a = r.accuracy
            numbers = (f"{a.diff1:9.2e} {a.diff2:9.2e} {a.diff3:9.2e} {a.diff4:6.3f}" if a
                       else f"{'-':>9s} {'-':>9s} {'-':>9s} {'-':>6s}")
            detail = f"  ({r.detail})" if r.detail else ""
            print(f"{op.name:28s} {case.name:26s} {dtype:8s} {numbers}  {r.verdict}{detail}")
    print(f"# {failures} failed" if failures else "# all passed")
    return 1 if failures else 0


# bench's options whose defaults depend on the mode (None in the parser: given or not)
BENCH_DEFAULTS = {"dtype": "float32", "cases": "network", "repeat": 10, "calls": 1000, "blocks": 5}
# what each mode of bench reads besides --op and --target
BENCH_MODE_OPTIONS = {"cases": ("dtype", "cases", "case", "repeat", "no_peer", "json", "plot"),
                      "functions": ("case", "repeat", "json"),
                      "overhead": ("calls", "blocks", "no_peer")}


def _refuse_unread(args, mode: str) -> None:
    """BadParamError for an option `mode` would ignore (a silently ignored option reads as obeyed)."""
    from .errors import BadParamError

    flags = {"overhead": " --overhead", "functions": " --functions", "cases": ""}
    for name in sorted({n for options in BENCH_MODE_OPTIONS.values() for n in options} - set(BENCH_MODE_OPTIONS[mode])):
        value = getattr(args, name)
        if value not in (None, False) and not (mode == "functions" and BENCH_DEFAULTS.get(name) == value):
            readers = " or ".join(f"bench{flags[m]}" for m, options in BENCH_MODE_OPTIONS.items() if name in options)
            raise BadParamError(f"bench{flags[mode]} does not take --{name.replace('_', '-')} (an option of {readers})")
    for name, value in BENCH_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def cmd_bench(args) -> int:
    from . import bench, targets
    from .errors import BadParamError

    if args.overhead and args.functions:
        raise BadParamError("bench takes --overhead or --functions, not both")
    mode = "overhead" if args.overhead else "functions" if args.functions else "cases"
    _refuse_unread(args, mode)  # --functions: float32 network cases (--dtype float32 and --cases network pass)
    # TVM's workers spin between kernels, as for callers with numpy arrays, or sleep between
    # them, as for torch tensors (targets.sleep_workers_between_kernels): the torch functions
    # take turns with torch's own ops. Set before the first kernel (the stream) starts the pool.
    os.environ.setdefault(targets.SPIN_ENV, "0" if args.functions else str(targets.TVM_DEFAULT_SPIN))
    model = targets.resolve(args.target)
    targets.require_measurable(model)
    if args.overhead:
        return _overhead(args, model)
    if args.functions:
        functions = _functions_running(args.op, args.case)
    else:
        chosen = _selected(_ops(args.op), args.cases, args.case, args.dtype, runs_only=True)
    if args.plot:
        from . import plot

        plot.require()  # before the runs, not after them
    bandwidth = bench.stream_bandwidth(model)
    peak = bench.peak_flops(model)
    print(f"# target {model.key}: stream bandwidth {bandwidth / 1e9:.2f} GB/s (TVM copy kernel, the faster of cached "
          "and streamed stores, this run)"
          + (f", peak {peak / 1e9:.0f} GFLOP/s (TVM FMA loop, this run)" if peak else ""))
    if args.functions:
        lines = _functions(args, model, bandwidth, functions)
    else:
        lines = []
        for op, case, dtypes in chosen:
            for dtype in dtypes:
                line = bench.bench_case(op, case, dtype, model, bandwidth, args.repeat, not args.no_peer)
                lines.append(line)
                print(line.text(), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.as_json(lines, bandwidth, model), indent=2))
    if args.plot:
        from . import plot

        plot.bench_lines(lines, model.key, Path(args.plot))
        print(f"# plot: {args.plot}")
    return 0


def _functions_running(op_name: str, case_name: str | None) -> list[str]:
    """The torch functions `bench --functions --op op_name` times: those whose training step
    runs that operator (every one for "all"), only those with a network case `case_name`."""
    import importlib.util

    from .errors import BadParamError, NotSupportedError

    if importlib.util.find_spec("torch") is None:
        raise NotSupportedError("bench --functions times the torch functions (tvm_ops.functional): it needs "
                                "PyTorch (pip install 'tvm_ops[torch]')")
    from .bench_functions import FUNCTION_OPS
    from .ops import get

    _ops(op_name)  # an unknown name: its own error
    names = [name for name, ops in FUNCTION_OPS.items() if op_name == "all" or op_name in ops]
    if not names:
        raise BadParamError(f"no torch function runs {op_name}; bench --functions times "
                            + ", ".join(f"{name} ({' + '.join(ops)})" for name, ops in FUNCTION_OPS.items()))
    if case_name:  # a function's cases are its forward operator's network cases
        chosen = _selected([get(FUNCTION_OPS[name][0]) for name in names], "network", case_name, "float32",
                           runs_only=True)
        names = [name for name in names if any(op.name == FUNCTION_OPS[name][0] for op, _, _ in chosen)]
    return names


def _functions(args, model, bandwidth, functions: list[str]) -> list:
    """`bench --functions`: the torch functions, forward alone and a training step, vs PyTorch."""
    from .bench_functions import FUNCTIONS

    print("# function         case                       mode      tvm_ops (torch tensors in, "
          "autograd included)  vs the PyTorch formulation, same run")
    lines = []
    for name in functions:
        for line in FUNCTIONS[name](model, bandwidth, args.repeat, args.case):
            lines.append(line)
            print(line.text(), flush=True)
    return lines


def _overhead(args, model) -> int:
    """`bench --overhead`: host time of a repeated tiny public call per operator."""
    from . import overhead, targets
    from .errors import NotSupportedError

    if model.key != targets.resolve("llvm").key:
        raise NotSupportedError("bench --overhead measures the calls a caller makes on the host's default target "
                                "(llvm); it takes no other --target")
    print(f"# host time per repeated call, best of {args.blocks} blocks of {args.calls} calls; "
          "host = the same call with its kernels stubbed out")
    for op in _ops(args.op):
        print(overhead.overhead(op, args.calls, args.blocks, not args.no_peer).text(), flush=True)
    return 0


def cmd_tune(args) -> int:
    from . import records, targets
    from .ops import get
    from .tuning import require_extras, tune

    require_extras()

    op = get(args.op)
    from .errors import BadParamError

    model = targets.resolve(args.target)
    if args.meta_schedule:
        return _meta_schedule(args, op, model)
    rpc = None
    if args.rpc_tracker or args.rpc_key:
        if not (args.rpc_tracker and args.rpc_key):
            raise BadParamError("--rpc-tracker and --rpc-key go together")
        rpc = tune.TrackerRunner(args.rpc_tracker, args.rpc_key, timeout=args.timeout)
    else:
        targets.require_measurable(model)  # measured here: the target must be this machine
    case = tune.with_shape(op, tune.find_case(op, args.case), dict(args.shape or []))
    result = tune.tune(op, args.dtype, model, case, trials=args.trials, records_path=args.records,
                       timeout=args.timeout, repeat=args.repeat, workers=args.workers, seed=args.seed,
                       progress=True, rpc=rpc)
    where = f" on {rpc.name} via {args.rpc_tracker}" if rpc else ""
    print(f"# {op.name} {args.dtype} {model.key} case {case.name} (shape class {result.shape_class}){where}: "
          f"{result.new} new trials, "
          f"{len(result.records) - result.new} from {result.records_path}")
    print(tune.table(result))
    if result.best and result.baseline and result.baseline.get("median_s"):
        print(f"# best {result.best['median_s'] * 1e3:.3f} ms vs hand-tuned "
              f"{result.baseline['median_s'] * 1e3:.3f} ms (x{result.baseline['median_s'] / result.best['median_s']:.2f})")
    if args.records:
        print(f"# calls use these records with TVM_OPS_RECORDS={args.records}")
    chosen = records.best(op, args.dtype, model, result.shape_class, Path(args.records) if args.records else None)
    if chosen is not None:
        print(f"# calls of shape class {result.shape_class} now use tuned:{chosen['case']}: "
              + ", ".join(f"{k}={v}" for k, v in chosen["knobs"].items()))
    return 0


def _meta_schedule(args, op, model) -> int:
    """`tune --meta-schedule`: TVM's auto-scheduler with the same trial budget, against hand-tuned."""
    from .errors import BadParamError
    from .tuning import meta_schedule_baseline, tune

    if args.rpc_tracker or args.rpc_key:
        raise BadParamError("--meta-schedule measures on this machine; it takes no --rpc-tracker or --rpc-key")
    case = tune.with_shape(op, tune.find_case(op, args.case), dict(args.shape or []))
    result = meta_schedule_baseline.compare(op, case, args.dtype, model, trials=args.trials, timeout=args.timeout,
                                            repeat=args.repeat, seed=args.seed)
    print("\n".join(result.lines()))
    return 0  # meta_schedule taking no kernel is a result, not an error


def cmd_list(args) -> int:
    from . import dispatch, paths, records, targets
    from .ops import all_operators

    host = targets.resolve("llvm")
    print(f"# tuning records: {paths.records_path()}")
    for op in all_operators():
        print(f"{op.name}: dtypes {', '.join(op.spec.float_dtypes)}; targets llvm, cuda")
        for kind, sched in op.schedules.items():
            print(f"  schedule {kind}: reduction {sched.reduction}, on-chip {sched.onchip}, hand-tuned knobs "
                  + ", ".join(f"{k}={v}" for k, v in sched.defaults.items()))
        for dtype in op.spec.float_dtypes:  # what a call on this host would use
            variant = dispatch.default_variant(op, dtype, host)
            print(f"  uses {host.key} {dtype}: {variant.origin} "
                  + ", ".join(f"{k}={v}" for k, v in variant.knobs.items()))
            for shape_class in records.tuned_classes(op, dtype, host):
                variant = dispatch.default_variant(op, dtype, host, shape_class)
                print(f"    shape class {shape_class}: {variant.origin} "
                      + ", ".join(f"{k}={v}" for k, v in variant.knobs.items()))
        for case in op.spec.cases:
            shape = " ".join(f"{k}={v}" for k, v in case.shape.items())
            expect = "" if case.expect == "ok" else f" -> {case.expect}"
            print(f"  case {case.set:8s} {case.name:26s} {shape}{expect}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (exit 2), like the commands' own errors."""

    def error(self, message):
        self.exit(2, f"error [BAD_PARAM]: {self.prog}: {message} (see --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tvm_ops", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = p.add_subparsers(dest="command", required=True)

    def command(name, help, example):
        return sub.add_parser(name, help=help, description=help, epilog=f"example: {example}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    b = command("build", "build kernel libraries (one per op and dtype) for a target",
                "python -m tvm_ops build --target cuda:sm_90 --op three_interpolate_backward")
    b.add_argument("--target", default="llvm", help=TARGET_HELP)
    b.add_argument("--op", default="all", help="operator name or 'all' (default)")
    b.add_argument("--dtype", default="all", choices=ANY_DTYPE, help="float32, float16 or 'all' (default)")
    b.add_argument("--out", help="output directory (default: the on-disk cache that calls load from)")
    b.add_argument("--jobs", type=_count, help="libraries compiled at once, each by a process of its own "
                   "(default: the cores this process may use)")
    b.set_defaults(func=cmd_build)

    t = command("test", "run spec cases against the float64 reference",
                "python -m tvm_ops test --op border_align_backward --cases boundary")
    t.add_argument("--target", default="llvm", help=TARGET_HELP)
    t.add_argument("--op", default="all", help="operator name or 'all' (default)")
    t.add_argument("--dtype", default="all", choices=ANY_DTYPE, help="float32, float16 or 'all' (default)")
    t.add_argument("--cases", default="all", choices=["network", "boundary", "random", "all"],
                   help="the set of spec cases (default: all)")
    t.add_argument("--case", help="only this case name")
    t.set_defaults(func=cmd_test)

    m = command("bench", "time network cases; efficiency and the PyTorch peer ratio",
                "python -m tvm_ops bench --op ms_deform_attn_backward --json bench.json --plot bench.png")
    m.add_argument("--target", default="llvm", help=TARGET_HELP)
    m.add_argument("--op", default="all", help="operator name or 'all' (default)")
    m.add_argument("--dtype", choices=ANY_DTYPE, help="float32 (default), float16 or 'all'")
    m.add_argument("--cases", choices=["network", "boundary", "random", "all"], help="the set of spec cases "
                   "(default: network)")
    m.add_argument("--case", help="only this case name")
    m.add_argument("--repeat", type=_count, help="timed runs per case (median reported; default 10)")
    m.add_argument("--no-peer", action="store_true", help="skip the PyTorch eager peer")
    m.add_argument("--json", type=_new_file, help="also write the results to this JSON file")
    m.add_argument("--plot", metavar="FILE.png", type=_plot_file,
                   help="also draw the results: per case our time and each peer's (log scale), with the "
                        "io efficiency (needs matplotlib: pip install 'tvm_ops[plot]')")
    m.add_argument("--functions", action="store_true",
                   help="time the torch functions (tvm_ops.functional) on the network cases, forward alone and "
                        "forward + backward, against their PyTorch formulations")
    m.add_argument("--overhead", action="store_true",
                   help="instead: host time of a repeated tiny call per operator (numpy and torch, with "
                        "and without out=), against its kernels alone and the PyTorch peer")
    m.add_argument("--calls", type=_count, help="--overhead: calls per block (default 1000)")
    m.add_argument("--blocks", type=_count, help="--overhead: blocks (the best is reported; default 5)")
    m.set_defaults(func=cmd_bench)

    u = command("tune", "search the schedule knobs of one operator; records the trials",
                "python -m tvm_ops tune --op three_interpolate_backward --shape B=2 C=8 --trials 8")
    u.add_argument("--op", required=True, help="operator name")
    u.add_argument("--target", default="llvm", help=TARGET_HELP)
    u.add_argument("--case", help="spec case to tune on (the shape class; default: the first network case)")
    u.add_argument("--shape", action="extend", nargs="+", type=_size, metavar="SYM=SIZE",
                   help="replace sizes of the case, e.g. --shape B=2 C=8 (repeatable)")
    u.add_argument("--dtype", default="float32", choices=FLOAT_DTYPES, help="float32 (default) or float16")
    u.add_argument("--trials", type=_count, default=16, help="knob combinations to try, the hand-tuned one first")
    u.add_argument("--records", type=_new_file,
                   help="JSON-lines records file (default: tuning.jsonl in the cache directory)")
    u.add_argument("--timeout", type=_seconds, default=60.0, help="seconds per candidate build (and timing cap)")
    u.add_argument("--repeat", type=_count, default=10, help="timed runs per candidate (median reported)")
    u.add_argument("--workers", type=_count, default=2, help="parallel build processes")
    u.add_argument("--seed", type=int, default=0, help="order of the search space")
    u.add_argument("--rpc-tracker", metavar="HOST:PORT",
                   help="measure on a server from this TVM RPC tracker instead of locally")
    u.add_argument("--rpc-key", metavar="KEY", help="the device key the RPC servers registered with")
    u.add_argument("--meta-schedule", action="store_true",
                   help="instead: tune the case's fixed-shape computes with TVM's meta_schedule (--trials per "
                        "kernel) and time the result against the hand-tuned default")
    u.set_defaults(func=cmd_tune)

    ls = command("list", "operators, dtypes, targets, schedules and cases", "python -m tvm_ops list")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    from .errors import OpError

    try:
        return args.func(args)
    except OpError as exc:
        print(f"error [{exc.status}]: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the command reads or writes
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
