"""Speculative decoding: drafters (prompt-lookup n-gram, DSpark block drafter), exact verification
(greedy and rejection sampling) and the engine step with KDA state rollback; see ``step.py``."""

from nonstop.engine.speculative.config import SpeculativeConfig, make_drafter
from nonstop.engine.speculative.step import SpeculativeDecoder

__all__ = ["SpeculativeConfig", "SpeculativeDecoder", "make_drafter"]
