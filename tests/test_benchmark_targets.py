"""benchmarks/targets.py: the issues' targets read off benchmark CSVs (no GPU: hand-made rows)."""

from __future__ import annotations

from benchmarks import targets
from benchmarks.harness import Row
from benchmarks.report import write_csv


def _rows(suite: str, cell: str, **us: float) -> list[Row]:
    return [Row(suite, "g", cell, provider, us=value) for provider, value in us.items()]


def _prefill_run(path, chunk_p16_us: float) -> str:
    rows = (_rows("prefill", "MHA full 4x4k", fused=100.0, flash2=115.0, flash4=90.0)
            + _rows("prefill", "MHA full 16x1k", fused=100.0, flash2=200.0, flash4=50.0)  # 1k: not a 0.8x cell
            + _rows("prefill", "chunk 2k on 6k p16", fused=chunk_p16_us, flash2=300.0)
            + _rows("prefill", "chunk 2k on 6k non-paged", fused=85.0, flash2=300.0)
            + [Row("prefill", "g", "MHA full 2x8k", "fused", status="error"), *_rows("prefill", "MHA full 2x8k",
                                                                                    flash4=1.0)])
    write_csv(rows, str(path))
    return str(path)


def test_prefill_targets_read_the_right_cells_and_name_the_misses(tmp_path) -> None:
    runs = {"a": targets.load(_prefill_run(tmp_path / "a.csv", 100.0)),
            "b": targets.load(_prefill_run(tmp_path / "b.csv", 90.0))}
    text = targets.report(runs)
    lines = {line.split(" (#")[0].lstrip("| "): line for line in text.splitlines()
             if line.startswith(("| fused", "| paged"))}
    # flash2: the worst cell is the 4x4k one (1.15x); both runs hold
    assert lines["fused >= 1.1x flash2, every cell"].count("1.150x (MHA full 4x4k); holds") == 3
    # flash4: only d128 cells with >= 4k keys count (16x1k at 0.5x does not); the errored 2x8k row is not read
    # in either run, so not in their median either
    flash4 = lines["fused >= 0.8x flash4, d128 with >= 4k keys"]
    assert flash4.count("0.900x (MHA full 4x4k); holds on 1; **1 not read**") == 3
    assert "- a: fused >= 0.8x flash4, d128 with >= 4k keys: MHA full 2x8k not read (fused error)" in text
    # paged chunk: 85 / 100 misses in run a, 85 / 90 holds in run b; the median (0.897x) misses
    paged = lines["paged chunk >= 0.9x non-paged (fused)"]
    assert "0.850x (chunk 2k on 6k p16); **1 of 1 miss**" in paged and "0.944x (chunk 2k on 6k p16); holds" in paged
    assert "- a: paged chunk >= 0.9x non-paged (fused): chunk 2k on 6k p16 0.850x" in text
    assert "- median of runs: paged chunk >= 0.9x non-paged (fused): chunk 2k on 6k p16 0.897x" in text
    # no decode rows: those targets print a dash in every column
    assert "| 1x8k p16 <= 20 µs (#6) | – | – | – |" in text


def test_decode_and_mixed_targets(tmp_path) -> None:
    rows = (_rows("decode", "1x8k p16", fused=25.0, sdpa_cudnn=22.0, flash2=30.0)
            + [Row("decode", "g", "64x4k p16", "fused", us=260.0, gbps=4134.0),
               Row("decode", "g", "64x4k p1", "fused", us=275.0, gbps=3900.0)]
            + _rows("decode", "64x4k non-paged", fused=257.0, sdpa_cudnn=250.0)
            + _mixed_rows("M1 2k prefill", 300.0, prefill={"fused": 80.0, "flash4": 70.0},
                          decodes={"fused": 250.0, "sdpa_cudnn": 260.0}))
    write_csv(rows, str(tmp_path / "results.csv"))
    text = targets.report({"run": targets.load(tmp_path / "results.csv")})
    assert "| 1x8k p16 <= 20 µs (#6) | 25.00 µs (1x8k p16); **1 of 1 miss** |" in text
    # the paged 64x4k cells have no competitor rows (no competitor can run them): nothing to hold them to, said
    assert "| 0.880x (1x8k p16); **2 of 2 miss**; 2 left out |" in text and "not read" not in text  # 1x8k, non-paged
    for cell in ("64x4k p16", "64x4k p1"):
        assert f"- run: fused >= 1.0x best competitor, every cell: {cell} left out (no competitor can run it)" in text
    assert "4.13 TB/s (64x4k p16); holds" in text  # the large cells only: 64x4k p1 is not one
    assert "1.070x (64x4k p1); **1 of 2 miss**" in text  # 275 / 257: more than 5 % slower than non-paged
    # the best of each part: flash-attn-4's prefill (70) and our decodes (250), not one provider's two calls
    assert "0.938x (M1 2k prefill); **1 of 1 miss**" in text


