"""Hugging Face transformers integration: tiny random Llama/Qwen2/Mistral models built in the test.

``attn_implementation="dpa"`` must give the logits of ``"eager"`` (fp32) with and without padding,
and greedy ``generate()`` the same tokens. No downloads: configs are made in code.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from attention.integrations import hf

VOCAB = 97
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=None,
)


def make_config(kind: str):
    """GQA 4/2 heads of dim 16; Mistral slides every layer, Qwen2 only its second (window 5 < prompt)."""
    if kind == "llama":
        return LlamaConfig(**COMMON)
    if kind == "mistral":
        return MistralConfig(**COMMON, sliding_window=5)
    if kind == "qwen2":
        return Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=5, max_window_layers=1)
    raise ValueError(kind)


MODELS = ("llama", "qwen2", "mistral")


@pytest.fixture(scope="module", autouse=True)
def registered() -> None:
    """"dpa" selects per call (the fused kernels run in the Triton interpreter on CPU: slow, so the
    plumbing-only tests use "dpa_unfused")."""
    hf.register()
    hf.register("dpa_unfused", backend="unfused")


def make_model(kind: str, attn_implementation: str = "eager"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(make_config(kind), attn_implementation=attn_implementation,
                                             dtype=torch.float32)
    return model.eval()


def batch(padding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of 11 tokens; ``padding`` = none | left | right (rows of 7, 10 and 11 real tokens)."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (3, 11), generator=generator)
    mask = torch.ones_like(ids)
    if padding == "left":
        mask[0, :4] = 0
        mask[1, :1] = 0
    elif padding == "right":
        mask[0, 7:] = 0
        mask[1, 10:] = 0
    ids = ids.masked_fill(mask == 0, COMMON["pad_token_id"])
    return ids, mask


def logits(model, implementation: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("kind", MODELS)
def test_logits_match_eager(kind: str, padding: str) -> None:
    model = make_model(kind)
    ids, mask = batch(padding)
    expected = logits(model, "eager", ids, mask)
    got = logits(model, "dpa", ids, mask)
    assert model.config._attn_implementation == "dpa"
    real = mask.bool()          # pad positions carry no meaning (eager averages, we write zeros)
    torch.testing.assert_close(got[real], expected[real])


@pytest.mark.parametrize("kind", MODELS)
def test_greedy_generate_is_identical(kind: str) -> None:
    model = make_model(kind)
    ids, mask = batch("left")   # generate() pads on the left
    tokens = {}
    for implementation in ("eager", "dpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(tokens["dpa"], tokens["eager"])


def test_from_config_with_dpa() -> None:
    model = make_model("mistral", attn_implementation="dpa_unfused")
    eager = make_model("mistral")
    eager.load_state_dict(model.state_dict())
    ids, mask = batch("left")
    with torch.no_grad():
        got = model(ids, attention_mask=mask).logits
        expected = eager(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()])


def test_one_module_per_configuration() -> None:
    model = make_model("llama", attn_implementation="dpa_unfused")
    before = len(hf.cached_modules())
    ids, mask = batch("left")
    with torch.no_grad():
        model(ids, attention_mask=mask)
        model(ids)
    keys = [k for k in hf.cached_modules() if k[:4] == (4, 2, 16, 16) and k[6] == ("unfused",)]
    assert len(keys) == 1 and len(hf.cached_modules()) <= before + 1
    assert hf.cached_modules()[keys[0]].last_backend == "unfused"


def test_register_with_a_backend_and_name() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert hf.register("dpa_unfused", backend="unfused") == "dpa_unfused"
    assert "dpa_unfused" in AttentionInterface() and AttentionMaskInterface()["dpa_unfused"] is hf.dpa_mask
    assert AttentionInterface()["dpa"] is not AttentionInterface()["dpa_unfused"]
    with pytest.raises(ValueError, match="unknown backend"):
        hf.register("dpa_bad", backend="nope")


# --- the attention function alone, against HF's eager attention on hand-made masks -------------------

def eager_attention(query, key, value, mask, scaling):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = (query @ key.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return (probs @ value).transpose(1, 2)


class _Attn(torch.nn.Module):
    is_causal = True


def _layout_masks() -> dict[str, tuple[torch.Tensor, str]]:
    """name -> (bool mask [b, 1, s_q, s_kv], the layout the analysis must find)."""
    b, s_q, s_kv = 2, 5, 8
    i = torch.arange(s_q)[:, None] + (s_kv - s_q)
    j = torch.arange(s_kv)[None, :]
    causal = (j <= i).expand(b, 1, s_q, s_kv).clone()
    left = causal.clone()
    left[0, :, :, :4] = False                     # row 0: 4 left pads (first query a pad too)
    window = causal & (j > i - 3)
    random = torch.rand(b, 1, s_q, s_kv, generator=torch.Generator().manual_seed(3)) > 0.4
    random[..., 0] = True
    right = (torch.arange(s_kv)[:, None] >= torch.arange(s_kv)[None, :]).expand(b, 1, s_kv, s_kv).clone()
    right[1, :, :, 6:] = False                    # row 1: 2 right pads (pad queries see the real keys)
    packed = causal.clone()
    packed[..., 2:, :5] = False                   # a second document starts at key 5 (query 2)
    return {
        "causal": (causal, "causal_bottom_right"),
        "left_padding": (left, "padding_causal_bottom_right"),
        "right_padding": (right, "padding_causal"),
        "window": (window, "causal_bottom_right"),
        "random": (random, "arbitrary"),
        "packed": (packed, "arbitrary"),
    }


@pytest.mark.parametrize("name", list(_layout_masks()))
def test_attention_function_on_masks(name: str) -> None:
    mask, layout = _layout_masks()[name]
    b, _, s_q, s_kv = mask.shape
    query, key, value = torch.randn(b, 4, s_q, 16), torch.randn(b, 2, s_kv, 16), torch.randn(b, 2, s_kv, 16)
    sliding = 3 if name == "window" else None
    assert hf._layout(mask, None if sliding is None else sliding - 1).mask_type == layout
    out, weights = hf.dpa_attention_forward(_Attn(), query, key, value, mask, scaling=0.25, sliding_window=sliding)
    assert weights is None and out.shape == (b, s_q, 4, 16) and out.is_contiguous()
    expected = eager_attention(query, key, value, mask, 0.25)
    seen = mask[:, 0].any(-1)                     # rows that see no key are padding
    torch.testing.assert_close(out[seen], expected[seen])
    float_mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    out_float, _ = hf.dpa_attention_forward(_Attn(), query, key, value, float_mask, scaling=0.25,
                                            sliding_window=sliding)
    torch.testing.assert_close(out_float[seen], expected[seen])


def test_output_attentions_is_warned_about() -> None:
    """The model's attentions came back an empty tuple, silently (sdpa logs it)."""
    q = torch.randn(1, 2, 3, 8)
    with pytest.warns(UserWarning, match=r"returns no attention weights \(output_attentions=True\)"):
        out, weights = hf.dpa_attention_forward(_Attn(), q, q, q, None, output_attentions=True)
    assert weights is None and out.shape == (1, 3, 2, 8)


