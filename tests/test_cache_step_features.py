"""KV-cache steps through ``DotProductAttention`` + ``InferenceParams`` with the module's other features: a
sliding window, ALiBi (given and default slopes), softmax sinks (off-by-one, learnable), MLA head dims, MQA and
MHA, and the non-causal ``padding`` mask (with a window, either diagonal alignment). Every new token of three
steps (a chunked prefill, a new sequence arriving, a decode) is compared with ``tests/reference.py`` over its
sequence's whole history. unfused on every paging (CPU); fused on three format / paging pairs (on the GPU when
there is one, else in the Triton interpreter).
``tests/test_serving_simulation.py`` covers the scheduling side (arrivals, finishing, refills) with the default
features.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from attention import DotProductAttention
from inference import InferenceParams
from tests.cache_steps import step_inputs, step_rows
from tests.reference import default_alibi_slopes, reference_one_sequence

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
FUSED_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"   # tests/conftest.py sets TRITON_INTERPRET=1 on CPU
STEPS = ({"a": 5, "b": 3}, {"a": 1, "b": 4, "c": 2}, {"a": 1, "b": 1, "c": 1})

FEATURES = {
    "window": dict(window_size=(2, 0)),
    "alibi": dict(alibi="given"),
    "alibi-default": dict(alibi="default"),
    "off-by-one": dict(softmax_type="off-by-one"),
    "learnable": dict(softmax_type="learnable"),
    "mla": dict(head_dim_v=8),
    "mqa": dict(kv_heads=1),
    "mha": dict(kv_heads=HEADS),
    "padding": dict(mask="padding"),
    "padding-window-bottom-right": dict(mask="padding", window_size=(3, 1), bottom_right=True),
    "padding-window-top-left": dict(mask="padding", window_size=(3, 1), bottom_right=False),
}
PAGINGS = {"non-paged": None, "page4": 4, "page3": 3, "page1": 1}
FUSED_PAIRS = [("bshd", "page3"), ("sbhd", "page1"), ("thd", "non-paged")]   # the interpreter: ~0.3 s a case

CASES = [pytest.param("unfused", fmt, paging, feature, id=f"unfused-{fmt}-{paging}-{feature}")
         for fmt in ("bshd", "sbhd", "thd") for paging in PAGINGS for feature in FEATURES]
CASES += [pytest.param("fused", fmt, paging, feature, id=f"fused-{fmt}-{paging}-{feature}")
          for fmt, paging in FUSED_PAIRS for feature in FEATURES]


@pytest.mark.parametrize("backend, fmt, paging, feature", CASES)
def test_cache_steps_match_the_reference(backend: str, fmt: str, paging: str, feature: str) -> None:
    options = FEATURES[feature]
    device = FUSED_DEVICE if backend == "fused" else "cpu"
    kv_heads, head_dim_v = options.get("kv_heads", KV_HEADS), options.get("head_dim_v", HEAD_DIM)
    mask, window, softmax_type = options.get("mask", "padding_causal"), options.get("window_size"), \
        options.get("softmax_type", "vanilla")
    dtype = torch.float16 if backend == "fused" else torch.float32
    torch.manual_seed(0)
    page_size = PAGINGS[paging]
    paged = dict(is_paged=True, page_size=page_size) if page_size else {}
    cache = InferenceParams(3, 24, kv_heads, HEAD_DIM, dtype, head_dim_v=head_dim_v, device=device, qkv_format=fmt,
                            **paged)
    cache.allocate_memory(1)
    module = DotProductAttention(HEADS, HEAD_DIM if head_dim_v == HEAD_DIM else (HEAD_DIM, head_dim_v),
                                 num_gqa_groups=kv_heads, qkv_format=fmt, attn_mask_type=mask, window_size=window,
                                 bottom_right_diagonal=options.get("bottom_right"), softmax_type=softmax_type,
                                 layer_number=1, backend=backend).to(device)
    sink = None
    if softmax_type == "learnable":
        with torch.no_grad():
            module.softmax_offset.copy_(torch.randn(HEADS))
        sink = module.softmax_offset.detach().cpu().clone()
    elif softmax_type == "off-by-one":
        sink = torch.zeros(HEADS)
    alibi = {}
    slopes = None
    if options.get("alibi") == "given":
        slopes = torch.rand(HEADS) * 0.5 + 0.1
        alibi = dict(core_attention_bias_type="alibi", alibi_slopes=slopes.to(device))
    elif options.get("alibi") == "default":
        slopes = default_alibi_slopes(HEADS)
        alibi = dict(core_attention_bias_type="alibi")
    causal = mask != "padding"
    # the reference's window and alignment: a cache step's causal mask is bottom-right (new queries sit last)
    ref_window = (window[0], 0) if causal and window else (window or ((-1, 0) if causal else (-1, -1)))
    ref_bottom_right = True if causal else bool(options.get("bottom_right"))
    history: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for step in STEPS:
        cache.pre_step(OrderedDict(step))
        new = {seq: [torch.randn(n, h, d).to(dtype) for h, d in ((HEADS, HEAD_DIM), (kv_heads, HEAD_DIM),
                                                                  (kv_heads, head_dim_v))]
               for seq, n in step.items()}
        with torch.no_grad():
            out = module(*step_inputs(fmt, new, dtype, device), inference_params=cache, **alibi).cpu()
        for seq, rows in zip(step, step_rows(fmt, out, list(step.values()))):
            q, k, v = new[seq]
            if seq in history:
                k, v = torch.cat([history[seq][0], k]), torch.cat([history[seq][1], v])
            history[seq] = (k, v)
            expected = reference_one_sequence(q.float(), k.float(), v.float(), causal=causal,
                                              window_size=ref_window, bottom_right=ref_bottom_right,
                                              alibi_slopes=slopes, softmax_offset=sink)
            atol = 2e-3 if dtype == torch.float16 else 1e-5
            torch.testing.assert_close(rows.float().reshape(expected.shape), expected, atol=atol, rtol=atol,
                                       msg=lambda m, seq=seq: f"sequence {seq!r}, step {step}: {m}")
    assert module.last_backend == backend


def test_a_cache_step_does_not_train_a_learnable_sink() -> None:
    """A module with a learnable sink serving outside torch.no_grad(): the step has no backward pass, so the sink
    (a parameter that requires grad) is read detached and does not keep the backends without one out."""
    torch.manual_seed(0)
    device = FUSED_DEVICE
    module = DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=KV_HEADS, qkv_format="thd",
                                 attn_mask_type="padding_causal", softmax_type="learnable", layer_number=1).to(device)
    with torch.no_grad():
        module.softmax_offset.copy_(torch.randn(HEADS))
    assert module.softmax_offset.requires_grad
    outputs = []
    for grad_mode in (True, False):
        cache = InferenceParams(3, 24, KV_HEADS, HEAD_DIM, torch.float16, device=device, qkv_format="thd")
        cache.allocate_memory(1)
        cache.pre_step(OrderedDict({"a": 3, "b": 2}))
        torch.manual_seed(1)
        q, k, v = (torch.randn(5, h, HEAD_DIM, dtype=torch.float16, device=device) for h in (HEADS, KV_HEADS, KV_HEADS))
        with torch.set_grad_enabled(grad_mode):
            outputs.append(module(q, k, v, inference_params=cache))
        assert module.last_backend == "fused"
    assert not outputs[0].requires_grad
    torch.testing.assert_close(outputs[0], outputs[1], atol=0, rtol=0)


def test_a_thd_cache_step_bias_of_the_step_batch_is_refused_naming_max_batch_size() -> None:
    """A thd cache step's bias has the cache's max_batch_size rows (its cu_seqlens hold them all); one of the step's
    sequence count is refused with a message that says so (it said only "b=3")."""
    params = InferenceParams(3, 12, 1, 8, torch.float64, qkv_format="thd", device="cpu")
    params.allocate_memory(1)
    module = DotProductAttention(2, 8, num_gqa_groups=1, qkv_format="thd", attn_mask_type="padding_causal",
                                 layer_number=1, backend="unfused")
    params.pre_step(OrderedDict(a=3, b=2))
    q, k, v = (torch.randn(5, heads, 8, dtype=torch.float64) for heads in (2, 1, 1))
    with pytest.raises(ValueError, match=r"b=3, h=2 \(b: the batch; in a thd KV-cache step the cache's max_batch_size"):
        module(q, k, v, inference_params=params, core_attention_bias_type="post_scale_bias",
               core_attention_bias=torch.randn(2, 2, 3, 12, dtype=torch.float64))
    out = module(q, k, v, inference_params=params, core_attention_bias_type="post_scale_bias",
                 core_attention_bias=torch.zeros(3, 2, 3, 12, dtype=torch.float64))   # after the refusal: runs
    assert out.shape == (5, 16)
