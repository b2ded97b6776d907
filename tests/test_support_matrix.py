"""docs/backends.md must hold exactly what ``python -m attention.support_matrix`` generates."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attention import support_matrix
from attention.backends.base import Backend, Capabilities


def test_docs_backends_md_matches_the_capability_sheets() -> None:
    text = support_matrix.DOC_PATH.read_text()
    assert support_matrix.current_block(text) == support_matrix.generated_block(), (
        "docs/backends.md disagrees with the capability sheets; run `python -m attention.support_matrix --write`"
    )
    assert support_matrix.main(["--check"]) == 0


def test_every_capability_field_has_a_row() -> None:
    assert support_matrix.covered_fields() == {f.name for f in dataclasses.fields(Capabilities)}


def test_one_column_per_registered_backend() -> None:
    header = support_matrix.render_table().splitlines()[0]
    for name in ("fused", "flash2", "flash3", "flash4", "unfused"):
        assert f"`{name}`" in header


def test_a_changed_sheet_makes_the_check_fail(tmp_path, capsys) -> None:
    class Tiny(Backend):
        name = "tiny"
        capabilities = Capabilities(dtypes=frozenset({torch.float16}), mask_types=frozenset({"causal"}),
                                    kv_cache=frozenset(), max_head_dim=128, compute_capabilities=frozenset({(9, 0)}))
        notes = ("causal is bottom-right only",)

    block = support_matrix.generated_block({"tiny": Tiny()})
    assert "| dtypes | fp16 |" in block and "| paged page size | n/a |" in block
    assert "| CUDA arch | sm90 |" in block and "| head dims | ≤ 128 |" in block
    assert "- `tiny`: causal is bottom-right only" in block
    doc = tmp_path / "backends.md"
    doc.write_text("# Intro written by hand\n\n" + block + "\n")
    assert support_matrix.main(["--check", "--path", str(doc)]) == 1
    assert "stale" in capsys.readouterr().err
    assert support_matrix.main(["--write", "--path", str(doc)]) == 0
    assert support_matrix.main(["--check", "--path", str(doc)]) == 0
    assert doc.read_text().startswith("# Intro written by hand\n\n" + support_matrix.BEGIN)


def test_update_keeps_the_text_around_the_block() -> None:
    text = f"intro\n{support_matrix.BEGIN}\nold\n{support_matrix.END}\noutro\n"
    assert support_matrix.update(text, "NEW") == "intro\nNEW\noutro\n"
    with pytest.raises(ValueError, match="exactly one"):
        support_matrix.update(text + support_matrix.BEGIN, "NEW")
