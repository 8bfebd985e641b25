"""EngineCore: requests in cache slots, prefill, and batched decode steps.

``add`` prefills a request into a free slot (its prompt in one forward) and samples its first token;
``step`` decodes one token for every running request in one batched forward. Requests can join and
leave between steps; a finished request frees its slot.
"""

from __future__ import annotations

import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.engine.requests import Request
from nonstop.engine.sampling import sample, top_logprobs
from nonstop.engine.tokenizer import Tokenizer


class EngineCore:
    def __init__(self, cfg: ModelConfig, executor, tokenizer: Tokenizer, num_slots: int, dtype: torch.dtype, device, max_len: int | None = None):
        self.cfg = cfg
        self.executor = executor
        self.tokenizer = tokenizer
        self.device = device
        self.max_len = max_len or cfg.max_position_embeddings
        self.cache = ModelCache(cfg, num_slots, capacity=64, dtype=dtype, device=device)
        self.free_slots = list(range(num_slots))[::-1]
        self.running: list[Request] = []

    # ------------------------------------------------------------------ helpers
    def _emit(self, req: Request, logits_row: torch.Tensor) -> str:
        """Sample from logits [V] (fp32), record logprobs, and append to the request."""
        token = sample(logits_row, req.params, req.generator)
        row = None
        if req.params.logprobs is not None:
            row = top_logprobs(torch.log_softmax(logits_row.float(), -1), req.params.logprobs, token)
        return req.append(token, self.tokenizer, row)

    def _release(self, req: Request) -> None:
        if req.slot >= 0:
            self.cache.reset(req.slot)
            self.free_slots.append(req.slot)
            req.slot = -1

    def check_length(self, req: Request) -> None:
        total = len(req.prompt_ids) + req.params.max_tokens
        if total > self.max_len:
            raise ValueError(f"prompt ({len(req.prompt_ids)} tokens) + max_tokens ({req.params.max_tokens}) exceeds the model's context of {self.max_len} tokens")

    # ------------------------------------------------------------------ API
    @property
    def has_free_slot(self) -> bool:
        return bool(self.free_slots)

    @torch.inference_mode()
    def add(self, req: Request) -> str:
        """Prefill ``req`` into a free slot and sample its first token; returns its first text."""
        if not req.prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        self.check_length(req)
        req.slot = self.free_slots.pop()
        self.cache.reset(req.slot)
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)
        batch = self.cache.batch([req.slot], ids.shape[1])
        want_prompt = req.params.prompt_logprobs is not None
        logits = self.executor.forward(ids, self.cache, batch, last_only=not want_prompt)
        self.cache.advance(batch)
        last = logits[0, -1] if want_prompt else logits[0]
        if want_prompt:
            lp = torch.log_softmax(logits[0, :-1].float(), -1)
            k = req.params.prompt_logprobs
            req.prompt_logprobs = [None] + [top_logprobs(lp[t], k, req.prompt_ids[t + 1]) for t in range(len(req.prompt_ids) - 1)]
        text = self._emit(req, last)
        if req.finished:
            self._release(req)
        else:
            self.running.append(req)
        return text

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, str]]:
        """One decode step for every running request; returns (request, new text) pairs."""
        if not self.running:
            return []
        reqs = list(self.running)
        ids = torch.tensor([[r.output_ids[-1]] for r in reqs], dtype=torch.long, device=self.device)
        batch = self.cache.batch([r.slot for r in reqs], 1)
        logits = self.executor.forward(ids, self.cache, batch, last_only=True)
        self.cache.advance(batch)
        out = []
        for r, row in zip(reqs, logits):
            out.append((r, self._emit(r, row)))
            if r.finished:
                self.running.remove(r)
                self._release(r)
        return out

    def abort(self, req: Request, reason: str = "abort") -> None:
        """Stop a request now (client gone, error) and free its slot."""
        if req in self.running:
            self.running.remove(req)
        if req.finish_reason is None:
            req.finish_reason = reason
        self._release(req)
