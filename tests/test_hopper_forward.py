"""Host side of the Gluon sm90 kernel (attention/kernels/hopper_forward.py) on CPU: the 2-D row views its
descriptors read, the refusal off sm90, and the launch a plan makes, from the module down, with the kernel
stubbed (the kernel itself runs in tests/gpu/test_hopper_gpu.py and compiles for sm90 in
tests/sm90_compile.py)."""

from __future__ import annotations

import pytest
import torch

from attention.kernels import hopper_forward
from attention.kernels.hopper_forward import (
    HOPPER_GROUPS_ENV,
    HOPPER_L2_SECTION_ENV,
    HOPPER_PINGPONG_ENV,
    HOPPER_SMALL_PAGES_ENV,
    HOPPER_TILE,
    THREE_GROUP_REGISTERS,
    _page_size_reason,
    _rows_matrix,
    consumer_groups,
    hopper_unsupported_reason,
    plan_hopper_forward,
)


def test_thd_and_bshd_are_row_matrices() -> None:
    thd = torch.randn(10, 4, 8)
    matrix, batch_rows = _rows_matrix(thd)
    assert matrix.shape == (10, 32) and batch_rows == 0 and torch.equal(matrix, thd.reshape(10, 32))
    matrix, batch_rows = _rows_matrix(thd.unsqueeze(0).expand(3, -1, -1, -1))  # thd as the launcher sees it
    assert matrix.shape == (10, 32) and batch_rows == 0
    bshd = torch.randn(3, 5, 4, 8)
    matrix, batch_rows = _rows_matrix(bshd)
    assert matrix.shape == (15, 32) and batch_rows == 5 and torch.equal(matrix[5:10], bshd[1].reshape(5, 32))
    qkv = torch.randn(10, 3, 4, 8)  # q of a packed qkv: rows 3 x 32 apart
    matrix, _ = _rows_matrix(qkv[:, 0])
    assert matrix.stride() == (96, 1) and torch.equal(matrix[7], qkv[7, 0].reshape(32))


@pytest.mark.parametrize("name, tensor", [
    ("sbhd", torch.randn(5, 3, 4, 8).transpose(0, 1)),
    ("heads not packed", torch.randn(10, 8, 4).transpose(1, 2)),
    ("misaligned", torch.randn(10 * 32 + 1)[1:].view(10, 4, 8)),
    ("rows not 16-byte multiples", torch.randn(10, 3, 3)),
])
def test_other_layouts_are_refused(name: str, tensor: torch.Tensor) -> None:
    assert _rows_matrix(tensor) is None, name


def test_off_sm90_the_general_kernel_runs() -> None:
    q = torch.randn(10, 4, 128, dtype=torch.bfloat16)
    reason = hopper_unsupported_reason(q, q, q, q, page_size=0, window=(-1, 0), alibi=False, sink=False)
    assert reason is not None and "sm90" in reason


@pytest.mark.parametrize("page_size, switch, expected", [
    (128, "0", None), (512, "1", None),  # whole tiles per page: one TMA load a tile
    (16, "1", None), (32, "1", None), (64, "1", None),  # whole pages per tile: one TMA load a page
    (16, "0", "ATTN_FUSED_HOPPER_SMALL_PAGES=0"), (8, "1", "16 to 64 tokens"), (48, "1", "dividing 128"),
    (192, "1", "multiple of 128"),
])
def test_page_sizes_read_in_place(page_size: int, switch: str, expected: str | None,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOPPER_SMALL_PAGES_ENV, switch)
    reason = _page_size_reason(page_size, 128)
    assert reason is None if expected is None else expected in reason


