"""A TransformerEngine-style DotProductAttention that picks its backend per call and says why."""

from attention.dot_product_attention import DotProductAttention, explain
from attention.params import AttentionParams
from attention.selection import clear_cache, use_backends

__all__ = ["AttentionParams", "DotProductAttention", "clear_cache", "explain", "use_backends"]
__version__ = "0.1.0"
