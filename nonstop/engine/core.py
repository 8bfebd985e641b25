"""EngineCore: requests in cache slots, chunked prefill, and decode steps (continuous batching).

``admit`` puts a request into a free slot; each ``step`` then decodes one token for every running
request and prefills the next chunk(s) of waiting prompts, so requests join and leave between steps
and a long prompt never stalls the running streams for more than one chunk. A finished, aborted or
failed request frees its slot.

Chunk boundaries depend only on the request (chunk k holds prompt tokens [k·N, (k+1)·N), N =
``prefill_chunk``), and with ``batch_invariant`` every row runs in a forward of its own, so a request's
tokens do not depend on what else is running (matmul kernels may sum in a different order for a
different number of rows). ``add`` is admit + the whole prefill at once, returning the first text.

With a ``SpeculativeDecoder`` (``speculative_decoder``, ``nonstop.engine.speculative``) each decode step
verifies drafted tokens instead: 1..k+1 tokens per request per step, exactly those of plain decoding.
The decoder drives the step through the public members below: ``row_groups``, ``finish``, ``fail``,
``cache``, ``executor`` (a ``runtime.interface.Executor``), ``tokenizer``, ``device``, ``max_len``.
"""

from __future__ import annotations

import logging

import torch

from nonstop.cache.pages import PAGE_SIZE
from nonstop.config import ModelConfig
from nonstop.engine import device_decode
from nonstop.engine.requests import Request
from nonstop.engine.sampling import sample, top_logprobs
from nonstop.engine.tokenizer import Tokenizer
from nonstop.runtime.interface import Executor

log = logging.getLogger("nonstop.engine")


def check_fits(prompt_tokens: int, max_tokens: int, context: int) -> None:
    """A ValueError when a prompt of ``prompt_tokens`` with ``max_tokens`` to generate exceeds ``context``."""
    if prompt_tokens + max_tokens > context:
        raise ValueError(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's context of {context} "
            "tokens"
        )