class _RecordedLaunch:
    """Stands in for the Gluon kernel: ``kernel[grid](*args, **kwargs)`` records the arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getitem__(self, grid: tuple):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


KERNEL_ARGUMENTS = hopper_forward.attention_fwd_hopper_kernel.arg_names


def _planned_with_recorded_kernel(monkeypatch: pytest.MonkeyPatch, tokens: int, max_seqlen_kv: int) -> tuple:
    """Two thd sequences of 128 queries in ``tokens`` rows (GQA 4/2, d128, bf16, out filled with 7) planned for the
    Gluon prefill kernel, which a _RecordedLaunch replaces: (plan, the recorder, q, k, v, out, cu_seqlens)."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    q = torch.randn(tokens, 4, 128, dtype=torch.bfloat16)
    k = v = torch.randn(tokens, 2, 128, dtype=torch.bfloat16)
    out = torch.full_like(q, 7.0)
    q4, k4, v4, out4 = (x.unsqueeze(0).expand(2, -1, -1, -1) for x in (q, k, v, out))
    plan = plan_hopper_forward(q4, k4, v4, out4, num_seqs=2, max_seqlen_q=128, max_seqlen_kv=max_seqlen_kv,
                               total_q=tokens, softmax_scale=0.1, window=(-1, 0), bottom_right=False, page_size=0,
                               alibi=False, sink=False, has_q_start=True, has_kv_start=True, num_sms=4)
    assert isinstance(plan, hopper_forward.HopperPlan)
    return plan, kernel, q, k, v, out, torch.tensor([0, 128, 256], dtype=torch.int32)


@pytest.mark.parametrize("flat_out", [False, True])
def test_a_plan_launches_with_the_planned_output_row_stride(monkeypatch: pytest.MonkeyPatch, flat_out: bool) -> None:
    """packed_attention_forward hands a HopperPlan DotProductAttention's output with the heads flattened
    ([T, H * D]): the launch takes the token stride from the plan, not from that tensor's dims."""
    plan, kernel, q, k, v, out, cu = _planned_with_recorded_kernel(monkeypatch, 256, 4096)
    plan(q, k, v, out.flatten(-2) if flat_out else out, cu, cu, cu, cu, None)
    (_, args, _), = kernel.calls
    launched = dict(zip(KERNEL_ARGUMENTS, args))
    assert launched["out_ptr"].data_ptr() == out.data_ptr() and launched["stride_os"] == 4 * 128


@pytest.mark.parametrize("zero_tail", [False, True])
def test_a_zero_tail_launch_adds_the_tail_programs_and_no_memset(monkeypatch: pytest.MonkeyPatch,
                                                                 zero_tail: bool) -> None:
    """thd with rows past the last sequence (zero_tail): the kernel's grid gets one more sequence, whose programs
    zero rows cu_seqlens_q[-1] .. total_q - 1 (tail_rows = total_q); out itself is not written on the host (no
    memset of the whole output). Without zero_tail: the planned grid, tail_rows 0."""
    from attention.kernels.attention_fwd import launch_plan

    plan, kernel, q, k, v, out, cu = _planned_with_recorded_kernel(monkeypatch, 300, 128)
    launch_plan(plan, q, k, v, out, cu, cu, cu, cu, None, None, None, zero_tail)
    (grid, args, kwargs), = kernel.calls
    assert grid == ((*plan.grid[:2], plan.grid[2] + 1) if zero_tail else plan.grid)
    assert dict(zip(KERNEL_ARGUMENTS, args))["tail_rows"] == (300 if zero_tail else 0)
    assert kwargs["ZERO_TAIL"] is zero_tail   # (without it the extra sequence would read past cu_seqlens_q)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("qkv_format", ["thd", "bshd"])
