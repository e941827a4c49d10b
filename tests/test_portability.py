"""Every operator builds for CPUs other than this host's: aarch64 (to assembly, no linking)
and an AVX2 x86 (haswell, whose code an AVX-512 host also runs: its spec cases pass)."""

import os
import re
import subprocess
import sys

import pytest

import tvm_ops
from tvm_ops import build, dispatch, runner, targets
from tvm_ops.ops import NAMES, get

AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}

# in a child process: LLVM aborts the process on an instruction the target lacks
# ("LLVM ERROR: Cannot select"), which must fail one test, not end the run
AARCH64_CHILD = """
import sys, tvm
from tvm_ops import dispatch, targets
from tvm_ops.ops import get
op, model = get(sys.argv[1]), targets.resolve({target!r})
for dtype in op.spec.float_dtypes:
    variant = dispatch.default_variant(op, dtype, model)
    with tvm.transform.PassContext(opt_level=3):
        lib = tvm.tirx.build(variant.scheduled_module(), target=model.tvm_target())
    asm = lib.inspect_source("asm")
    print(dtype, variant.plan.get("corner_adds", "-"), len(asm), flush=True)
    sys.stdout.write("\\n".join(l for l in asm.splitlines() if l.startswith("\\t")) + "\\n#END\\n")
"""


def test_aarch64_model():
    model = targets.resolve(AARCH64)
    assert (model.mtriple, model.cpu, model.vector_bytes, model.lanes("float32")) == ("aarch64-linux-gnu", "generic",
                                                                                      16, 4)
    assert targets.resolve("llvm:aarch64:4") == targets.resolve(dict(AARCH64, **{"num-cores": 4}))
    assert model.key == f"llvm-aarch64-generic-{targets.host_cpu().cores}c"
    assert model.tvm_target().export()["mtriple"] == "aarch64-linux-gnu"
    assert "neon" in model.features() and "avx512f" not in model.features()
    assert targets.host_cpu().mtriple == "" and "mtriple" not in targets.host_cpu().tvm_target().export()
    with pytest.raises(tvm_ops.ArchMismatchError, match="aarch64"):
        targets.require_runnable(model)
    with pytest.raises(tvm_ops.BadParamError, match="positive integer"):
        targets.resolve("llvm:aarch64:0")


@pytest.mark.parametrize("spec, why", [({"kind": "llvm", "mcpu": 5}, "mcpu must be a string"),
                                       ({"kind": "llvm", "num-cores": 0}, "num-cores must be a positive integer"),
                                       ({"kind": "llvm", "num-cores": "2"}, "num-cores must be a positive integer"),
                                       (dict(AARCH64, mtriple=5), "mtriple must be a string")])
def test_a_bad_target_dict_is_refused(spec, why):
    with pytest.raises(tvm_ops.BadParamError, match=why):
        targets.resolve(spec)


