"""Per-sequence decode state: GQA KV and MLA latent caches, KDA recurrent + conv state, in slots."""

from nonstop.cache.state import KDAState, KVCache, LatentCache, ModelCache, StepBatch

__all__ = ["KDAState", "KVCache", "LatentCache", "ModelCache", "StepBatch"]
