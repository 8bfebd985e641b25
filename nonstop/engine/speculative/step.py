"""``SpeculativeDecoder``: the speculative decode step of an ``EngineCore``.

For every running request: the drafter proposes k_r <= k tokens; the target runs the rows
[x, d_1..d_k_r] (x = the last emitted token, not yet in the cache) in one forward — every row
computed exactly as in a one-token decode step (``row_exact``) — with ``keep_states`` so each KDA
layer keeps its state after every row; ``verify`` picks the emitted tokens (1..k_r+1); they are
appended one by one (a stop condition ends the block early); ``ModelCache.commit`` keeps the first n
rows of each request (n = tokens emitted: x and the emitted drafts are now in the cache, the last
emitted token is the next step's x). A request with no draft runs a one-row step the same way.

Requests with different draft lengths share a forward (shorter rows are padded; padded rows are
never committed). With batch invariance every request runs alone; executors with a row limit
(``Executor.max_rows``, e.g. the superop program's) get groups that fit it, so verification runs
through the program. A request whose drafting, verification or emission raises ends alone (``EngineCore.fail``:
finish_reason ``error`` under ``isolate_errors``), the others go on. The decoder works through the
``EngineCore``'s public members only.

Metrics per request (``RequestOutput.metrics``): drafted_tokens, accepted_tokens, verify_steps and
mean_accepted_length = tokens emitted per verification step.
"""

from __future__ import annotations

import torch

from nonstop.engine.sampling import top_logprobs
from nonstop.engine.speculative.config import SpeculativeConfig
from nonstop.engine.speculative.drafter import Draft
from nonstop.engine.speculative.verify import verify
from nonstop.model.rows import row_exact


class SpeculativeDecoder:
    """The decode step of an ``EngineCore`` built with ``speculative_decoder=SpeculativeDecoder(config,
    drafter)``: ``config`` (a ``SpeculativeConfig``) sets the draft length, ``drafter`` proposes."""

    def __init__(self, config: SpeculativeConfig, drafter):
        self.config = config
        self.drafter = drafter

    @property
    def taps(self) -> tuple[int, ...]:
        return tuple(self.drafter.taps)

    # ------------------------------------------------------------------ request lifecycle
    def start(self, req) -> None:
        req.extra_metrics.update(drafted_tokens=0, accepted_tokens=0, verify_steps=0, mean_accepted_length=None)
        self.drafter.start(req)

    def observe(self, req, hidden: dict, row: int, n: int) -> None:
        """Give the drafter the hidden states of rows [0, n) of batch row ``row``."""
        if self.taps:
            self.drafter.observe(req, {tap: h[row, :n] for tap, h in hidden.items()})

    # ------------------------------------------------------------------ the step
    def decode(self, core, reqs: list) -> list:
        out = []
        for group in self._groups(core, reqs):
            out += self._step(core, group)
        return out

    def _groups(self, core, reqs: list) -> list[list]:
        """Row groups whose verify rows (k + 1 each) fit the executor's ``max_rows``."""
        max_rows = core.executor.max_rows
        per = None if max_rows is None else max(1, max_rows // (self.config.num_tokens + 1))
        return core.row_groups(reqs, per)

    def _draft_len(self, core, req) -> int:
        """k_r: at most num_tokens, and the block may not run past max_tokens or the context."""
        left = req.params.max_tokens - len(req.output_ids) - 1
        room = core.max_len - len(req.prompt_ids) - len(req.output_ids)
        return max(0, min(self.config.num_tokens, left, room))

    def _step(self, core, group: list) -> list:
        drafts, drafted, undrafted = [], [], []
        for r in group:
            k = self._draft_len(core, r)
            try:
                drafts.append(self.drafter.propose(r, k) if k > 0 else Draft.empty())
            except Exception as exc:  # this request's drafter failed: it alone ends (isolate_errors), as below
                core.fail([r], exc)
                undrafted.append((r, ""))
                continue
            drafted.append(r)
        group = drafted
        if not group:
            return undrafted
        T = 1 + max(len(d.tokens) for d in drafts)
        rows = [
            [r.output_ids[-1]] + d.tokens + [r.output_ids[-1]] * (T - 1 - len(d.tokens)) for r, d in zip(group, drafts)
        ]
        batch = core.cache.batch([r.slot for r in group], T, keep_states=True)
        try:
            ids = torch.tensor(rows, dtype=torch.long, device=core.device)
            with row_exact():
                if self.taps:
                    logits, hidden = core.executor.forward_hidden(ids, core.cache, batch, self.taps)
                else:
                    logits, hidden = core.executor.forward(ids, core.cache, batch), {}
        except Exception as exc:
            core.fail(group, exc)
            return undrafted + [(r, "") for r in group]
        texts, counts, failed = [], [], []
        for i, (r, d) in enumerate(zip(group, drafts)):
            tokens: list[int] = []
            try:
                tokens = verify(d.tokens, d.probs, logits[i, : len(d.tokens) + 1], r.params, r.generator)
                text, n = self._emit(core, r, tokens, logits[i])
            except Exception as exc:
                failed.append((r, exc))
                text, n = "", 1
            self._count(r, len(d.tokens), min(n, max(0, len(tokens) - 1)))
            texts.append(text)
            counts.append(n)
        core.cache.commit(batch, counts)
        for i, r in enumerate(group):
            if r.finished:
                core.finish(r)
            elif not any(r is f for f, _ in failed):
                self.observe(r, hidden, i, counts[i])
        for r, exc in failed:
            core.fail([r], exc)
        return undrafted + list(zip(group, texts))

    def _emit(self, core, req, tokens: list[int], logits: torch.Tensor) -> tuple[str, int]:
        """Append tokens (row j of logits [T, V] scored token j) until the request finishes;
        returns the new text and how many were appended."""
        logprobs = torch.log_softmax(logits.float(), -1) if req.params.logprobs is not None else None
        text = ""
        for j, token in enumerate(tokens):
            row = top_logprobs(logprobs[j], req.params.logprobs, token) if logprobs is not None else None
            text += req.append(token, core.tokenizer, row)
            if req.finished:
                return text, j + 1
        return text, len(tokens)

    @staticmethod
    def _count(req, drafted: int, accepted: int) -> None:
        """Every token after the first (sampled from the prompt's logits) came from a verification step."""
        m = req.extra_metrics
        m["drafted_tokens"] += drafted
        m["accepted_tokens"] += accepted
        m["verify_steps"] += 1
        m["mean_accepted_length"] = (len(req.output_ids) - 1) / m["verify_steps"]
