"""`make gpu-test` (scripts/gpu_tests.sh) runs every GPU test file: each one named in a shard."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_gpu_test_file_runs_in_a_shard() -> None:
    script = (ROOT / "scripts" / "gpu_tests.sh").read_text()
    missing = [path.name for path in sorted((ROOT / "tests" / "gpu").glob("test_*.py")) if path.name not in script]
    assert not missing, f"not in a shard of scripts/gpu_tests.sh: {missing}"


@pytest.mark.parametrize("script, first_words", [("gpu_tests.sh", "The GPU test suite"),
                                                  ("ci_local.sh", "Run CI's command as CI does")])
def test_help_prints_the_usage_and_an_unknown_option_is_refused(script: str, first_words: str) -> None:
    """--help used to start eight shards writing logs to a directory named --help (gpu_tests.sh), or a CI run in a
    fresh clone logging to a file named --help (ci_local.sh)."""
    import subprocess

    script = str(ROOT / "scripts" / script)
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and shown.stdout.startswith(first_words) and "Usage:" in shown.stdout
    refused = subprocess.run(["bash", script, "-k"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "unknown option -k" in refused.stderr
    assert not (ROOT / "--help").exists() and not (ROOT / "-k").exists()
