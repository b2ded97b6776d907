"""Integer arguments: Python and numpy integers are ints; bools, floats and strings are not.

One rule for every host integer the package takes (the module's sizes, window bounds, ``InferenceParams``'
sizes), so a size computed with numpy works everywhere and ``True`` never passes for 1.
"""

from __future__ import annotations

import operator

import torch

__all__ = ["as_int", "integer_argument"]


def as_int(value: object) -> int | None:
    """``value`` as a Python int if it is an integer (``operator.index`` takes it: numpy integers, integer tensors of
    one element) and not a bool (nor a bool tensor), else None.

    Example:
        >>> as_int(3), as_int(True), as_int(2.0)
        (3, None, None)
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_" or (
            isinstance(value, torch.Tensor) and value.dtype == torch.bool):   # (numpy 1.x's bool is bool_)
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def integer_argument(name: str, value: object, minimum: int) -> int:
    """``value`` as an int (a Python or numpy integer, not a bool, a float or a string) of at least ``minimum``,
    else a ValueError naming the argument.

    Example:
        >>> integer_argument("num_attention_heads", 32, 1)
        32
        >>> integer_argument("page_size", 0, 1)
        Traceback (most recent call last):
            ...
        ValueError: page_size must be an int >= 1; got 0
    """
    number = as_int(value)
    if number is None or number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return number
