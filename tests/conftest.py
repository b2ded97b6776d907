"""Shared pytest configuration: the ``gpu`` marker, the Triton interpreter on CPU, a fixed seed."""

import os

import pytest
import torch

# Without a GPU the Triton kernels run in the interpreter (slow, for correctness only). This has to
# happen before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the lent H200)")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What this environment does to the CPU tests: on a CUDA machine outside the interpreter (but for a run of only
    the GPU tests), which fail there and the command that runs them; in the interpreter, a numpy it cannot use."""
    from attention.kernels.availability import interpreter_enabled, interpreter_numpy_conflict  # (import no Triton)

    if interpreter_enabled():
        conflict = interpreter_numpy_conflict()
        return [f"{conflict}: the tests that run the kernels fail or skip with this reason"] if conflict else []
    if not torch.cuda.is_available() or config.option.markexpr == "gpu":
        return []
    return ["CUDA is visible and TRITON_INTERPRET unset, so Triton compiles the kernels for the GPU: the CPU tests "
            "that hand them CPU tensors skip or fail here. `make test` runs the CPU suite as CI does "
            "(the GPU hidden)."]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `pytest -m gpu` on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def seed() -> None:
    """Seed torch's RNG so every test sees the same random tensors."""
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _clean_nvte_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests start with no NVTE_* switches set, whatever the shell has."""
    for name in list(os.environ):
        if name.startswith("NVTE_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    """Give a test's cached CUDA blocks back after it: scripts/gpu_tests.sh runs its shards on one GPU at once, and
    on an 80 GB H100 (2026-12-05) one shard's cache of 42 GiB left the others out of memory (38 tests failed there,
    all passing when run alone). Monkeypatch is undone after this teardown, so a CPU test's patches are still in place
    here: ``torch.cuda.is_available`` may answer True on a CPU build (CUDA was never initialised then), and
    ``torch.cuda.device`` may be a stand-in, which torch reads unless the device is passed as its index (on a CUDA
    host that teardown errored, 2026-12-06)."""
    yield
    if (torch.cuda.is_available() and torch.cuda.is_initialized()
            and torch.cuda.memory_reserved(torch.cuda.current_device()) > (1 << 30)):
        torch.cuda.empty_cache()


@pytest.fixture
def cpu_fused() -> None:
    """For tests that hand the fused backend CPU tensors: skipped where it cannot take them (tests/cpu_fused.py)."""
    from tests.cpu_fused import skip_without_cpu_fused

    skip_without_cpu_fused()
