"""`python -m tvm_ops`: every command's --help and a short real run of each."""

import json
import os
import re
import subprocess
import sys

import pytest

from .conftest import requires_torch

COMMANDS = ["build", "test", "bench", "list"]


def cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "tvm_ops", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


@pytest.mark.parametrize("command", COMMANDS + ["tune"])
def test_help_ends_with_an_example(command):
    done = cli(command, "--help")
    assert done.returncode == 0
    assert "--op" in done.stdout or command == "list"
    assert done.stdout.strip().splitlines()[-1].startswith(f"example: python -m tvm_ops {command}")


def test_shape_takes_several_sizes_after_one_flag():
    from tvm_ops.__main__ import parser

    args = parser().parse_args(["tune", "--op", "x", "--shape", "B=2", "C=8", "--shape", "N=16"])
    assert args.shape == [("B", 2), ("C", 8), ("N", 16)]


def test_list_shows_ops_dtypes_targets_and_cases():
    done = cli("list")
    assert done.returncode == 0, done.stderr
    assert "three_interpolate_backward: dtypes float32, float16; targets llvm, cuda" in done.stdout
    assert "net_16x128x4096_m1024" in done.stdout and "hand-tuned knobs" in done.stdout


@pytest.mark.parametrize("jobs", ["1", "2"])  # in this process; in two spawned worker processes
def test_build_writes_library_source_and_manifest(tmp_path, jobs):
    from tvm_ops import build, dispatch, targets
    from tvm_ops.ops import get

    done = cli("build", "--op", "three_interpolate_backward", "--dtype", "float32", "--out", str(tmp_path),
               "--jobs", jobs)
    assert done.returncode == 0, done.stderr
    manifests = {}
    for entry in tmp_path.iterdir():  # the library and its one-core build
        manifest = json.loads((entry / "manifest.json").read_text())
        manifests[manifest["one_core"]] = manifest
        assert manifest["target"].startswith("llvm-") and (entry / "lib.so").stat().st_size > 0
        assert (entry / "kernels.s").read_text().count("vfmadd") > 0  # vectorised FMA for the host mcpu
        assert str(entry) in done.stdout  # a line per library, as it finishes
    assert sorted(manifests) == [False, True]
    # what a worker built is the library this process would have: its key, plan and knobs, intact
    for variant in dispatch.variants(get("three_interpolate_backward"), "float32", targets.resolve("llvm")):
        assert build._valid_entry(tmp_path / variant.entry_name, variant)
        assert manifests[variant.one_core]["plan"] == json.loads(json.dumps(variant.plan, default=str))


def test_test_command_reports_metrics_and_verdicts():
    done = cli("test", "--op", "three_interpolate_backward", "--cases", "boundary", "--case", "bnd_7x63x129_m127")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [l for l in done.stdout.splitlines() if "bnd_7x63x129_m127" in l]
    assert len(lines) == 2 and all(l.rstrip().endswith("pass") for l in lines)
    assert "# all passed" in done.stdout