def test_unsupported_kwargs_raise() -> None:
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="softcap"):
        hf.dpa_attention_forward(_Attn(), q, q, q, None, softcap=30.0)
    with pytest.raises(ValueError, match="sinks"):
        hf.dpa_attention_forward(_Attn(), q, q, q, None, s_aux=torch.zeros(2))


def test_import_attention_needs_no_transformers() -> None:
    code = "import sys, attention, attention.integrations.hf; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind", ["llama", "mistral"])
def test_generate_with_a_static_cache(kind: str) -> None:
    """StaticCache: keys past the written positions are masked, queries sit mid-cache (top-left offsets)."""
    model = make_model(kind)
    ids, mask = batch("left")
    tokens = {}
    for implementation in ("eager", "dpa_unfused"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            tokens[implementation] = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                                    cache_implementation="static")
    assert torch.equal(tokens["dpa_unfused"], tokens["eager"])


def test_a_model_that_asks_for_a_mask_gets_one() -> None:
    """Falcon with ALiBi builds its mask with allow_is_causal_skip=False and adds its bias to it: without padding
    the mask function must still return the causal mask (it returned None, and Falcon failed on None.dtype)."""
    from transformers import FalconConfig

    config = FalconConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True,
                          new_decoder_architecture=False, multi_query=False, pad_token_id=0, bos_token_id=1,
                          eos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    ids, mask = batch("none")
    torch.testing.assert_close(logits(model, "dpa_unfused", ids, mask), logits(model, "eager", ids, mask),
                               atol=1e-4, rtol=1e-4)


def test_a_user_mask_broadcast_over_queries_and_one_analysis_a_forward(monkeypatch) -> None:
    """A 4-D float mask [b, 1, 1, s_kv] (eager broadcasts it over the queries) runs, and every layer of a forward
    shares one analysis of it."""
    model = make_model("llama")
    ids, padding = batch("left")
    user_mask = torch.zeros(3, 1, 1, 11).masked_fill(padding[:, None, None, :] == 0, torch.finfo(torch.float32).min)
    expected = logits(model, "eager", ids, user_mask)
    analyses = []
    analyse = hf._analyse
    monkeypatch.setattr(hf, "_analyse", lambda *args: analyses.append(1) or analyse(*args))
    got = logits(model, "dpa_unfused", ids, user_mask)
    real = padding.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert len(analyses) == 1   # two layers, one mask


def test_the_mask_function_takes_the_cache_position_of_transformers_before_5_4(monkeypatch) -> None:
    """Before 5.4 transformers passes (and its sdpa_mask takes) the queries' cache_position, not q_length / q_offset;
    the full suite passed with 4.56.0 and 5.0.0 that way (2026-12-05), this checks the plumbing on any version."""
    from transformers import masking_utils

    calls = []
    monkeypatch.setattr(masking_utils, "sdpa_mask", lambda **kwargs: calls.append(kwargs) or "mask")
    positions = torch.arange(3, 7)   # four queries after three cached tokens
    assert hf.dpa_mask(batch_size=1, cache_position=positions, kv_length=7) is None   # causal, no padding
    padding = torch.tensor([[0, 1, 1, 1, 1, 1, 1]])
    assert hf.dpa_mask(batch_size=1, cache_position=positions, kv_length=7, attention_mask=padding) == "mask"
    (kwargs,) = calls
    assert kwargs["cache_position"] is positions and "q_length" not in kwargs and "q_offset" not in kwargs
