"""README.md's and docs/kv_cache.md's examples must run as printed, and say what their comments say they do (on
this CPU machine)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
KV_CACHE_DOC = README.parent / "docs" / "kv_cache.md"


def python_blocks(text: str) -> list[str]:
    """The ```python fenced blocks of a markdown text, in order."""
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_python_blocks_finds_fenced_code() -> None:
    assert python_blocks("a\n```python\nx = 1\n```\nb\n```bash\nls\n```\n") == ["x = 1\n"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the example's comments describe a CPU run")
def test_readme_example_runs_as_documented() -> None:
    (example,) = python_blocks(README.read_text())
    # a user's shell: without the tests' TRITON_INTERPRET=1, which lets the fused kernels run on CPU
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = example + "\nprint(tuple(out.shape))\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=README.parent, env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    lines = result.stdout.splitlines()
    assert lines[-1] == "(2, 128, 512)"                 # the comment's "[2, 128, 8 * 64]"
    assert lines[0] == "unfused"                        # last_backend on a CPU
    assert lines[1] == "Selected backend: unfused"      # explain()'s heading
    assert any(line.startswith("  fused is not supported because:") for line in lines)


def test_kv_cache_doc_example_runs_as_documented() -> None:
    """The two-layer loop of prefill, decode and verification steps prints what its last comment says."""
    (example,) = python_blocks(KV_CACHE_DOC.read_text())
    printed = re.search(r"^print\(.*\)\s+# (.*)$", example, flags=re.MULTILINE).group(1)
    result = subprocess.run([sys.executable, "-c", example], cwd=README.parent, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == printed == "(11, 512) {'a': 10, 'c': 7}"
