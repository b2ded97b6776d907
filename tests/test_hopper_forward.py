"""Host side of the Gluon sm90 kernel (attention/kernels/hopper_forward.py) on CPU: the 2-D row views its
descriptors read, and the refusal off sm90 (the kernel itself runs in tests/gpu/test_hopper_gpu.py and
compiles for sm90 in tests/sm90_compile.py)."""

from __future__ import annotations

import pytest
import torch

from attention.kernels.hopper_forward import _rows_matrix, hopper_unsupported_reason


def test_thd_and_bshd_are_row_matrices() -> None:
    thd = torch.randn(10, 4, 8)
    matrix, batch_rows = _rows_matrix(thd)
    assert matrix.shape == (10, 32) and batch_rows == 0 and torch.equal(matrix, thd.reshape(10, 32))
    matrix, batch_rows = _rows_matrix(thd.unsqueeze(0).expand(3, -1, -1, -1))  # thd as the launcher sees it
    assert matrix.shape == (10, 32) and batch_rows == 0
    bshd = torch.randn(3, 5, 4, 8)
    matrix, batch_rows = _rows_matrix(bshd)
    assert matrix.shape == (15, 32) and batch_rows == 5 and torch.equal(matrix[5:10], bshd[1].reshape(5, 32))
    qkv = torch.randn(10, 3, 4, 8)  # q of a packed qkv: rows 3 x 32 apart
    matrix, _ = _rows_matrix(qkv[:, 0])
    assert matrix.stride() == (96, 1) and torch.equal(matrix[7], qkv[7, 0].reshape(32))


@pytest.mark.parametrize("name, tensor", [
    ("sbhd", torch.randn(5, 3, 4, 8).transpose(0, 1)),
    ("heads not packed", torch.randn(10, 8, 4).transpose(1, 2)),
    ("misaligned", torch.randn(10 * 32 + 1)[1:].view(10, 4, 8)),
    ("rows not 16-byte multiples", torch.randn(10, 3, 3)),
])
def test_other_layouts_are_refused(name: str, tensor: torch.Tensor) -> None:
    assert _rows_matrix(tensor) is None, name


def test_off_sm90_the_general_kernel_runs() -> None:
    q = torch.randn(10, 4, 128, dtype=torch.bfloat16)
    reason = hopper_unsupported_reason(q, q, q, q, page_size=0, window=(-1, 0), alibi=False, sink=False)
    assert reason is not None and "sm90" in reason
