"""argparse ``type`` functions for the benchmark scripts' counts and durations (no torch import: tree_ab and
power parse their arguments before any tree is loaded).

Example::

    parser.add_argument("--rounds", type=positive_int, default=2)   # "--rounds 0" -> "must be a positive integer"
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def _number(kind: type, words: str, accept: Callable[[float], bool]) -> Callable[[str], Any]:
    """An argparse ``type`` that refuses values outside ``accept`` (and nan) with ``must be <words>``."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {words}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse's own error for unparsable text names the type: "invalid int value"
    return parse


positive_int = _number(int, "a positive integer", lambda v: v >= 1)
non_negative_int = _number(int, "a non-negative integer", lambda v: v >= 0)
positive_float = _number(float, "a positive number", lambda v: v > 0)
non_negative_float = _number(float, "a non-negative number", lambda v: v >= 0)
