"""The Triton kernels compile for sm90 (to the cubin, within its shared memory), on CPU: catches code
the interpreter runs but the compiler rejects. tests/sm90_compile.py does the work in a subprocess,
because the interpreter (set by the other kernel tests of this session) replaces the JIT functions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention.kernels import triton_available

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(triton_available() is not None, reason=f"Triton unavailable: {triton_available()}")
def test_every_kernel_configuration_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "tests.sm90_compile"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    if result.stdout.startswith("SKIP"):
        pytest.skip(result.stdout.strip())
    failures = [line for line in result.stdout.splitlines() if not line.startswith("ok")]
    assert result.returncode == 0 and not failures, "\n".join(failures) or result.stderr[-3000:]
    assert sum(line.startswith("ok") for line in result.stdout.splitlines()) >= 50


def test_help_prints_the_usage_instead_of_compiling(capsys: pytest.CaptureFixture[str]) -> None:
    """--help used to be ignored: the whole compile ran."""
    from tests.sm90_compile import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0 and "--registers" in capsys.readouterr().out
