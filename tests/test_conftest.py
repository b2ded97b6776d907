"""The suite's own header: on a CUDA machine outside the interpreter it names the tests that fail there and the
command that runs them (`make test` hides the GPU); in the interpreter, a numpy it cannot use."""

from types import SimpleNamespace

import pytest
import torch

from attention.kernels import availability
from tests import conftest


def _config(markexpr: str = "not gpu") -> SimpleNamespace:
    return SimpleNamespace(option=SimpleNamespace(markexpr=markexpr))


@pytest.mark.parametrize(
    "cuda, interpret, markexpr, warned",
    [
        (True, None, "not gpu", True),
        (True, None, "", True),
        (True, "1", "not gpu", False),   # the interpreter takes CPU tensors
        (True, None, "gpu", False),      # only the GPU tests run
        (False, None, "not gpu", False),  # conftest turns the interpreter on
    ],
)
def test_the_header_warns_only_where_cpu_tests_cannot_pass(monkeypatch, cuda, interpret, markexpr, warned):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    monkeypatch.setattr(availability, "interpreter_numpy_conflict", lambda: None)   # whatever numpy this host has
    header = conftest.pytest_report_header(_config(markexpr))
    assert bool(header) == warned
    if warned:
        assert "CPU tests" in header[0] and "`make test`" in header[0]


def test_the_header_names_the_interpreters_numpy_conflict(monkeypatch) -> None:
    """A run in an environment the conflict applies to says so once, at the top, beside the failures it causes."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(availability, "interpreter_numpy_conflict", lambda: "Triton 3.6.0's interpreter cannot run")
    assert conftest.pytest_report_header(_config()) == [
        "Triton 3.6.0's interpreter cannot run: the tests that run the kernels fail or skip with this reason"]
    monkeypatch.setattr(availability, "interpreter_numpy_conflict", lambda: None)
    assert conftest.pytest_report_header(_config()) == []
