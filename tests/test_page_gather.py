"""The page copy before a prefill over small pages (attention/kernels/page_gather.py): its rule, and
that a call which takes it computes the same attention as over the pages."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import attention_fwd, triton_available
from attention.kernels.configs import GATHER_MAX_BYTES, GATHER_MAX_PAGE_SIZE, GATHER_MIN_PACKED_ROWS
from attention.kernels.page_gather import gather_pages, gathered_page_count
from tests.test_kernels import MIXED_KV, MIXED_Q, C, check_with_config, interpreted_config

pytestmark = [pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
              pytest.mark.skipif(triton_available() is not None, reason=str(triton_available()))]

# A 2k chunk on a 6k prefix, GQA 32/8 d128 bf16, 16-token pages: the rule copies its pages.
CHUNK = dict(page_size=16, table_pages=512, num_seqs=1, total_q=2048, group_size=4, max_seqlen_kv=8192,
             kv_row_bytes=8 * 2 * 128 * 2, window_bounded=False, forced=False)


@pytest.mark.parametrize("change, pages", [
    ({}, 512),
    ({"max_seqlen_kv": 8000}, 500),                                   # pages cover the longest sequence
    ({"table_pages": 300}, 300),                                      # ... within the table
    ({"page_size": GATHER_MAX_PAGE_SIZE}, 0),                         # pages holding whole tiles stay paged
    ({"total_q": GATHER_MIN_PACKED_ROWS // 4 - 1}, 0),                # too few query rows per sequence
    ({"num_seqs": 129, "total_q": 2048 + 128}, 0),                    # a prefill beside 128 decodes
    ({"window_bounded": True}, 0),                                    # a sliding window reads a band only
    ({"kv_row_bytes": GATHER_MAX_BYTES // 8192 + 1}, 0),              # the copy would not fit
    ({"page_size": 256, "total_q": 16, "forced": True}, 32),          # an explicit config forces it ...
    ({"window_bounded": True, "forced": True}, 0),                    # ... but not past a window
])
def test_the_rule_copies_only_what_pays(change: dict, pages: int) -> None:
    assert gathered_page_count(**{**CHUNK, **change}) == pages


def test_gather_pages_lays_sequences_out_in_rows() -> None:
    """Token t of sequence b lands at row (b, t); out-of-range table entries are clamped, not read."""
    k = torch.arange(5 * 2 * 3 * 4, dtype=torch.float32).view(5, 2, 3, 4)
    v = -k
    table = torch.tensor([[4, 0, 1 << 20], [2, -1, 7]], dtype=torch.int32)
    gk, gv = gather_pages(k, v, table, 2)
    assert gk.shape == (2, 4, 3, 4) and gk.is_contiguous()
    torch.testing.assert_close(gk[0], torch.cat([k[4], k[0]]))
    torch.testing.assert_close(gv[1, :2], v[2])


@pytest.mark.parametrize("page_size, causal, window, dtype", [
    (16, True, (-1, -1), torch.float16), (3, True, (-1, -1), torch.float32), (1, False, (-1, -1), torch.float16),
    (3, True, (4, 0), torch.float32)], ids=["page16-causal", "page3-causal", "page1-full", "page3-window"])
def test_gathered_pages_match_the_reference(monkeypatch: pytest.MonkeyPatch, page_size, causal, window, dtype) -> None:
    """gather_pages=True over a mixed batch (cache slots no sequence owns hold NaN, table entries past a
    sequence's pages point outside the cache), with and without splits: the same attention, and the
    launch went through a copy unless a sliding window bounds the walk."""
    copies = []
    monkeypatch.setattr(attention_fwd, "_plans", {})
    monkeypatch.setattr(attention_fwd, "gather_pages", lambda *args: copies.append(args[3]) or gather_pages(*args))
    case = C(MIXED_Q, MIXED_KV, heads=(4, 2), layout="paged", page_size=page_size, causal=causal,
             bottom_right=True, window=window, num_splits=None, dtype=dtype)
    check_with_config(case, interpreted_config(case, gather_pages=True), split_counts=(1, 3))
    assert len(copies) == (0 if window[0] >= 0 else 2)
    assert all(pages >= -(-max(MIXED_KV) // page_size) for pages in copies)  # every page of the longest sequence
