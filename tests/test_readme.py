"""README.md: every ```python block runs as written, and the file stays short."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import gpu_skip_reason, has_torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 220


def python_blocks():
    """(first line number, source) of every ```python block of README.md."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        line = text.count("\n", 0, match.start()) + 2  # the block's first line of code
        blocks.append((line, match.group(1)))
    return blocks


BLOCKS = python_blocks()


def uses_cuda(source: str) -> bool:
    return "cuda" in source


def test_readme_is_at_most_220_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines; keep it to {MAX_LINES} (details go to docs/)"


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 3, "the quick start's examples are ```python blocks"


@pytest.mark.parametrize("line, source", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs(line, source, tmp_path):
    if "torch" in source and not has_torch():
        pytest.skip("PyTorch is not installed (pip install .[torch])")
    if uses_cuda(source):
        reason = gpu_skip_reason()
        if reason:
            pytest.skip(reason)
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(source, encoding="utf-8")
    env = dict(os.environ)
    # the repository's package, whatever is installed; the cache is the test session's
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"README.md's python block at line {line} failed:\n{result.stdout}\n{result.stderr}")
