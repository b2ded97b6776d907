"""Mask types, sliding windows and ALiBi slopes, with TransformerEngine's normalisation rules.

Conventions (TE's): a window is ``(left, right)``; query ``i`` may attend key ``j`` when
``i + off - left <= j <= i + off + right`` where ``off`` is the diagonal offset (``s_kv - s_q`` for
bottom-right alignment, ``0`` for top-left) and ``-1`` leaves that side unbounded.
"""

from __future__ import annotations

from attention import user_warnings
from attention.integers import as_int

WINDOW_BOUND_LIMIT = 1 << 30
"""Window bounds of this many tokens or more reach past any sequence (a KV cache holds fewer tokens) and are
clamped to it: the kernels add a bound to a position in int32, where 2**31 - 1 wrapped to a negative window."""

MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)

_ALIASES = {"causal_padding": "padding_causal", "causal_padding_bottom_right": "padding_causal_bottom_right"}


def normalize_mask_type(attn_mask_type: str) -> str:
    """Return the canonical mask name: commas become ``_`` and ``causal_padding`` -> ``padding_causal``.

    >>> normalize_mask_type("padding,causal")
    'padding_causal'
    """
    if not isinstance(attn_mask_type, str):
        raise ValueError(f"attn_mask_type must be a string, one of {MASK_TYPES}; got {attn_mask_type!r}")
    name = attn_mask_type.strip().lower().replace(",", "_")
    name = _ALIASES.get(name, name)
    if name not in MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {MASK_TYPES} (commas allowed); got {attn_mask_type!r}")
    return name


def is_causal(attn_mask_type: str) -> bool:
    return "causal" in attn_mask_type


def has_padding(attn_mask_type: str) -> bool:
    return "padding" in attn_mask_type


def check_set_window_size(attn_mask_type: str, window_size: tuple[int, int] | None,
                          warn: bool = True) -> tuple[int, int]:
    """Normalise ``window_size`` for a mask type, as TE's ``check_set_window_size`` does.

    Causal masks take ``(-1, 0)`` or ``(left >= 0, 0)``: ``None`` becomes ``(-1, 0)`` and a non-zero
    right side is forced to 0 with a warning. Other masks take ``(-1, -1)`` or ``(>= 0, >= 0)``:
    ``None`` becomes ``(-1, -1)`` and ``(-1, 0)`` becomes ``(-1, -1)`` with a warning (``warn=False``: silently).
    Any other negative value is a ``ValueError``; bounds past WINDOW_BOUND_LIMIT are clamped to it.

    Example:
        >>> check_set_window_size("no_mask", (128, 2**31 - 1))
        (128, 1073741824)
    """
    if window_size is not None:
        if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
            raise ValueError(f"window_size must be a (left, right) pair of ints; got {window_size!r}")
        left, right = _window_bound(window_size[0], window_size), _window_bound(window_size[1], window_size)
    if is_causal(attn_mask_type):
        if window_size is None:
            return (-1, 0)
        if left == -1 and right not in (-1, 0):   # TE asserts: an unbounded left with a right side
            raise ValueError(
                f"window_size for mask {attn_mask_type!r} must be (-1, 0), (-1, -1) or (left >= 0, right); "
                f"got {window_size!r}"
            )
        if right != 0:
            if warn:
                user_warnings.warn(
                    f"window_size={window_size} has right != 0 for mask {attn_mask_type}; using ({left}, 0)")
        return (left, 0)
    if window_size is None:
        return (-1, -1)
    if (left, right) == (-1, 0):
        if warn:
            user_warnings.warn(f"window_size=(-1, 0) with mask {attn_mask_type} is not causal; using (-1, -1)")
        return (-1, -1)
    if (left == -1) != (right == -1):
        raise ValueError(
            f"window_size for mask {attn_mask_type!r} must be (-1, -1) or two values >= 0; got {window_size!r}"
        )
    return (left, right)


def _window_bound(value: object, window_size: object) -> int:
    """One side of a window as an int (numpy integers too, not bools), >= -1, at most WINDOW_BOUND_LIMIT."""
    bound = as_int(value)
    if bound is None:
        raise ValueError(f"window_size must be a (left, right) pair of ints; got {window_size!r}")
    if bound < -1:
        raise ValueError(f"window_size values must be >= -1 (-1 = unbounded); got {window_size!r}")
    return min(bound, WINDOW_BOUND_LIMIT)


def resolve_bottom_right(attn_mask_type: str, bottom_right_diagonal: bool | None) -> bool:
    """Diagonal alignment: top-left for ``causal``/``padding_causal``, bottom-right for ``*_bottom_right``,
    else ``bottom_right_diagonal`` (default bottom-right)."""
    if not (bottom_right_diagonal is None
            or bottom_right_diagonal in (True, False) and isinstance(bottom_right_diagonal, int)):
        raise ValueError(f"bottom_right_diagonal must be True, False (or 1 / 0) or None; got {bottom_right_diagonal!r}")
    if attn_mask_type in ("causal", "padding_causal"):
        return False
    if attn_mask_type.endswith("bottom_right"):
        return True
    return True if bottom_right_diagonal is None else bool(bottom_right_diagonal)


def is_trivial_window(window_size: tuple[int, int]) -> bool:
    """True when the window adds nothing beyond the mask type (no limit, or plain causal)."""
    return window_size[0] == -1 and window_size[1] in (-1, 0)


def default_alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi slopes of the paper (and TE): geometric in the largest power of two <= heads, then interleaved."""
    n = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= num_heads
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * (2 * m - 1) / n) for m in range(1, num_heads - n + 1)]
    return slopes
