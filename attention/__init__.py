"""A TransformerEngine-style DotProductAttention that picks its backend per call and says why."""

from attention.dot_product_attention import DotProductAttention, explain
from attention.params import AttentionParams
from attention.selection import clear_cache, use_backends

__all__ = ["AttentionParams", "DotProductAttention", "InferenceParams", "clear_cache", "explain", "use_backends"]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``attention.InferenceParams``, TE's name beside ``DotProductAttention`` (``transformer_engine.pytorch``
    exports both): ``inference.InferenceParams``, imported on first use (``attention`` imports no ``inference``
    code of its own)."""
    if name == "InferenceParams":
        from inference import InferenceParams

        return InferenceParams
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
