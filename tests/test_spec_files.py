"""Specs and schedules load, and a malformed file fails with its name and key."""

import textwrap

import pytest

from tvm_ops import schedule_file, spec
from tvm_ops.ops import NAMES
from tvm_ops.spec import SpecError


@pytest.mark.parametrize("name", NAMES)
def test_every_operator_has_a_valid_spec_and_schedule(name):
    s = spec.load(name)
    assert s.cases_in("network"), "every operator has network-scale cases"
    sched = schedule_file.load(name)
    assert set(sched) == {"llvm", "cuda"}
    for target in sched.values():
        assert target.defaults and all(target.defaults[k] in target.candidates[k] for k in target.defaults)


GOOD = """
op: demo_op
inputs:
  x: {dims: [B, N], dtypes: [float32]}
outputs:
  y: {dims: [B, N], dtype_of: x}
zero_elements: {bad_param: [B], empty_success: [N]}
accuracy: {float32: {diff1: 1.0e-5}}
theory: {io_bytes: "B*N*itemsize*2"}
cases:
  - {name: small, set: network, shape: {B: 2, N: 3}}
"""


def write(tmp_path, text):
    path = tmp_path / "demo_op.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_good_spec_parses(tmp_path):
    s = spec.parse(write(tmp_path, GOOD))
    assert s.theory({"B": 2, "N": 3}, 4) == (48, None)
    assert s.case("small").shape == {"B": 2, "N": 3}


BY_MODE = GOOD.replace("outputs:", "params:\n  mode: {type: str, choices: [a, b]}\noutputs:").replace(
    'theory: {io_bytes: "B*N*itemsize*2"}', 'theory: {io_bytes: "B*N*itemsize*2", io_bytes_by: {mode: {b: "B*N"}}}')


def test_formulas_are_arithmetic_over_their_symbols():
    env = {"B": 3, "N": 5, "itemsize": 4}
    assert spec.evaluate("B*N*itemsize + 2**3 - 7/2 + 7//2", env) == 3 * 5 * 4 + 8 - 3.5 + 3
    assert spec.evaluate("B*N*itemsize + 2**3 - 7/2 + 7//2", dict(env, B=4)) == 4 * 5 * 4 + 8 - 3.5 + 3  # parsed once
    with pytest.raises(KeyError, match="M"):
        spec.evaluate("B*M", env)
    for bad in ("abs(B)", "-B", "B.real", "'B'", "B if N else 1", "[B][0]"):
        with pytest.raises(ValueError, match="unsupported syntax"):
            spec.evaluate(bad, env)


def test_io_formula_by_parameter_value(tmp_path):
    s = spec.parse(write(tmp_path, BY_MODE))
    assert s.theory({"B": 2, "N": 3}, 4, {"mode": "b"}) == (6, None)
    assert s.theory({"B": 2, "N": 3}, 4, {"mode": "a"}) == (48, None)  # no entry: the default formula
    assert s.theory({"B": 2, "N": 3}, 4) == (48, None)


@pytest.mark.parametrize("bad, key", [
    (GOOD.replace("dtypes: [float32]", "dtypes: [float64]"), "inputs.x.dtypes"),
    (GOOD.replace("  - {name: small, set: network, shape: {B: 2, N: 3}}",
                  "  - {name: small, set: network, shape: {B: 2}}"), "cases[0].shape"),
    (GOOD.replace("set: network", "set: nightly"), "cases[0].set"),
    (GOOD.replace('io_bytes: "B*N*itemsize*2"', 'io_bytes: "B*Q"'), "theory.io_bytes"),
    (GOOD.replace('io_bytes: "B*N*itemsize*2"', 'io_bytes: "max(B, N)"'), "theory.io_bytes"),  # no calls
    (GOOD.replace('io_bytes: "B*N*itemsize*2"', 'io_bytes: "B.real * N"'), "theory.io_bytes"),
    (GOOD.replace('io_bytes: "B*N*itemsize*2"', 'io_bytes: "B*N*"'), "theory.io_bytes"),
    (GOOD.replace("op: demo_op", "op: other"), "op"),
    (GOOD.replace("accuracy: {float32: {diff1: 1.0e-5}}", "accuracy: {float32: {diff9: 1}}"), "accuracy.float32.diff9"),
    (GOOD.replace("dtype_of: x", "dtype_of: z"), "y.dtype_of"),
    (GOOD.replace("theory:", "theory_typo:"), "theory"),
    (GOOD.replace("outputs:", "params:\n  mode: {type: str}\noutputs:"), "params.mode.choices"),
    (GOOD.replace("outputs:", "params:\n  mode: {type: float}\noutputs:"), "params.mode.type"),
    (BY_MODE.replace("{b: ", "{c: "), "theory.io_bytes_by.mode"),
    (BY_MODE.replace('{b: "B*N"}', '{b: "B*Q"}'), "theory.io_bytes_by.mode.b"),
    (BY_MODE.replace("io_bytes_by: {mode:", "io_bytes_by: {nomode:"), "theory.io_bytes_by"),
    (GOOD.replace("zero_elements:", "counted: [N]\nzero_elements:"), "counted"),  # an input's size
    (GOOD.replace("zero_elements:", "exact: [x]\nzero_elements:"), "exact"),  # not an output
])
def test_malformed_spec_names_file_and_key(tmp_path, bad, key):
    with pytest.raises(SpecError) as info:
        spec.parse(write(tmp_path, bad))
    assert "demo_op.yaml" in str(info.value)
    assert f"'{key}" in str(info.value)


