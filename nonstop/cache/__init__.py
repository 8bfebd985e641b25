"""Per-sequence decode state: GQA KV and MLA latent caches (paged), KDA recurrent + conv state, in slots."""

from nonstop.cache.pages import PageTable
from nonstop.cache.state import KDAState, KVCache, LatentCache, ModelCache, StepBatch

__all__ = ["KDAState", "KVCache", "LatentCache", "ModelCache", "PageTable", "StepBatch"]
