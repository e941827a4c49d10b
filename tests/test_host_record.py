"""The host CPU's description kept on disk (tvm_ops/host_record.py): keyed by the CPU's
identity, ignored when damaged, and the same model as TVM's LLVM gives."""

import dataclasses
import os

from tvm_ops import host_record, targets

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse2 avx2 avx512f

processor\t: 1
cpu MHz\t\t: 2400.000
"""


def test_the_identity_is_the_first_cpus_name_and_features_not_its_clock():
    base = host_record._identity(X86)
    assert base is not None
    assert host_record._identity(X86.replace("2600.000", "3100.000")) == base
    assert host_record._identity(X86.replace(" avx512f", "")) != base  # a masked feature: another CPU
    assert host_record._identity(X86.replace("model\t\t: 2", "model\t\t: 17")) != base
    assert host_record._identity("processor\t: 0\ncpu MHz\t: 1.0\n") is None


def test_a_damaged_record_is_ignored_and_a_stored_one_read_back(tmp_path, monkeypatch):
    path = tmp_path / "hosts" / "cpu.json"
    monkeypatch.setattr(host_record, "_path", lambda: path)
    assert host_record.load() is None  # none yet
    path.parent.mkdir()
    for damaged in ("", "not json", "[]", '{"cpu": 1, "features": [], "host": {}}', '{"cpu": "x"}',
                    '{"cpu": "x", "features": [], "host": {"avx2": 1}}'):
        path.write_text(damaged)
        assert host_record.load() is None, damaged
    path.unlink()
    os.mkfifo(path)  # never opened: a read would wait for a writer for ever
    assert host_record.load() is None
    path.unlink()
    host_record.store("znver9", {"avx2", "sse2"}, {"avx2": True, "pku": False})
    assert host_record.load() == {"cpu": "znver9", "features": ["avx2", "sse2"],
                                  "host": {"avx2": True, "pku": False}}


def test_the_kept_host_model_is_llvms(tmp_path, monkeypatch):
    # a fresh cache asks TVM's LLVM and keeps its answers; read back, they make the same model
    monkeypatch.setenv("TVM_OPS_CACHE_DIR", str(tmp_path))
    cached = (targets.host_cpu, targets._llvm_features, targets._host_features)
    for function in cached:
        function.cache_clear()
    try:
        asked = targets.host_cpu()
        record = host_record.load()
        assert record is not None and record["cpu"] == asked.cpu
        assert tuple(targets._absent(record["features"], record["host"])) == asked.disabled
        assert frozenset(record["features"]) - frozenset(asked.disabled) == asked.features()
        for function in cached:
            function.cache_clear()
        assert dataclasses.asdict(targets.host_cpu()) == dataclasses.asdict(asked)
    finally:
        for function in cached:
            function.cache_clear()