def _mixed_rows(name: str, fused: float, prefill: dict[str, float], decodes: dict[str, float]) -> list[Row]:
    """A whole mixed cell and its two part cells (named as bench_mixed names them)."""
    from benchmarks.bench_mixed import part_prefix

    part = part_prefix(name)
    return (_rows("mixed", name, fused=fused) + _rows("mixed", f"{part}prefill", **prefill)
            + _rows("mixed", f"{part}decodes", **decodes))


def test_a_target_names_the_cells_it_cannot_read(tmp_path) -> None:
    """A failed or skipped fused row, a competitor that could run and did not, a missing mixed part or a part whose
    competitor failed: each is counted and named, and the target does not hold (before, such cells dropped out and
    the target read "holds" on the rest). A cell that only our unfused ran beside fused, every competitor proper
    n/a, has nothing to be held to: not counted against the target, and named as left out."""
    rows = (_rows("decode", "128x2k p16", fused=246.0, sdpa_cudnn=247.0)
            + [Row("decode", "g", "64x4k p16", "fused", status="mismatch", us=300.0),
               *_rows("decode", "64x4k p16", sdpa_cudnn=245.0),
               Row("decode", "g", "1x8k p16", "sdpa_cudnn", status="error"),
               Row("decode", "g", "1x8k p16", "flash2", status="n/a"),
               *_rows("decode", "1x8k p16", fused=19.0, flash4=96.0),
               *_rows("decode", "ragged", fused=280.0, unfused=4000.0),
               Row("decode", "g", "ragged", "flash4", status="error"),
               *_rows("decode", "ragged, no flash-attn", fused=280.0, unfused=4000.0),
               Row("decode", "g", "ragged, no flash-attn", "flash4", status="n/a")]
            + _rows("mixed", "M2 2k chunk", fused=900.0) + _rows("mixed", "M2 part: prefill", fused=800.0)
            + _mixed_rows("M1 2k prefill", 300.0, prefill={"fused": 80.0, "sdpa_cudnn": 90.0},
                          decodes={"fused": 250.0, "sdpa_cudnn": 260.0})
            + [Row("mixed", "g", "M1 part: prefill", "flash4", status="error")])
    write_csv(rows, str(tmp_path / "run.csv"))
    text = targets.report({"run": targets.load(tmp_path / "run.csv")})
    assert "| fused >= 1.0x best competitor, every cell (#6) | 1.004x (128x2k p16); holds on 1; **3 not read**; " \
        "1 left out |" in text
    for line in ("64x4k p16 not read (fused mismatch)", "1x8k p16 not read (sdpa_cudnn error)",
                 "ragged not read (flash4 error)", "ragged, no flash-attn left out (no competitor can run it)"):
        assert f"- run: fused >= 1.0x best competitor, every cell: {line}" in text
    assert "| 1x8k p16 <= 20 µs (#6) | 19.00 µs (1x8k p16); holds |" in text  # fused's own time: read
    assert "| one launch <= 0.9x the best separate calls (#6) | **2 not read** |" in text
    assert "M2 2k chunk not read (1 part cells, not 2)" in text
    assert "M1 2k prefill not read (M1 part: prefill: flash4 error)" in text


def test_a_column_is_labelled_by_its_folder_or_by_label_equals_path() -> None:
    assert targets._label("runs/settled-b/prefill.csv") == ("settled-b", "runs/settled-b/prefill.csv")
    assert targets._label("b=x/y.csv") == ("b", "x/y.csv")
    assert targets._label("x/run-7.csv") == ("run-7", "x/run-7.csv")


def test_the_csvs_of_one_label_are_one_run(tmp_path) -> None:
    """A run's per-suite CSVs (one folder, or one label=) make one column; before, the last file of a label won."""
    for run, fused in (("a", 25.0), ("b", 19.0)):
        (tmp_path / run).mkdir()
        write_csv(_rows("decode", "1x8k p16", fused=fused, sdpa_cudnn=22.0), str(tmp_path / run / "decode.csv"))
        write_csv(_mixed_rows("M1", 280.0, prefill={"flash4": 70.0}, decodes={"sdpa_cudnn": 250.0}),
                  str(tmp_path / run / "mixed.csv"))
    runs = targets.load_runs([str(tmp_path / run / f"{suite}.csv") for run in "ab" for suite in ("decode", "mixed")])
    assert sorted(runs) == ["a", "b"] and sorted(runs["a"]) == ["decode", "mixed"]
    text = targets.report(runs)
    assert "| 1x8k p16 <= 20 µs (#6) | 25.00 µs (1x8k p16); **1 of 1 miss** | 19.00 µs (1x8k p16); holds |" in text
    assert "0.875x (M1); holds | 0.875x (M1); holds |" in text
    assert targets.load_runs([f"x={tmp_path / 'a' / 'decode.csv'}",
                              f"x={tmp_path / 'b' / 'mixed.csv'}"]).keys() == {"x"}


