"""Count the aten operators a reference decode step dispatches (the "eager ops per step"), and lower a
model of any size for reports (``nonstop program``, ``bench/readme_numbers.py``)."""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import meta_model, random_model
from nonstop.model.rows import row_exact
from nonstop.model.stack import CausalLM
from nonstop.program.ir import Program
from nonstop.program.lower import lower
from nonstop.program.twin import narrow_twin
from nonstop.threads import one_thread

INSTANTIATE_LIMIT = 2e9  # bytes of fp32 weights up to which a report builds the real-shaped model on the CPU


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
def prefilled(model: CausalLM, context: int, room: int) -> tuple[ModelCache, torch.Tensor]:
    """A one-slot cache of ``model`` holding a ``context``-token prompt, with ``room`` more positions, and
    the prompt's ids [1, context]."""
    cfg = model.cfg
    device = model.embed_tokens.weight.device
    cache = ModelCache(cfg, 1, capacity=context + room, dtype=model.embed_tokens.weight.dtype, device=device)
    ids = torch.arange(context, device=device).remainder(cfg.vocab_size)[None]
    batch = cache.batch([0], context)
    model(ids, cache, batch, last_only=True)
    cache.advance(batch)
    return cache, ids


@torch.inference_mode()
def count_decode_ops(model: CausalLM, context: int = 8, rows: int = 1) -> OpCounter:
    """Prefill ``context`` tokens, then count the ops of one batch-1 decode step of the reference model;
    ``rows`` > 1: the step a speculative decoder verifies ``rows`` - 1 drafts with (every row computed as
    a one-token step, ``row_exact``, each KDA layer keeping its state after every row)."""
    with one_thread():  # tiny ops (a narrow twin's): a second thread only slows them down
        cfg = model.cfg
        device = model.embed_tokens.weight.device
        cache, ids = prefilled(model, context, rows + 4)
        counter = OpCounter()
        if rows == 1:
            step = cache.batch([0], 1)
            with counter:
                model(ids[:, -1:], cache, step, last_only=True)
            return counter
        step = cache.batch([0], rows, keep_states=True)
        drafts = torch.arange(rows, device=device).remainder(cfg.vocab_size)[None]
        with counter, row_exact():
            model(drafts, cache, step)
        return counter


def decode_program(cfg: ModelConfig, dtype: torch.dtype) -> tuple[Program, int, str]:
    """(the decode Program of ``cfg`` with weights in ``dtype``, the eager aten ops of one reference
    decode step, what they were counted on). Up to ``INSTANTIATE_LIMIT`` bytes of fp32 weights the model
    is built with random weights and counted itself; a larger one is lowered on the meta device and its
    ops counted on a narrow twin (same layers, kinds and top-k, tiny widths: the same ops)."""
    if sum(t.numel() * t.element_size() for t in meta_model(cfg).state_dict().values()) <= INSTANTIATE_LIMIT:
        model = random_model(cfg, dtype)
        return lower(model), count_decode_ops(model).total, "this model"
    eager = count_decode_ops(random_model(narrow_twin(cfg), torch.float32)).total
    return lower(meta_model(cfg, dtype)), eager, "a narrow twin (same layers, kinds and top-k; tiny widths)"