def test_the_module_hands_a_hopper_plan_its_flat_output(monkeypatch: pytest.MonkeyPatch, qkv_format: str,
                                                       cpu_fused: None) -> None:
    """DotProductAttention -> fused backend -> packed_attention_forward -> HopperPlan, the kernel stubbed: the
    launch writes the module's own (heads-flattened) output, rows H * D apart."""
    from attention import DotProductAttention
    from attention.kernels import attention_fwd

    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    monkeypatch.setattr(attention_fwd, "_plans", {})
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    heads, heads_kv, head_dim, seqs, tokens = 4, 2, 128, 2, 256
    attn = DotProductAttention(heads, head_dim, num_gqa_groups=heads_kv, qkv_format=qkv_format,
                               attn_mask_type="padding_causal" if qkv_format == "thd" else "causal", backend="fused")
    shape = (seqs * tokens,) if qkv_format == "thd" else (seqs, tokens)
    q = torch.randn(*shape, heads, head_dim, dtype=torch.float16)
    k, v = (torch.randn(*shape, heads_kv, head_dim, dtype=torch.float16) for _ in range(2))
    extra = {}
    if qkv_format == "thd":
        cu = torch.tensor([0, tokens, 2 * tokens], dtype=torch.int32)
        extra = {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "max_seqlen_q": tokens, "max_seqlen_kv": tokens}
    out = attn(q, k, v, **extra)
    assert [type(plan).__name__ for plan in attention_fwd._plans.values()] == ["HopperPlan"]
    (_, args, _), = kernel.calls
    launched = dict(zip(KERNEL_ARGUMENTS, args))
    assert out.shape == (*shape, heads * head_dim)
    assert launched["out_ptr"].data_ptr() == out.data_ptr() and launched["stride_os"] == heads * head_dim


@pytest.mark.parametrize("head_dim, page_size, kv_block_rows", [
    (128, 16, 16), (128, 64, 64), (128, 256, 128), (256, 16, 16), (256, 64, 64), (256, 256, 64)])
def test_a_paged_plan_loads_a_page_or_a_tile_per_tma_load(monkeypatch: pytest.MonkeyPatch, head_dim: int,
                                                          page_size: int, kv_block_rows: int) -> None:
    """K / V descriptors over the page pool have blocks of one page when pages are smaller than a tile (128 keys, 64
    at head dim 256)."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    tokens, heads, heads_kv = 256, 4, 2
    q = torch.randn(1, tokens, heads, head_dim, dtype=torch.bfloat16)
    k = v = torch.randn(2048 // page_size, page_size, heads_kv, head_dim, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, v, torch.empty_like(q), num_seqs=1, max_seqlen_q=tokens, max_seqlen_kv=tokens,
                               total_q=tokens,
                               softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=page_size, alibi=False,
                               sink=False, has_q_start=False, has_kv_start=False, num_sms=4)
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    plan(q, k, v, torch.empty_like(q), cu, cu, None, None, torch.zeros(1, 8, dtype=torch.int32))
    (_, args, kwargs), = kernel.calls
    launched = dict(zip(KERNEL_ARGUMENTS, args))
    assert list(launched["k_desc"].block_shape) == list(launched["v_desc"].block_shape) == [kv_block_rows, head_dim]
    assert kwargs["PAGE_SIZE"] == page_size and kwargs["BLOCK_N"] == HOPPER_TILE[head_dim][0]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("switch", [None, "1", "0", "off"])
def test_the_consumer_ping_pong_follows_the_tile_table_unless_switched(monkeypatch: pytest.MonkeyPatch,
                                                                      head_dim: int, switch: str | None) -> None:
    """The launch's PINGPONG: HOPPER_TILE's per head dim (on at d64, off at d128), or ATTN_FUSED_HOPPER_PINGPONG's."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is None:
        monkeypatch.delenv(HOPPER_PINGPONG_ENV, raising=False)
    else:
        monkeypatch.setenv(HOPPER_PINGPONG_ENV, switch)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    q = torch.randn(1, 256, 4, head_dim, dtype=torch.bfloat16)
    k = v = torch.randn(1, 256, 2, head_dim, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, v, torch.empty_like(q), num_seqs=1, max_seqlen_q=256, max_seqlen_kv=256,
                               total_q=256, softmax_scale=0.1, window=(-1, 0), bottom_right=False, page_size=0,
                               alibi=False, sink=False, has_q_start=False, has_kv_start=False, num_sms=4)
    cu = torch.tensor([0, 256], dtype=torch.int32)
    if switch == "off":  # on/off variables take 0 or 1: "off" would otherwise read as the default, silently
        with pytest.raises(ValueError, match=HOPPER_PINGPONG_ENV):
            plan(q, k, v, torch.empty_like(q), cu, cu, None, None, None)
        return
    plan(q, k, v, torch.empty_like(q), cu, cu, None, None, None)
    (_, _, kwargs), = kernel.calls
    assert kwargs["PINGPONG"] is (HOPPER_TILE[head_dim][3] if switch is None else switch == "1")
    assert HOPPER_TILE[64][3] and not HOPPER_TILE[128][3]


