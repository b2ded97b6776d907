"""The suite's own header: on a CUDA machine outside the interpreter it names the tests that fail there and the
command that runs them (`make test` hides the GPU)."""

from types import SimpleNamespace

import pytest
import torch

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
    header = conftest.pytest_report_header(_config(markexpr))
    assert (header is not None) == warned
    if warned:
        assert "CPU tests" in header and "`make test`" in header
