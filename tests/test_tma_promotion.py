"""The L2-promotion knob's host side (attention.kernels.tma_promotion): parsing, and which makers it wraps. The
re-encoding itself needs a GPU (docs/results/2026-12-06-h100-dd9d8e8/scripts/check_promotion.py)."""

import pytest

from attention.kernels.tma_promotion import (
    DECODE_PROMOTION_ENV,
    PREFILL_PROMOTION_ENV,
    Promoted,
    l2_promotion,
    promoted,
)


class Maker:
    block = (64, 128)

    def __call__(self, x):
        return ("descriptor", x)


@pytest.mark.parametrize("value, expected", [("none", 0), ("64", 1), ("128", 2), (" 256 ", 3), ("NONE", 0)])
def test_values(monkeypatch, value, expected):
    monkeypatch.setenv(DECODE_PROMOTION_ENV, value)
    assert l2_promotion(DECODE_PROMOTION_ENV) == expected


def test_unset_leaves_the_maker(monkeypatch):
    monkeypatch.delenv(PREFILL_PROMOTION_ENV, raising=False)
    maker = Maker()
    assert promoted(maker, PREFILL_PROMOTION_ENV) is maker


def test_set_wraps_the_maker(monkeypatch):
    monkeypatch.setenv(PREFILL_PROMOTION_ENV, "256")
    monkeypatch.delenv(DECODE_PROMOTION_ENV, raising=False)
    maker = Maker()
    wrapped = promoted(maker, PREFILL_PROMOTION_ENV)
    assert isinstance(wrapped, Promoted) and wrapped.l2_promotion == 3
    assert wrapped.block == (64, 128) and wrapped(7) == ("descriptor", 7)
    assert promoted(maker, DECODE_PROMOTION_ENV) is maker   # each knob names its own descriptors


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(DECODE_PROMOTION_ENV, "512")
    with pytest.raises(ValueError, match=f"{DECODE_PROMOTION_ENV}='512'.*none, 64, 128, 256"):
        l2_promotion(DECODE_PROMOTION_ENV)