@pytest.mark.parametrize("head_dim, switch, groups", [
    (64, None, 3), (64, "2", 2), (64, "3", 3), (128, None, 2), (128, "3", 2), (256, "3", 2)])
def test_consumer_groups_set_the_q_tile_and_the_registers(monkeypatch: pytest.MonkeyPatch, head_dim: int,
                                                          switch: str | None, groups: int) -> None:
    """HOPPER_TILE's consumer groups (three at d64), or ATTN_FUSED_HOPPER_GROUPS's at d64 only: q tiles of groups x 64
    queries in the grid, and the launch's GROUPS and registers (three groups: 16 warps at maxnreg 128)."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is None:
        monkeypatch.delenv(HOPPER_GROUPS_ENV, raising=False)
    else:
        monkeypatch.setenv(HOPPER_GROUPS_ENV, switch)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    tokens = 1000
    q = torch.randn(1, tokens, 4, head_dim, dtype=torch.bfloat16)
    k = v = torch.randn(1, tokens, 2, head_dim, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, v, torch.empty_like(q), num_seqs=1, max_seqlen_q=tokens, max_seqlen_kv=tokens,
                               total_q=tokens, softmax_scale=0.1, window=(-1, 0), bottom_right=False, page_size=0,
                               alibi=False, sink=False, has_q_start=False, has_kv_start=False, num_sms=4)
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    plan(q, k, v, torch.empty_like(q), cu, cu, None, None, None)
    (grid, _, kwargs), = kernel.calls
    assert grid == (-(-tokens // (64 * groups)) * 2, 2, 1)
    assert kwargs["GROUPS"] == groups and kwargs["maxnreg"] == {2: 168, 3: 128}[groups]
    assert kwargs["CONSUMER_REGISTERS"] == {2: HOPPER_TILE[head_dim][2], 3: THREE_GROUP_REGISTERS}[groups]


@pytest.mark.parametrize("value", ["4", "three"])
def test_a_consumer_group_count_other_than_2_or_3_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(HOPPER_GROUPS_ENV, value)
    with pytest.raises(ValueError, match=f"ATTN_FUSED_HOPPER_GROUPS must be 2 or 3 .*got '{value}'"):
        consumer_groups(64)


@pytest.mark.parametrize("switch, max_seqlen_kv, causal, expected", [
    (None, 2048, True, 32),  # 1 MiB of K/V a KV head: all 8 in one 8 MiB section
    (None, 4096, True, 16),  # 2 MiB a KV head: 4 KV heads (16 query heads) a section
    (None, 16384, True, 4),  # 8 MiB a KV head: one
    (None, 2048, False, 4),  # without a causal mask: one KV head a section
    ("0", 2048, True, 4),  # one KV head a section, the order before sections
    ("32", 16384, True, 16),
    ("1", 16384, True, 4),  # at least one KV head
    ("32", 2048, False, 4),
])
def test_the_program_order_runs_in_sections_of_kv_heads_that_fit_l2(monkeypatch: pytest.MonkeyPatch,
                                                                  switch: str | None, max_seqlen_kv: int,
                                                                  causal: bool, expected: int) -> None:
    """The launch's section_heads under a causal mask: the query heads of the KV heads whose K and V
    (max_seqlen_kv tokens) fit HOPPER_L2_SECTION_MIB, or ATTN_FUSED_HOPPER_L2_SECTION's MiB; without one, a KV
    head's."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    if switch is None:
        monkeypatch.delenv(HOPPER_L2_SECTION_ENV, raising=False)
    else:
        monkeypatch.setenv(HOPPER_L2_SECTION_ENV, switch)
    kernel = _RecordedLaunch()
    monkeypatch.setattr(hopper_forward, "attention_fwd_hopper_kernel", kernel)
    q = torch.randn(1, 256, 32, 128, dtype=torch.bfloat16)
    k = v = torch.randn(1, 256, 8, 128, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, v, torch.empty_like(q), num_seqs=1, max_seqlen_q=256,
                               max_seqlen_kv=max_seqlen_kv, total_q=256, softmax_scale=0.1,
                               window=(-1, 0) if causal else (-1, -1), bottom_right=True, page_size=0, alibi=False,
                               sink=False, has_q_start=False,
                               has_kv_start=False, num_sms=4)
    cu = torch.tensor([0, 256], dtype=torch.int32)
    plan(q, k, v, torch.empty_like(q), cu, cu, None, None, None)
    (_, args, _), = kernel.calls
    assert dict(zip(KERNEL_ARGUMENTS, args))["section_heads"] == expected