class EngineCore:
    """Owns a ``ModelCache`` of ``num_slots`` slots and the requests in them.

    prefill_chunk: prompt tokens per prefill forward and per step (None: whole prompts at once).
    batch_invariant: one forward per row (unless the executor says ``batch_invariant`` itself).
    isolate_errors: an exception in a forward or in sampling ends only the requests it touched
    (finish_reason ``error``) instead of propagating. speculative_decoder: a ``SpeculativeDecoder``
    (or None: plain decoding).
    """

    def __init__(
        self,
        cfg: ModelConfig,
        executor: Executor,
        tokenizer: Tokenizer,
        num_slots: int,
        dtype: torch.dtype,
        device,
        max_len: int | None = None,
        prefill_chunk: int | None = None,
        batch_invariant: bool = False,
        isolate_errors: bool = False,
        page_size: int = PAGE_SIZE,
        speculative_decoder=None,
    ):
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (or None for whole prompts), got {prefill_chunk}")
        self.cfg = cfg
        self.executor = executor
        self.tokenizer = tokenizer
        self.device = device
        self.max_len = max_len or cfg.max_position_embeddings
        self.prefill_chunk = prefill_chunk
        self.split_rows = batch_invariant and not executor.batch_invariant
        self.isolate_errors = isolate_errors
        self.speculative_decoder = speculative_decoder
        self.cache = executor.new_cache(cfg, num_slots, dtype, device, page_size)
        self.free_slots = list(range(num_slots))[::-1]
        self.prefilling: list[Request] = []
        self.running: list[Request] = []

    # ------------------------------------------------------------------ state
    @property
    def has_free_slot(self) -> bool:
        return bool(self.free_slots)

    @property
    def active(self) -> list[Request]:
        """Requests holding a slot (prefilling or decoding)."""
        return self.prefilling + self.running

    def check_length(self, req: Request) -> None:
        check_fits(len(req.prompt_ids), req.params.max_tokens, self.max_len)

    # ------------------------------------------------------------------ API
    @torch.inference_mode()
    def admit(self, req: Request) -> None:
        """Give ``req`` a free slot; its prompt is prefilled by the coming ``step`` calls."""
        if not req.prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        self.check_length(req)
        if not self.free_slots:
            raise RuntimeError("no free slot: wait for a request to finish (check has_free_slot)")
        req.slot = self.free_slots.pop()
        req.prefilled = 0
        self.cache.reset(req.slot)
        if self.speculative_decoder is not None:
            self.speculative_decoder.start(req)
        self.prefilling.append(req)

    @torch.inference_mode()
    def add(self, req: Request) -> str:
        """Admit ``req`` and prefill its whole prompt now; returns its first text."""
        self.admit(req)
        text = ""
        while req in self.prefilling:
            text = self._prefill_chunk(req)
        return text

    @torch.inference_mode()
    def step(self, out: list[tuple[Request, str]] | None = None) -> list[tuple[Request, str]]:
        """Decode one token for every running request, then prefill the next prompt chunk(s).

        Returns (request, new text) for every request that produced a token or ended (an errored
        request comes back with finish_reason ``error`` and empty text). The pairs are appended to ``out``
        (a new list by default) as they are produced, so a caller whose step raises part-way (an error not
        isolated) still holds the text of the requests served before it.
        """
        out = [] if out is None else out
        if self.running:
            self._decode(list(self.running), out)
        for req in self._plan_prefill():
            text = self._prefill_chunk(req)
            if req.output_ids or req.finished:
                out.append((req, text))
        return out

    @torch.inference_mode()
    def abort(self, req: Request, reason: str = "abort", error: str | None = None) -> None:
        """Stop a request now (client gone, error) and free its slot."""
        for group in (self.running, self.prefilling):
            if req in group:
                group.remove(req)
        req.stop(reason, error)
        self._release(req)

    # ------------------------------------------------------------------ scheduling
    def _plan_prefill(self) -> list[Request]:
        """Prefilling requests (oldest first) whose next chunks fit this step's token budget
        (``prefill_chunk`` tokens; always at least one chunk)."""
        if self.prefill_chunk is None:
            return list(self.prefilling)
        chosen, used = [], 0
        for req in self.prefilling:
            n = min(self.prefill_chunk, len(req.prompt_ids) - req.prefilled)
            if chosen and used + n > self.prefill_chunk:
                break
            chosen.append(req)
            used += n
        return chosen

    def row_groups(self, reqs: list[Request], limit: int | None = None) -> list[list[Request]]:
        """The requests that may share one forward: each alone under batch invariance (unless the
        executor is batch invariant itself), else all together; with ``limit``, in groups of at most
        ``limit`` requests (in order)."""
        groups = [[r] for r in reqs] if self.split_rows else [reqs]
        if limit is None:
            return groups
        return [g[i : i + limit] for g in groups for i in range(0, len(g), limit)]

    # ------------------------------------------------------------------ forwards
    def _forward(self, reqs: list[Request], ids: list[list[int]], last_only: bool) -> torch.Tensor | None:
        """One cached forward of ``ids`` [B][T] for the requests' slots; logits, or None if it failed
        and the requests were ended (``isolate_errors``)."""
        decoder = self.speculative_decoder
        taps = decoder.taps if decoder is not None else ()
        try:
            batch = self.cache.batch([r.slot for r in reqs], len(ids[0]))  # may grow the page pool: may fail
            input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
            if taps:  # the drafter reads the target's hidden states of every cached position
                logits, hidden = self.executor.forward_hidden(input_ids, self.cache, batch, taps)
                for i, r in enumerate(reqs):
                    decoder.observe(r, hidden, i, len(ids[i]))
                logits = logits[:, -1] if last_only else logits
            else:
                logits = self.executor.forward(input_ids, self.cache, batch, last_only=last_only)
        except Exception as exc:
            self.fail(reqs, exc)
            return None
        self.cache.advance(batch)
        return logits

    def _decode(self, reqs: list[Request], out: list[tuple[Request, str]]) -> None:
        """Decode the next token(s) of ``reqs``, appending (request, new text) to ``out`` group by group."""
        if self.speculative_decoder is not None:
            out += self.speculative_decoder.decode(self, reqs)
            return
        on_device = device_decode.decode(self, reqs)  # kernel backends: sampled on the device, n steps a launch
        if on_device is not None:
            out += on_device
            return
        for group in self.row_groups(reqs):
            logits = self._forward(group, [[r.output_ids[-1]] for r in group], last_only=True)
            for i, r in enumerate(group):
                out.append((r, "" if logits is None else self._emit(r, logits[i])))

    def _prefill_chunk(self, req: Request) -> str:
        """Run the next chunk of ``req``'s prompt; after the last chunk sample its first token."""
        start = req.prefilled
        end = (
            len(req.prompt_ids) if self.prefill_chunk is None else min(len(req.prompt_ids), start + self.prefill_chunk)
        )
        final = end == len(req.prompt_ids)
        want_prompt = req.params.prompt_logprobs is not None
        logits = self._forward([req], [req.prompt_ids[start:end]], last_only=not want_prompt)
        if logits is None:
            return ""
        req.prefilled = end
        if want_prompt:
            self._record_prompt_logprobs(req, logits[0], start, end)
        if not final:
            return ""
        self.prefilling.remove(req)
        self.running.append(req)
        return self._emit(req, logits[0, -1] if want_prompt else logits[0])

    def _record_prompt_logprobs(self, req: Request, logits: torch.Tensor, start: int, end: int) -> None:
        """logits [T, V] of prompt positions start..end-1; position t scores prompt token t+1."""
        if req.prompt_logprobs is None:
            req.prompt_logprobs = [None]
        lp = torch.log_softmax(logits.float(), -1)
        k = req.params.prompt_logprobs
        for t in range(start, min(end, len(req.prompt_ids) - 1)):
            req.prompt_logprobs.append(top_logprobs(lp[t - start], k, req.prompt_ids[t + 1]))

    # ------------------------------------------------------------------ tokens and slots
    def _emit(self, req: Request, logits_row: torch.Tensor) -> str:
        """Sample from logits [V] (fp32), record logprobs, append to the request; frees its slot when done."""
        try:
            position = len(req.prompt_ids) + len(req.output_ids)  # the sampled token's: the device's noise counter
            token = sample(logits_row, req.params, req.generator, req, position)
            row = None
            if req.params.logprobs is not None:
                row = top_logprobs(torch.log_softmax(logits_row.float(), -1), req.params.logprobs, token)
            text = req.append(token, self.tokenizer, row)
        except Exception as exc:
            self.fail([req], exc)
            return ""
        if req.finished:
            self.finish(req)
        return text

    def finish(self, req: Request) -> None:
        """A running request that has just finished (``req.finished``) leaves the batch and frees its slot."""
        self.running.remove(req)
        self._release(req)

    def fail(self, reqs: list[Request], exc: Exception) -> None:
        """End ``reqs`` with finish_reason ``error`` (``isolate_errors``), else raise ``exc``."""
        if not self.isolate_errors:
            raise exc
        log.exception("request(s) %s failed", ", ".join(r.request_id for r in reqs), exc_info=exc)
        for r in reqs:
            self.abort(r, "error", f"{type(exc).__name__}: {exc}")

    def _release(self, req: Request) -> None:
        if req.slot >= 0:
            self.cache.reset(req.slot)
            self.free_slots.append(req.slot)
            req.slot = -1
