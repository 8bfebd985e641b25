"""Request state and outputs: token bookkeeping, incremental detokenisation, stop conditions.

Each generated token costs the same whatever the output length: the text grows through an
``IncrementalDecoder`` (a few tokens decoded per step), stop strings are matched per new character
(``stop_strings.StopStrings``, whatever their length), and penalties read per-token counts.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import torch

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.stop_strings import StopStrings
from nonstop.engine.tokenizer import Tokenizer


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns per prompt.

    token_ids: generated ids; logprobs: one {token_id: logprob} per generated token (when asked);
    prompt_logprobs: None for the first prompt position, then one dict per position (when asked);
    finish_reason: ``stop`` (eos, stop string or stop token), ``length``, ``abort`` (cancelled) or
    ``error`` (then ``error`` says why); metrics: timings and counts; samples: with ``n`` > 1 the n
    completions of the prompt (this output's own fields are the first's), else empty.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    prompt_logprobs: list[dict[int, float] | None] | None
    finish_reason: str | None
    metrics: dict = field(default_factory=dict)
    error: str | None = None
    samples: list[RequestOutput] = field(default_factory=list, repr=False)  # n > 1: all n completions


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[dict] | None = None
    prompt_logprobs: list | None = None
    finish_reason: str | None = None
    error: str | None = None
    slot: int = -1
    prefilled: int = 0
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    extra_metrics: dict = field(default_factory=dict)
    draft_state: object = field(default=None, repr=False)  # the speculative drafter's per-request state
    _pieces: list[str] = field(default_factory=list, repr=False)  # the text, in the pieces it was decoded in
    _length: int = field(default=0, repr=False)  # characters in _pieces
    _stops: StopStrings | None = field(default=None, repr=False)  # the stop strings' match state
    _unsent: str = field(default="", repr=False)  # text not yet returned by ``append`` (a possible stop start)
    _decoder: IncrementalDecoder | None = field(default=None, repr=False)
    _counts: collections.Counter = field(default_factory=collections.Counter, repr=False)
    _seen_prompt: torch.Tensor | None = field(default=None, repr=False)

    def __post_init__(self):
        self._stops = StopStrings(self.params.stop_strings)  # built where the request is made, not on the engine
        if self.params.logprobs is not None:
            self.logprobs = []
        if not self.params.greedy:
            # a seed of the request's own: an unseeded request draws one from the OS (``Generator.seed``),
            # never from or into torch's global generator, which is the caller's
            self.generator = torch.Generator()
            if self.params.seed is not None:
                self.generator.manual_seed(self.params.seed)
            else:
                self.generator.seed()

    @property
    def text(self) -> str:
        """The visible text so far (stop string and end token excluded)."""
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def penalty_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(distinct ids of prompt + output, distinct output ids, their counts) for the penalties."""
        if self._seen_prompt is None:
            self._seen_prompt = torch.tensor(sorted(set(self.prompt_ids)), dtype=torch.long)
        out = torch.tensor(list(self._counts), dtype=torch.long)
        counts = torch.tensor(list(self._counts.values()), dtype=torch.float32)
        return torch.cat([self._seen_prompt, out]).unique(), out, counts

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def append(self, token: int, tokenizer: Tokenizer, logprob_row: dict | None = None) -> str:
        """Add a generated token; returns the newly visible text and sets finish_reason if done.

        The returned pieces concatenate to the final ``text``: while the request runs, a tail of text
        that could be the start of a stop string is held back until it is known not to be one.
        """
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.output_ids.append(token)
        if self.logprobs is not None and logprob_row is not None:
            self.logprobs.append(logprob_row)
        self._counts[token] += 1
        p = self.params
        hit_eos = token in self.eos_ids and not p.ignore_eos
        ends = hit_eos or token in p.stop_token_ids
        if self._decoder is None:
            self._decoder = IncrementalDecoder(tokenizer)
        new = "" if ends else self._decoder.push(token)
        if ends or len(self.output_ids) >= p.max_tokens:  # the last token: what the decoder holds that can never
            new += self._decoder.flush()  # complete is text too (invalid bytes as U+FFFD)
        stop_at = self._add_text(new)
        if stop_at is not None:
            self._cut_text(stop_at)
            self._finish("stop", now)
        elif ends:
            self._finish("stop", now)
        elif len(self.output_ids) >= p.max_tokens:
            self._finish("length", now)
        hold = 0 if self.finished else self._stops.held
        split = max(0, len(self._unsent) - hold)
        out, self._unsent = self._unsent[:split], self._unsent[split:]
        return out

    def _add_text(self, new: str) -> int | None:
        """Append ``new`` to the text; the position of the first stop string now in it (None if none).
        An earlier match would have ended the request, so a new one ends inside ``new``."""
        if not new:
            return None
        self._pieces.append(new)
        self._length += len(new)
        self._unsent += new
        return self._stops.feed(new)

    def _cut_text(self, end: int) -> None:
        """Truncate the text to its first ``end`` characters (the match starts after what was sent)."""
        cut = self._length - end
        self._pieces[:] = [self.text[:end]]
        self._length = end
        self._unsent = self._unsent[: len(self._unsent) - cut]

    def _finish(self, reason: str, now: float) -> None:
        self.finish_reason = reason
        self.finished_at = now

    def stop(self, reason: str, error: str | None = None) -> None:
        """End the request from outside (``abort`` for a cancelled one, ``error`` with a message); a request
        that has already ended keeps its reason and gets no error."""
        if self.finish_reason is not None:
            return
        self._finish(reason, time.perf_counter())
        if error is not None:
            self.error = error

    def output(self) -> RequestOutput:
        end = self.finished_at or time.perf_counter()
        first = self.first_token_at or end
        n = len(self.output_ids)
        decode_s = end - first
        metrics = {
            "prompt_tokens": len(self.prompt_ids),
            "generated_tokens": n,
            "time_to_first_token_s": first - self.arrival,
            "decode_time_s": decode_s,
            "decode_tokens_per_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else None,
            **self.extra_metrics,
        }
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=list(self.prompt_ids),
            text=self.text,
            token_ids=list(self.output_ids),
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            finish_reason=self.finish_reason,
            metrics=metrics,
            error=self.error,
        )
