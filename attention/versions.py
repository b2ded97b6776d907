"""Installed packages' versions, read from their distribution records (nothing imported)."""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["installed_version", "parse_version"]


def installed_version(*distributions: str) -> str | None:
    """The version of the first of ``distributions`` installed, or None (one package may ship under several names:
    torch's nightlies ship Triton as pytorch-triton)."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """``"2.8.3.post1"`` -> ``(2, 8, 3)``; ``"4.0.0b36"`` -> ``(4, 0, 0)``; None if no digits lead."""
    if not text:
        return None
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(x) for x in match.group(1).split(".")) if match else None