def test_test_command_exits_non_zero_on_failure(tmp_path):
    # a spec whose thresholds no float16 result can meet must make the command fail
    from tvm_ops import paths

    text = paths.data_file("specs", "three_interpolate_backward").read_text()
    strict = tmp_path / "three_interpolate_backward.yaml"
    strict.write_text(text.replace("float16: {diff1: 1.0e-3, diff2: 1.0e-3}", "float16: {diff1: 1.0e-12, diff2: 1.0e-12}"))
    code = ("import sys, pathlib, tvm_ops.paths as p; real = p.data_file; "
            "p.data_file = lambda folder, op: pathlib.Path(sys.argv[1]) if (folder, op) == "
            "('specs', 'three_interpolate_backward') else real(folder, op); "
            "from tvm_ops.__main__ import main; sys.exit(main(sys.argv[2:]))")
    done = subprocess.run([sys.executable, "-c", code, str(strict), "test", "--op", "three_interpolate_backward",
                           "--case", "bnd_7x63x129_m127"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fail" in done.stdout and "# 2 failed" not in done.stdout and "# 1 failed" in done.stdout


def test_bench_prints_figures_and_writes_json_and_a_plot(tmp_path):
    out, picture = tmp_path / "bench.json", tmp_path / "bench.png"
    done = cli("bench", "--op", "three_interpolate_backward", "--cases", "boundary",
               "--case", "bnd_7x63x129_m127", "--repeat", "3", "--json", str(out), "--plot", str(picture))
    assert done.returncode == 0, done.stderr
    data = picture.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 2000  # a PNG with something drawn
    assert "stream bandwidth" in done.stdout and "GB/s" in done.stdout
    report = json.loads(out.read_text())
    (line,) = report["cases"]
    assert line["median_ms"] > 0 and 0 < line["io_efficiency"] and line["origin"] == "hand-tuned"
    assert report["stream_bandwidth_gbps"] > 0


def test_bad_arguments_exit_non_zero():
    assert cli("test", "--op", "no_such_op").returncode == 2
    assert cli("frobnicate").returncode == 2


@pytest.mark.parametrize("args", [("frobnicate",), ("tune", "--op", "x", "--shape", "B2"), ("test", "--op", "nope"),
                                  ("bench", "--repeat", "many"), ("build", "--op", "three_nn", "--out", __file__),
                                  ("tune", "--op", "three_interpolate_backward", "--shape", "N=10000000000000")])
def test_a_failure_exits_non_zero_with_one_line(args):
    done = cli(*args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("error [BAD_PARAM]")


@pytest.mark.parametrize("args", [("bench", "--repeat", "0"), ("bench", "--repeat", "-1"),
                                  ("bench", "--overhead", "--calls", "0"), ("bench", "--overhead", "--blocks", "0"),
                                  ("build", "--dtype", "nope"), ("build", "--dtype", "float64"),
                                  ("build", "--op", "three_nn", "--jobs", "0"),
                                  ("test", "--dtype", "float64"), ("tune", "--op", "three_nn", "--dtype", "all"),
                                  ("tune", "--op", "three_nn", "--trials", "0"),
                                  ("tune", "--op", "three_nn", "--timeout", "nan"),
                                  ("bench", "--json", "/no/such/folder/bench.json"),
                                  ("bench", "--json", "/proc/self/bench.json"),  # no file can be made there, root or not
                                  ("bench", "--plot", os.path.dirname(__file__)),
                                  ("build", "--op", "voxel_pooling_forward", "--dtype", "float16"),
                                  # an option the mode would ignore, a selection that runs nothing
                                  ("bench", "--overhead", "--json", os.path.join(os.path.dirname(__file__), "o.json")),
                                  ("bench", "--overhead", "--case", "net_16x64_m16"), ("bench", "--calls", "5"),
                                  ("bench", "--functions", "--no-peer"), ("bench", "--functions", "--dtype", "float16"),
                                  ("bench", "--overhead", "--functions"),
                                  ("bench", "--op", "three_nn", "--case", "bnd_n7_small"),
                                  ("test", "--op", "three_nn", "--case", "bnd_n7_small", "--cases", "network"),
                                  ("bench", "--op", "three_nn", "--case", "bnd_m2_bad_param", "--cases", "boundary"),
                                  ("test", "--op", "voxel_pooling_backward", "--dtype", "float16"),
                                  ("bench", "--op", "voxel_pooling_backward", "--dtype", "float16"),
                                  ("bench", "--plot", os.path.join(os.path.dirname(__file__), "p.xyz")),
                                  ("bench", "--json", ""),
                                  ("tune", "--op", "three_nn", "--timeout", "1e308"),
                                  ("tune", "--op", "three_nn", "--rpc-tracker", "localhost:99999", "--rpc-key", "x"),
                                  ("tune", "--op", "three_nn", "--meta-schedule", "--rpc-key", "x")])
def test_a_bad_value_is_refused_before_anything_runs(args, capsys):
    """A value out of range, or a file the command could not write at its end (in-process:
    the same main() as above, without a process per case)."""
    from tvm_ops.__main__ import main

    try:
        code = main(list(args))  # refused by the command (build: the op has no float16 kernels)
    except SystemExit as exited:  # refused by argparse
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error [BAD_PARAM]")


@requires_torch
@pytest.mark.parametrize("function, case", [("ms_deform_attn", "net_detr_decoder_reduced"),
                                            ("voxel_pooling", "net_2x20000x80_128x128x1"),
                                            ("dynamic_scatter", "net_b2_4980x64_m4212")])
def test_bench_functions_times_forward_and_training_step_against_pytorch(function, case):
    done = cli("bench", "--functions", "--case", case, "--repeat", "1")
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if line.split()[:1] == [function]]
    assert [(fields[1], fields[2]) for fields in lines] == [(case, "forward"), (case, "train")]
    for fields in lines:
        peer = re.search(r"peer (\S+) +([\d.]+) ms +x *([\d.]+)", " ".join(fields))  # the fastest; others in [ ]
        assert peer is not None and float(fields[3]) > 0 and float(peer[2]) > 0 and float(peer[3]) > 0


@requires_torch
def test_bench_functions_op_picks_the_functions_that_run_it(capsys):
    from tvm_ops.__main__ import _functions_running, main

    assert _functions_running("three_interpolate_backward", None) == ["three_interpolate"]
    assert _functions_running("all", "net_b2_4980x64_m4212") == ["dynamic_scatter"]
    assert len(_functions_running("all", None)) == 5
    assert main(["bench", "--functions", "--op", "three_nn"]) == 2  # no function runs it: refused, nothing timed
    err = capsys.readouterr().err
    assert err.startswith("error [BAD_PARAM]: no torch function runs three_nn")


def test_bench_overhead_takes_the_host_target_only(capsys):
    from tvm_ops import targets
    from tvm_ops.__main__ import main

    one_core = f"llvm:{targets.host_cpu().cpu}:1"  # this CPU, measurable here, but not the calls' target
    assert main(["bench", "--overhead", "--op", "three_nn", "--target", one_core]) == 2
    assert capsys.readouterr().err.startswith("error [NOT_SUPPORTED]: bench --overhead")


def test_an_unreachable_rpc_tracker_is_one_clear_error():
    import socket

    from tvm_ops.errors import ExecutionFailedError
    from tvm_ops.tuning.tune import TrackerRunner

    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ExecutionFailedError, match=f"cannot reach the RPC tracker localhost:{port}"):
        TrackerRunner(f"localhost:{port}", "x", timeout=5).session()
