"""The project's lint holds: ``ruff check`` with pyproject's ``[tool.ruff.lint]`` rules finds nothing."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINTED = ["attention", "inference", "benchmarks", "scripts", "tests"]


def test_ruff_finds_nothing():
    pytest.importorskip("ruff", reason="ruff is not installed (the test extra has it)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *LINTED],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
