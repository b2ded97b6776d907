"""KV-cache bookkeeping for incremental decoding: TransformerEngine's ``InferenceParams`` API.

``inference`` imports from ``attention`` only its kernel-launch helpers and environment reader (no attention logic):
the attention module calls ``InferenceParams.step``.
"""

from inference.cache_manager import KVCacheManager
from inference.errors import KVCacheFullError
from inference.inference_params import InferenceParams
from inference.kv_append import append_to_kv_cache, reindex_kv_cache
from inference.non_paged_cache_manager import NonPagedKVCacheManager
from inference.page_allocator import PageAllocator, RunPageAllocator
from inference.paged_cache_manager import PagedKVCacheManager

__all__ = [
    "InferenceParams",
    "KVCacheFullError",
    "KVCacheManager",
    "NonPagedKVCacheManager",
    "PageAllocator",
    "RunPageAllocator",
    "PagedKVCacheManager",
    "append_to_kv_cache",
    "reindex_kv_cache",
]