@pytest.mark.parametrize("q_lens, planned", [
    ((2048,) + (1,) * 30, "MixedHopperPlan"),  # a chunk beside 30 decodes: 67 queries per sequence, 31x the average
    ((8192,) + (128,) * 63, "MixedHopperPlan"),  # a ragged prefill whose longest sequence is 32x the average
    ((300, 129, 1000, 64, 700), "HopperPlan"),  # the GPU tests' ragged batch: 2.3x
    ((2048,) * 4, "HopperPlan"),
])
def test_batches_of_a_few_long_sequences_beside_many_short_ones_go_to_the_mixed_kernel(
        monkeypatch: pytest.MonkeyPatch, q_lens: tuple[int, ...], planned: str) -> None:
    """Mixed batches (configs.mixed_batch) go to the mixed kernel, the others to the prefill kernel."""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)
    total = sum(q_lens)
    q = torch.randn(1, total, 32, 128, dtype=torch.bfloat16)
    k = torch.randn(1, total, 8, 128, dtype=torch.bfloat16)
    plan = plan_hopper_forward(q, k, k, q, num_seqs=len(q_lens), max_seqlen_q=max(q_lens), max_seqlen_kv=4096,
                               total_q=total,
                               softmax_scale=0.1, window=(-1, 0), bottom_right=True, page_size=0, alibi=False,
                               sink=False, has_q_start=True, has_kv_start=True, num_sms=132)
    assert type(plan).__name__ == planned


def test_a_batch_past_the_grids_third_dim_is_not_planned_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid's third dim holds a sequence each and, for a zero_tail launch, one more (CUDA allows 65,535): a
    batch of 65,535 sequences goes to another kernel; 65,534 still plans here. (Meta tensors: no memory.)"""
    monkeypatch.setattr(hopper_forward, "hopper_unsupported_reason", lambda *args, **kwargs: None)

    def planned(sequences: int) -> object:
        q = torch.empty(1, sequences * 64, 4, 128, dtype=torch.bfloat16, device="meta")
        k = torch.empty(1, sequences * 64, 2, 128, dtype=torch.bfloat16, device="meta")
        return plan_hopper_forward(q, k, k, q, num_seqs=sequences, max_seqlen_q=64, max_seqlen_kv=64,
                                   total_q=sequences * 64, softmax_scale=0.1, window=(-1, 0), bottom_right=False,
                                   page_size=0, alibi=False, sink=False, has_q_start=True, has_kv_start=True,
                                   num_sms=4)

    assert isinstance(planned(hopper_forward.MAX_GRID_Z - 1), hopper_forward.HopperPlan)
    assert planned(hopper_forward.MAX_GRID_Z) is None
