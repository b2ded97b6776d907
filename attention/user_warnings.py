"""Warnings that point at the user's line: the first frame outside this package and torch (``nn.Module.__call__``,
``torch.utils.checkpoint``, DDP), whatever the depth of the check that warns (a constructor's, or a call's).
Under ``torch.compile`` nothing is warned: dynamo cannot trace ``warnings.warn``, and a graph break would fail a
``fullgraph=True`` compile (the same call warns when run eagerly)."""

from __future__ import annotations

import os
import sys
import warnings

import torch

__all__ = ["warn"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def warn(message: str) -> None:
    """``warnings.warn(message, UserWarning)`` attributed to the first caller outside the package.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn("a")
        >>> caught[0].filename.endswith("user_warnings.py")   # a doctest's frame is not the package's
        False
    """
    if torch.compiler.is_compiling():
        return
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename.startswith(_TORCH)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, UserWarning, stacklevel=level + 1)
