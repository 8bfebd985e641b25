"""A scripted executor for engine scheduling tests: no model, the next token of every row is (last + 1) % V
with logit ``LEAD`` (every other logit 0), so the tokens, texts and logprobs each request must produce follow
by hand; it records every forward's input ids, and its cache the per-slot lengths and every reset."""

from __future__ import annotations

import torch

from nonstop.runtime.interface import Executor

V = 128  # ASCII under a ByteTokenizer(V): every token is one character
LEAD = 3.0


class ScriptedCache:
    """Per-slot token counts (what the engine's cache calls touch), with every reset recorded."""

    def __init__(self, num_slots: int):
        self.lengths = [0] * num_slots
        self.resets: list[int] = []

    def batch(self, slots, T):
        return list(slots), T

    def advance(self, batch):
        slots, T = batch
        for s in slots:
            self.lengths[s] += T

    def reset(self, slot):
        self.lengths[slot] = 0
        self.resets.append(slot)


class Scripted(Executor):
    """Next token (last + 1) % V; records each forward's input ids [B][T] in ``calls``."""

    name, stats, max_rows, samples_on_device = "scripted", {}, None, False

    def __init__(self, batch_invariant: bool = False):
        self.batch_invariant = batch_invariant
        self.calls: list[list[list[int]]] = []

    def new_cache(self, cfg, num_slots, dtype, device, page_size):
        return ScriptedCache(num_slots)

    def forward(self, ids, cache, batch, last_only=False):
        self.calls.append(ids.tolist())
        logits = torch.zeros(*ids.shape, V)
        logits.scatter_(-1, ((ids + 1) % V).unsqueeze(-1), LEAD)
        return logits[:, -1] if last_only else logits