@pytest.mark.parametrize("name", NAMES)
def test_every_op_compiles_for_aarch64(name):
    done = subprocess.run([sys.executable, "-c", AARCH64_CHILD.format(target=AARCH64), name],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    listings = done.stdout.split("#END\n")[:-1]
    assert len(listings) == len(get(name).spec.float_dtypes)
    for asm in listings:
        # NEON 128-bit vectors (float32x4 lanes, or a copy kernel's q-register moves through a
        # data pointer, not the stack's) and aarch64 loads; no x86 register anywhere
        neon = re.search(r"\bv\d+\.4s\b|\t(ldp|stp|ldr|str)\tq\d+,[^\n]*\[x\d+", asm)
        assert neon and "\tldr\t" in asm and "\tret" in asm, asm[:2000]
        assert "%xmm" not in asm and "%rsp" not in asm and "%zmm" not in asm


def test_border_align_fallback_follows_features():
    op = get("border_align_backward")
    knobs = dispatch.default_variant(op, "float32", targets.host_cpu()).knobs
    assert knobs["corner_adds"] == "per_position"
    for target, expect in (("llvm:skylake-avx512", "per_position"), ("llvm:haswell", "per_sample"),
                           ("llvm:aarch64", "per_sample")):
        assert op.plan(targets.resolve(target), knobs)["corner_adds"] == expect, target


def test_host_features_are_plain_python_values():
    """The checked path of every new call signature tests the host's features (~60 of them):
    TVM's IntImm values cost ~0.15 us per truth test, 10 us a call; Python bools nothing."""
    features = targets._host_features()
    assert features and all(type(name) is str and type(present) is bool for name, present in features.items())
    assert features.get("sse2") is True  # every x86-64 CPU has it


def test_runs_here_when_the_host_has_every_feature():
    assert targets.missing_features(targets.resolve("llvm:haswell")) == []
    targets.require_runnable(targets.resolve("llvm:haswell"))
    assert targets.missing_features(targets.host_cpu()) == []
    # AVX-512 FP16 and AMX: features no AMD CPU has (yet)
    missing = targets.missing_features(targets.resolve("llvm:sapphirerapids"))
    if missing:
        with pytest.raises(tvm_ops.ArchMismatchError, match="lacks"):
            targets.require_runnable(targets.resolve("llvm:sapphirerapids"))
    with pytest.raises(tvm_ops.ArchMismatchError, match="is not this machine's CPU"):
        targets.require_measurable(targets.resolve("llvm:haswell"))


def test_a_host_that_lacks_features_its_cpu_name_implies_gets_kernels_without_them():
    """LLVM names the host CPU by family and model; a virtual machine may mask some of that
    CPU's features (this project's znver4 host lacks four system ones; another could lack
    AVX-512): the host model lists them and its libraries are built without them."""
    import tvm

    cpu = "skylake-avx512"
    masked = {f: not (f.startswith("avx512") or f == "evex512") for f in targets._llvm_features("", cpu)}
    disabled = targets.lacking_features(cpu, masked)
    assert "avx512f" in disabled and all(f.startswith("avx512") or f == "evex512" for f in disabled)
    without = targets.TargetModel("llvm", cpu, "", 2, 1 << 20, 32, "", disabled)
    assert "avx512f" not in without.features() and "avx2" in without.features()
    assert without.key.startswith(f"llvm-{cpu}-without-") and without.key.endswith("-2c")
    op = get("three_interpolate_forward")

    def assembly(model):
        variant = build.Variant(op, "float32", model, dict(op.schedules["llvm"].defaults), "test")
        with tvm.transform.PassContext(opt_level=3):
            return tvm.tirx.build(variant.scheduled_module(), target=model.tvm_target()).inspect_source("asm")

    assert "zmm" not in assembly(without) and "ymm" in assembly(without)
    assert "zmm" in assembly(targets.TargetModel("llvm", cpu, "", 2, 1 << 20, 64))  # the check can fail
    assert targets.missing_features(targets.host_cpu()) == []
    assert targets.resolve(f"llvm:{targets.host_cpu().cpu}").disabled == targets.host_cpu().disabled


@pytest.mark.skipif(targets.missing_features(targets.resolve("llvm:haswell")) != [],
                    reason="this host lacks some of haswell's features")
@pytest.mark.skipif(targets.host_cpu().vector_bytes == targets.resolve("llvm:haswell").vector_bytes,
                    reason="this host's own kernels are AVX2 ones: the whole suite runs them")
@pytest.mark.parametrize("name", NAMES)
def test_haswell_build_passes_the_spec_cases_here(name):
    op, haswell = get(name), targets.resolve("llvm:haswell")
    # cases up to 32 MB of io: the larger boundary ones run the same code on more data (their
    # float64 references take most of a minute), and the host target runs them all
    cases = [(case, dtype) for case in op.spec.cases if not case.heavy and op.spec.theory(case.shape, 4)[0] < 32e6
             for dtype in case.dtypes]
    results = [runner.run_case(op, case, dtype, haswell) for case, dtype in cases]
    failed = [(r.case, r.dtype, r.verdict, r.detail) for r in results if r.verdict != "pass"]
    assert not failed
    for dtype in op.spec.float_dtypes:
        entry = build.find_entry(dispatch.default_variant(op, dtype, haswell))
        assert entry is not None and build.manifest(entry)["target"] == haswell.key
        asm = (entry / "kernels.s").read_text()
        assert "ymm" in asm and "zmm" not in asm  # AVX2: 8 float32 lanes, no AVX-512 registers


def test_an_aarch64_library_needs_a_cross_linker(tmp_path):
    import shutil

    model = targets.resolve(AARCH64)
    if shutil.which(f"{model.mtriple}-g++"):
        pytest.skip("a cross compiler is installed")
    variant = dispatch.default_variant(get("three_interpolate_backward"), "float32", model)
    with pytest.raises(tvm_ops.NotSupportedError, match="cross compiler"):
        build.build_entry(variant, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["TVM_NUM_THREADS", "TVM_THREAD_POOL_SPIN_COUNT"])
def test_a_blank_thread_setting_counts_as_unset(monkeypatch, name):
    # `export TVM_NUM_THREADS=` clears a setting in a shell; TVM itself would read 0
    monkeypatch.setenv(name, " ")
    targets._require_thread_settings()
    assert name not in os.environ


@pytest.mark.parametrize("name, value", [("TVM_NUM_THREADS", "99999999999"), ("TVM_NUM_THREADS", "0"),
                                         ("TVM_NUM_THREADS", "two"), ("TVM_NUM_THREADS", "\u00b2"),
                                         ("TVM_NUM_THREADS", "\u0663"), ("TVM_THREAD_POOL_SPIN_COUNT", "-1"),
                                         ("TVM_THREAD_POOL_SPIN_COUNT", "1000000000")])
def test_thread_settings_tvm_would_hang_on_are_refused(monkeypatch, name, value):
    # TVM's pool takes them when its first parallel kernel runs; then the call or the
    # process's exit never ends. Checked where the host model is made, before any kernel.
    monkeypatch.setenv(name, value)
    with pytest.raises(tvm_ops.BadParamError, match=f"{name} must be an integer from"):
        targets._require_thread_settings()
    monkeypatch.setenv(name, "1")
    targets._require_thread_settings()


OVERSUBSCRIBED_CHILD = """
import os, numpy as np, tvm_ops
from tvm_ops import targets
r = np.random.default_rng(0)
go = r.standard_normal((4, 64, 2048)).astype(np.float32)
indices = r.integers(0, 512, (4, 2048, 3)).astype(np.int32)
weights = r.uniform(0, 1, (4, 2048, 3)).astype(np.float32)
tvm_ops.three_interpolate_backward(go, indices, weights, 512)  # a parallel kernel: TVM's pool starts
print(os.environ.get(targets.SPIN_ENV))
"""


@pytest.mark.parametrize("spin", [None, "300000"])
def test_more_threads_than_cores_sleep_between_kernels(spin):
    """A spinning worker holds a core another one needs, and at exit each spins its count
    out: 1000 threads on 2 cores never let the process end. Unless the spin is set."""
    env = {k: v for k, v in os.environ.items() if k != targets.SPIN_ENV}
    env["TVM_NUM_THREADS"] = "1000" if spin is None else str(targets.available_cores() + 1)
    if spin is not None:
        env[targets.SPIN_ENV] = spin
    done = subprocess.run([sys.executable, "-c", OVERSUBSCRIBED_CHILD], env=env, capture_output=True, text=True,
                          timeout=120)  # ~5 s; spinning, 1000 threads did not end in 240 s
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == ("0" if spin is None else spin)