def test_counted_and_exact_outputs_parse(tmp_path):
    text = GOOD.replace("y: {dims: [B, N], dtype_of: x}", "y: {dims: [M, N], dtype_of: x}").replace(
        "zero_elements:", "counted: [M]\nexact: [y]\nzero_elements:").replace("shape: {B: 2, N: 3}",
                                                                             "shape: {B: 2, N: 3, M: 1}")
    s = spec.parse(write(tmp_path, text))
    assert s.counted == ("M",) and s.exact == ("y",)


def test_invalid_yaml_names_the_file(tmp_path):
    with pytest.raises(SpecError, match="demo_op.yaml: not valid YAML"):
        spec.parse(write(tmp_path, "op: [unclosed"))


SCHEDULE = """
op: demo_op
llvm:
  reduction: owner
  knobs: {tile: {default: 16, candidates: [8, 16]}}
cuda:
  reduction: atomic
  knobs: {threads: {default: 128, candidates: [128, 256]}}
"""


def test_schedule_file_parses_and_validates(tmp_path):
    path = tmp_path / "demo_op.yaml"
    path.write_text(SCHEDULE)
    parsed = schedule_file.parse(path, "demo_op")
    assert parsed["cuda"].reduction == "atomic" and parsed["llvm"].defaults == {"tile": 16}
    path.write_text(SCHEDULE.replace("reduction: atomic", "reduction: magic"))
    with pytest.raises(SpecError, match=r"demo_op.yaml: key 'cuda.reduction'"):
        schedule_file.parse(path, "demo_op")
    path.write_text(SCHEDULE.replace("default: 16, candidates: [8, 16]", "default: 32, candidates: [8, 16]"))
    with pytest.raises(SpecError, match=r"key 'llvm.knobs.tile.candidates'"):
        schedule_file.parse(path, "demo_op")
    path.write_text(SCHEDULE.split("cuda:")[0])
    with pytest.raises(SpecError, match=r"key 'cuda': missing"):
        schedule_file.parse(path, "demo_op")


@pytest.mark.parametrize("edit, key", [
    (("op: demo_op", "op: demo_op\nnotes: x"), "'notes'"),
    (("  reduction: owner", "  reduction: owner\n  task_split: [B]"), "'llvm.task_split'"),
    (("{default: 16, candidates: [8, 16]}", "{default: 16, candidates: [8, 16], unroll: k}"),
     "'llvm.knobs.tile.unroll'"),
    (("  reduction: atomic", "  reduction: atomic\n  onchip: nram"), "'cuda.onchip'"),
])
def test_schedule_file_rejects_unread_keys(tmp_path, edit, key):
    path = tmp_path / "demo_op.yaml"
    path.write_text(SCHEDULE.replace(*edit))
    with pytest.raises(SpecError) as info:
        schedule_file.parse(path, "demo_op")
    assert "demo_op.yaml" in str(info.value) and key in str(info.value)


def test_schedule_file_names_its_onchip_budget(tmp_path):
    path = tmp_path / "demo_op.yaml"
    path.write_text(SCHEDULE.replace("  reduction: atomic", "  reduction: atomic\n  onchip: shared"))
    parsed = schedule_file.parse(path, "demo_op")
    assert (parsed["llvm"].onchip, parsed["cuda"].onchip) == ("none", "shared")


WITH_POOL = GOOD.replace("outputs:", "params:\n  pool_size: {min: 1}\noutputs:").replace(
    'theory: {io_bytes: "B*N*itemsize*2"}', 'theory: {io_bytes: "B*N*itemsize*2", ops: "B*N*(pool_size + 1)"}')


def test_ops_formula_may_name_integer_parameters_and_io_may_not(tmp_path):
    s = spec.parse(write(tmp_path, WITH_POOL))
    assert s.theory({"B": 2, "N": 3}, 4, {"pool_size": 9}) == (48, 60)
    assert s.theory({"B": 2, "N": 3}, 4) == (48, None)  # ops without the call's parameters: unknown
    with pytest.raises(SpecError, match="io_bytes"):
        spec.parse(write(tmp_path, WITH_POOL.replace('io_bytes: "B*N*itemsize*2"', 'io_bytes: "B*N*pool_size"')))
