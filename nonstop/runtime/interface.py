"""The executor interface: what every backend of a decode step implements for the engine.

An executor runs a loaded ``CausalLM``'s cached forward; all executors must give the reference's
tokens. The engine (``engine/core.py``) and the speculative decoder use only these members, so a new
backend (a CPU fast path, a distributed one) declares ``class MyExecutor(Executor)`` and implements
them; ``tests/runtime/test_executor_interface.py`` checks every registered backend.

Tensor shapes: ``input_ids`` [B, T] (long) = B sequences of T new tokens each, in the cache slots and
positions of ``batch``; logits are fp32 [B, T, V], or [B, V] with ``last_only``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from nonstop.cache.state import INITIAL_SLOT_TOKENS, ModelCache, StepBatch
from nonstop.config import ModelConfig


@runtime_checkable
class Executor(Protocol):
    """A decode-step backend.

    name:            the backend's name (``reference``, ``superop``, ``megakernel`` ...).
    stats:           per-step facts the backend reports (kernel launches, steps run on the fast path ...);
                     ``{}`` when it has none.
    batch_invariant: True when a row's logits never depend on the other rows of its step; the engine
                     then batches rows even when batch invariance is asked for.
    max_rows:        the most rows (B·T) one step runs on the backend's own path; larger steps still work
                     (a fallback runs them) but speculative verification groups its rows to fit, and
                     device-sampled decode steps run as launches of at most ``max_rows`` sequences
                     (``sample_tokens`` refuses more).
                     None: no limit.
    samples_on_device: True when ``sample_tokens`` runs (decode steps that sample on the device,
                     ``engine/device_decode.py``); False (the default): the engine samples from the logits.
    """

    name: str
    stats: dict
    batch_invariant: bool = False
    max_rows: int | None = None
    samples_on_device: bool = False

    def forward(
        self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None, last_only: bool = False
    ) -> torch.Tensor:
        """fp32 logits of every new token ([B, T, V]) or of the last one ([B, V]); writes the step's
        tokens into ``cache`` (None: cache-free scoring of whole sequences)."""
        ...

    def forward_hidden(
        self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """``forward`` (all rows, [B, T, V]) plus the residual stream entering each layer in ``taps``
        ({tap: [B, T, d]}; tap = the layer count: the final residual), for a drafter that reads them."""
        ...

    def new_cache(
        self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device, page_size: int
    ) -> ModelCache:
        """The ``num_slots`` cache slots the engine decodes in: by default a ``ModelCache`` in this
        process (a multi-process executor keeps its slots on its ranks)."""
        return ModelCache(cfg, num_slots, capacity=INITIAL_SLOT_TOKENS, dtype=dtype, device=device, page_size=page_size)

    def sample_tokens(
        self, input_ids: torch.Tensor, cache: ModelCache, slots: list[int], n: int, rows: list
    ) -> torch.Tensor:
        """``n`` decode steps of ``slots`` from their last tokens ``input_ids`` [B, 1], each token sampled on
        the device with ``rows`` (``runtime.device_sampling.SampleRow``, one per sequence), the cache advanced
        by n; the tokens [B, n] (host int64). Only where ``samples_on_device``; by default there is no device
        sampler."""
        raise NotImplementedError(f"the {self.name} executor does not sample on the device")
