"""Speculative decoding: drafters (prompt-lookup n-gram, DSpark block drafter), exact verification
(greedy and rejection sampling) and the engine step with KDA state rollback; see ``step.py``."""

from nonstop.engine.spec.config import SpecConfig, make_drafter
from nonstop.engine.spec.step import SpecDecoder

__all__ = ["SpecConfig", "SpecDecoder", "make_drafter"]