def test_a_suite_report_checks_the_targets_it_can(tmp_path) -> None:
    from benchmarks.report import markdown_report, read_csv

    rows = read_csv(_prefill_run(tmp_path / "run.csv", 100.0))
    text = markdown_report({"gpu": "test"}, {"prefill": rows})
    section = text.split("## Against the project's targets", 1)[1]
    assert "| fused >= 0.8x flash4, d128 with >= 4k keys (#7) | 0.900x (MHA full 4x4k); holds on 1; **1 not read** |" \
        in section
    assert "1x8k" not in section  # no decode rows: the decode targets are left out
    smoke = markdown_report({"gpu": "test"}, {"prefill": [Row("prefill", "g", "MHA full 2x48", "fused", us=1.0)]})
    assert "Against the project's targets" not in smoke  # nothing to check: no section


def test_a_suite_report_shows_a_target_whose_every_cell_went_unread() -> None:
    """run_all's report leaves out the targets a run cannot be checked against, but not one whose cells all failed
    (it dropped the 1x8k row when our 1x8k row errored)."""
    rows = [Row("decode", "g", "1x8k p16", "fused", status="error"), *_rows("decode", "1x8k p16", sdpa_cudnn=18.0)]
    text = targets.report({"run": targets.group_rows(rows)}, only_readable=True)
    assert "| 1x8k p16 <= 20 µs (#6) | **1 not read** |" in text
    assert "- run: 1x8k p16 <= 20 µs: 1x8k p16 not read (fused error)" in text
    assert "TB/s" not in text   # no large cell in the run: left out


def test_a_target_names_the_other_rows_it_needs(tmp_path) -> None:
    """A rival's row (flash2, flash4) or a non-paged row a paged cell is read against: the first that did not run is
    the reason a cell was not read."""
    rows = ([*_rows("prefill", "MHA full 4x4k", fused=100.0), Row("prefill", "g", "MHA full 4x4k", "flash2",
                                                                   status="error"),
             Row("prefill", "g", "MHA full 4x4k", "flash4", status="skipped")]
            + _rows("prefill", "chunk 2k on 6k p16", fused=90.0) + _rows("decode", "64x4k p64", fused=270.0))
    text = targets.report({"run": targets.group_rows(rows)})
    for line in ("fused >= 1.1x flash2, every cell: MHA full 4x4k not read (flash2 error)",
                 "fused >= 0.8x flash4, d128 with >= 4k keys: MHA full 4x4k not read (flash4 skipped)",
                 "paged chunk >= 0.9x non-paged (fused): chunk 2k on 6k p16 not read (fused (non-paged) absent)",
                 "64x4k paged <= 1.05x non-paged time: 64x4k p64 not read (fused (64x4k non-paged) absent)"):
        assert f"- run: {line}" in text


def test_a_target_declares_the_rows_it_needs_and_why_else_it_read_nothing() -> None:
    """The reasons come from the target's own ``needs`` and ``why_no_value``, whatever its value function is."""
    target = targets.Target("decode", 6, "made up", "x", 1.0, True, lambda cells: {}, lambda cells, name: True,
                            needs=lambda name: {"fused": name, "flash4 (base)": "base"},
                            why_no_value=lambda cells, name: f"{name}: nothing to compare")
    ran = {"fused": {"us": 1.0}}
    cells = {"a": ran, "b": {"fused": {"status": "error"}}}
    assert target.unread(cells, {}) == {"a": "flash4 (base) absent", "b": "fused error"}
    cells = {"a": ran, "base": {"flash4": {"us": 2.0}, "fused": ran["fused"]}}
    assert target.unread(cells, {"base": 1.0}) == {"a": "a: nothing to compare"}


def test_the_median_leaves_out_only_the_cells_no_run_judged(tmp_path) -> None:
    """A cell that a competitor ran in one run is judged in the median; one that no run could judge stays left out."""
    paths = []
    for label, flash4 in (("a", 300.0), ("b", None)):
        rows = (_rows("decode", "128x2k p16", fused=246.0, sdpa_cudnn=247.0)
                + _rows("decode", "ragged", fused=280.0, **({"flash4": flash4} if flash4 else {}))
                + _rows("decode", "64x4k p1", fused=275.0))
        write_csv(rows, str(tmp_path / f"{label}.csv"))
        paths.append(f"{label}={tmp_path / f'{label}.csv'}")
    text = targets.report(targets.load_runs(paths))
    assert "- b: fused >= 1.0x best competitor, every cell: ragged left out (no competitor can run it)" in text
    assert "- median of runs: fused >= 1.0x best competitor, every cell: 64x4k p1 left out" in text
    assert "- median of runs: fused >= 1.0x best competitor, every cell: ragged left out" not in text
