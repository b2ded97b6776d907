"""``python -m attention.demo`` (make demo): a short run passes its own check, and its exit status says when a
backend asked for could not run."""

from __future__ import annotations

import pytest

from attention import demo

SHORT = ["--requests", "2", "--layers", "1", "--steps", "4", "--no-progress", "--device", "cpu"]


def test_a_short_run_passes_its_check(capsys) -> None:
    assert demo.main([*SHORT, "--backend", "unfused"]) == 0
    assert "pass" in capsys.readouterr().out


def test_a_backend_that_cannot_run_fails_the_run(capsys) -> None:
    assert demo.main([*SHORT, "--backend", "unfused,nonesuch"]) == 1
    out = capsys.readouterr().out
    assert "backend 'nonesuch' cannot run here" in out and "KV-cache serving demo" in out   # unfused's row
    assert demo.main([*SHORT, "--backend", "nonesuch"]) == 1
    out = capsys.readouterr().out
    assert "backend 'nonesuch' cannot run here" in out and "KV-cache serving demo" not in out   # no empty table


@pytest.mark.parametrize("option", ["--page-size", "--layers", "--threads"])
def test_sizes_below_one_are_parser_errors(option, capsys) -> None:
    with pytest.raises(SystemExit):
        demo.main([*SHORT, option, "0"])
    assert f"argument {option}: must be a positive integer, got 0" in capsys.readouterr().err
