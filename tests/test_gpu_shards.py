"""`make gpu-test` (scripts/gpu_tests.sh) runs every GPU test file: each one named in a shard."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_gpu_test_file_runs_in_a_shard() -> None:
    script = (ROOT / "scripts" / "gpu_tests.sh").read_text()
    missing = [path.name for path in sorted((ROOT / "tests" / "gpu").glob("test_*.py")) if path.name not in script]
    assert not missing, f"not in a shard of scripts/gpu_tests.sh: {missing}"
