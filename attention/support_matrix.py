"""The support matrix of ``docs/backends.md``, generated from the backends' capability sheets.

    python -m attention.support_matrix            # print the generated block
    python -m attention.support_matrix --write    # rewrite the block in docs/backends.md
    python -m attention.support_matrix --check    # exit 1 when docs/backends.md is stale

One row per :class:`~attention.backends.base.Capabilities` field, one column per registered backend
(``attention.selection.registry()``, in its order). Only the text between the two markers is
generated; the hand-written introduction above it is kept. What a backend rejects beyond its sheet
(its ``extra_reasons``) is not in the table: a backend may list such rules as ``notes`` (a tuple of
strings on the class), which become footnotes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path

import torch

from attention import selection
from attention.backends.base import ALL_MASKS, Backend, Capabilities

BEGIN = "<!-- BEGIN GENERATED: support matrix (python -m attention.support_matrix --write) -->"
END = "<!-- END GENERATED: support matrix -->"
DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "backends.md"

_DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_DTYPE_ORDER = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
_MASK_ORDER = ("no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right",
               "arbitrary")
_FORMAT_ORDER = ("bshd", "sbhd", "thd")
_BIAS_ORDER = ("no_bias", "pre_scale_bias", "post_scale_bias", "alibi")
_SOFTMAX_ORDER = ("vanilla", "off-by-one", "learnable")
_DEVICE_ORDER = ("cuda", "cpu", "mps", "xpu", "meta")
_KV_CACHE_ORDER = ("non_paged", "paged")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _ordered(values: frozenset, order: Sequence, name: Callable[[object], str] = str) -> str:
    known = [name(v) for v in order if v in values]
    extra = sorted(name(v) for v in values if v not in order)
    return ", ".join(known + extra) if values else "none"


def _dtypes(c: Capabilities) -> str:
    return _ordered(c.dtypes, _DTYPE_ORDER, lambda d: _DTYPE_NAMES.get(d, str(d).replace("torch.", "")))


def _arch(c: Capabilities) -> str:
    if "cuda" not in c.device_types:
        return "no CUDA"
    if c.compute_capabilities:
        exact = ", ".join("sm%d%d" % cc for cc in sorted(c.compute_capabilities))
        if c.min_compute_capability and any(cc < c.min_compute_capability for cc in c.compute_capabilities):
            exact += " (sm%d%d+)" % c.min_compute_capability
        return exact
    if c.min_compute_capability:
        return "sm%d%d+" % c.min_compute_capability
    return "any"


def _masks(c: Capabilities) -> str:
    missing = [m for m in _MASK_ORDER if m not in c.mask_types]
    if not missing and c.mask_types <= ALL_MASKS:
        return "all"
    if len(missing) <= 2 and c.mask_types:
        return "all but " + ", ".join(missing)
    return _ordered(c.mask_types, _MASK_ORDER)


def _head_dims(c: Capabilities) -> str:
    parts = []
    if c.max_head_dim is not None:
        parts.append(f"≤ {c.max_head_dim}")
    if c.head_dim_multiple > 1:
        parts.append(f"multiple of {c.head_dim_multiple}")
    return ", ".join(parts) if parts else "any"


def _page_sizes(c: Capabilities) -> str:
    if "paged" not in c.kv_cache:
        return "n/a"
    return "any" if c.page_size_multiple == 1 else f"multiple of {c.page_size_multiple}"


def _tolerances(c: Capabilities) -> str:
    if not c.tolerances:
        return "n/a"
    items = sorted(c.tolerances.items(), key=lambda kv: _DTYPE_ORDER.index(kv[0]) if kv[0] in _DTYPE_ORDER else 9)
    return ", ".join(f"{_DTYPE_NAMES.get(d, d)} {atol:g}/{rtol:g}" for d, (atol, rtol) in items)


#: (row label, the Capabilities fields it shows, how to render them). Every field appears once.
ROWS: tuple[tuple[str, tuple[str, ...], Callable[[Capabilities], str]], ...] = (
    ("dtypes", ("dtypes",), _dtypes),
    ("devices", ("device_types",), lambda c: _ordered(c.device_types, _DEVICE_ORDER)),
    ("CUDA arch", ("min_compute_capability", "compute_capabilities"), _arch),
    ("qkv formats", ("qkv_formats",), lambda c: _ordered(c.qkv_formats, _FORMAT_ORDER)),
    ("mask types", ("mask_types",), _masks),
    ("head dims", ("max_head_dim", "head_dim_multiple"), _head_dims),
    ("MLA (d_qk ≠ d_v)", ("mla",), lambda c: _yes(c.mla)),
    ("sliding window", ("sliding_window",), lambda c: _yes(c.sliding_window)),
    ("bias types", ("bias_types",), lambda c: _ordered(c.bias_types, _BIAS_ORDER)),
    ("softmax types (sinks)", ("softmax_types",), lambda c: _ordered(c.softmax_types, _SOFTMAX_ORDER)),
    ("dropout", ("dropout",), lambda c: _yes(c.dropout)),
    ("backward", ("backward",), lambda c: _yes(c.backward)),
    ("padding between thd sequences", ("pad_between_seqs",), lambda c: _yes(c.pad_between_seqs)),
    ("KV cache", ("kv_cache",), lambda c: _ordered(c.kv_cache, _KV_CACHE_ORDER, lambda k: str(k).replace("_", "-"))),
    ("paged page size", ("page_size_multiple",), _page_sizes),
    ("CUDA graph capture", ("cuda_graphs",), lambda c: _yes(c.cuda_graphs)),
    ("deterministic", ("deterministic",), lambda c: _yes(c.deterministic)),
    ("num_splits ≠ 1 (split KV)", ("num_splits",), lambda c: _yes(c.num_splits)),
    ("return_max_logit", ("return_max_logit",), lambda c: _yes(c.return_max_logit)),
    ("test tolerance (atol/rtol)", ("tolerances",), _tolerances),
)


def covered_fields() -> set[str]:
    return {name for _, names, _ in ROWS for name in names}


def render_table(backends: dict[str, Backend] | None = None) -> str:
    """The markdown table: one row per capability, one column per backend."""
    backends = selection.registry() if backends is None else backends
    missing = {f.name for f in fields(Capabilities)} - covered_fields()
    if missing:
        raise RuntimeError(f"support matrix has no row for Capabilities field(s) {sorted(missing)}")
    names = list(backends)
    lines = ["| capability | " + " | ".join(f"`{n}`" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for label, _, render in ROWS:
        cells = [render(backends[n].capabilities).replace("|", "\\|") for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _notes(backends: dict[str, Backend]) -> list[str]:
    out = []
    for name, backend in backends.items():
        out += [f"- `{name}`: {note}" for note in getattr(backend, "notes", ())]
    return out


def generated_block(backends: dict[str, Backend] | None = None) -> str:
    """Everything between (and including) the two markers."""
    backends = selection.registry() if backends is None else backends
    parts = [
        BEGIN,
        "",
        "Automatic priority (first backend that can run the call wins): "
        + " → ".join(f"`{n}`" for n in selection.PRIORITY) + ".",
        "",
        render_table(backends),
    ]
    notes = _notes(backends)
    if notes:
        parts += ["", "Rules beyond the table:", "", *notes]
    parts += ["", END]
    return "\n".join(parts)


def update(text: str, block: str | None = None) -> str:
    """``text`` with its generated block replaced (or appended when it has no markers)."""
    block = generated_block() if block is None else block
    if BEGIN not in text and END not in text:
        return text.rstrip("\n") + "\n\n" + block + "\n"
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected exactly one {BEGIN!r} ... {END!r} pair")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return head + block + tail


def current_block(text: str) -> str | None:
    """The generated block as it stands in ``text`` (markers included), or None."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        return None
    start = text.index(BEGIN)
    return text[start : text.index(END) + len(END)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attention.support_matrix", description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"rewrite the block in {DOC_PATH}")
    group.add_argument("--check", action="store_true", help="exit 1 when the file disagrees with the code")
    parser.add_argument("--path", type=Path, default=DOC_PATH, help="the markdown file (default: docs/backends.md)")
    args = parser.parse_args(argv)
    block = generated_block()
    if args.write:
        text = args.path.read_text() if args.path.exists() else "# Backends\n"
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(update(text, block))
        print(f"wrote the support matrix to {args.path}")
        return 0
    if args.check:
        text = args.path.read_text() if args.path.exists() else ""
        if current_block(text) != block:
            print(f"{args.path} is stale: run python -m attention.support_matrix --write", file=sys.stderr)
            return 1
        return 0
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
