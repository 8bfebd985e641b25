"""Count the aten operators a reference decode step dispatches (the "eager ops per step")."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nonstop.cache.state import ModelCache
from nonstop.model.stack import CausalLM


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while active (views and in-place ops included)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


@torch.inference_mode()
def count_decode_ops(model: CausalLM, context: int = 8) -> OpCounter:
    """Prefill ``context`` tokens, then count the ops of one batch-1 decode step of the reference model."""
    cfg = model.cfg
    device = model.embed_tokens.weight.device
    cache = ModelCache(cfg, 1, capacity=context + 4, dtype=model.embed_tokens.weight.dtype, device=device)
    ids = torch.arange(context, device=device).remainder(cfg.vocab_size)[None]
    batch = cache.batch([0], context)
    model(ids, cache, batch, last_only=True)
    cache.advance(batch)
    step = cache.batch([0], 1)
    counter = OpCounter()
    with counter:
        model(ids[:, -1:], cache, step, last_only=True)
    return counter
