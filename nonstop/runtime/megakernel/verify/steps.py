"""Several decode steps of a Program, set up for a schedule run and for the sequential reference.

``prepare_steps`` prefills a few sequences of different lengths (the last sequence of the batch
starts fresh), reserves the cache pages of every step up front (a persistent kernel cannot grow the
pool mid-launch) and makes one ``StepBatch`` per step. ``reference_logits`` runs the same steps with
the Program's plain-torch twins, one op after another, on its own copy of the caches: the oracle a
simulated (or, later, a real) megakernel run must match.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from nonstop.cache.state import ModelCache
from nonstop.program.reference import REFERENCE, StepEnv


@dataclass
class Steps:
    cache: ModelCache  # for the schedule run (pages of every step reserved)
    fresh_cache: ModelCache  # the same state before any step, for the reference
    slots: list[int]
    T: int
    batches: list  # StepBatch per step, on ``cache``
    ids: list[torch.Tensor]  # token ids [R] of every step (teacher-forced, so runs never diverge)


def prepare_steps(model, B: int, T: int, steps: int, prompt_lens=(5, 3, 7), seed: int = 0) -> Steps:
    """B sequences: the first B - 1 prefilled with ``prompt_lens`` tokens each, the last fresh; T tokens
    each per step."""
    if not 1 <= B <= len(prompt_lens) + 1:
        raise ValueError(f"B={B}: prepare_steps makes 1..{len(prompt_lens) + 1} sequences (one per prompt length + 1)")
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    dtype = model.embed_tokens.weight.dtype
    cache = ModelCache(cfg, num_slots=len(prompt_lens) + 1, capacity=8, dtype=dtype)
    for slot, n in enumerate(prompt_lens):
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=gen)
        batch = cache.batch([slot], n)
        model(ids, cache, batch)
        cache.advance(batch)
    fresh = copy.deepcopy(cache)
    slots = list(range(B - 1)) + [len(prompt_lens)]
    batches = []
    for _ in range(steps):
        batch = cache.batch(slots, T)
        cache.advance(batch)
        batches.append(batch)
    for layer in cache.layers:
        if hasattr(layer, "fit_pool"):
            layer.fit_pool()
    ids = [torch.randint(0, cfg.vocab_size, (len(slots) * T,), generator=gen) for _ in range(steps)]
    return Steps(cache, fresh, slots, T, batches, ids)


def reference_logits(program, st: Steps) -> list[torch.Tensor]:
    """Logits [R, V] of every step, the ops run one by one through their twins."""
    cache = copy.deepcopy(st.fresh_cache)
    out = []
    for ids in st.ids:
        batch = cache.batch(st.slots, st.T)
        env = StepEnv({k: v.zero_() for k, v in program.allocate(ids.numel(), ids.device).items()}, cache, batch)
        env.buf["ids"].copy_(ids)
        for op in program.ops:
            REFERENCE[op.kind](op, env)
        cache.advance(batch)
        out.append(env.buf["logits"].clone())
    return out
