"""SamplingParams and the token sampler (greedy, temperature, top-k, top-p with a seeded RNG)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingParams:
    """How to generate. ``temperature == 0`` is greedy. ``top_k`` <= 0 and ``top_p == 1`` disable those
    filters. ``logprobs`` / ``prompt_logprobs``: how many top alternatives to return per position
    (the sampled / actual token is always included); log-probabilities are those of the model's own
    distribution, before temperature, top-k and top-p."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self):
        def check(cond, msg):
            if not cond:
                raise ValueError(msg)

        check(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool) and self.max_tokens >= 1, f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        check(isinstance(self.temperature, (int, float)) and self.temperature >= 0 and self.temperature == self.temperature, f"temperature must be >= 0, got {self.temperature!r}")
        check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p!r}")
        check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool), f"top_k must be an integer, got {self.top_k!r}")
        check(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)), f"seed must be an integer, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            check(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0), f"{name} must be an integer >= 0, got {v!r}")
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        check(all(isinstance(s, str) and s for s in stops), f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        self.stop_strings = stops
        ids = list(self.stop_token_ids or [])
        check(all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids), f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        self.stop_token_ids = ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] fp32 -> tempered logits with everything outside top-k / the top-p nucleus at -inf."""
    x = logits / temperature
    if 0 < top_k < x.shape[-1]:
        kth = torch.topk(x, top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True, stable=True)  # ties: lowest id first, like the device sampler
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        drop = before >= top_p  # keep the smallest prefix whose mass reaches top_p
        x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    return x


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: [V] fp32 (one-hot argmax for greedy)."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    return torch.softmax(filter_logits(logits.float(), params.temperature, params.top_k, params.top_p), dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from logits [V] (fp32): argmax when greedy, else a draw from ``sampling_probs``."""
    if params.greedy:
        return int(logits.argmax())
    probs = sampling_probs(logits, params)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))


def top_logprobs(logprobs: torch.Tensor, k: int, actual: int) -> dict[int, float]:
    """{token_id: logprob} for the top ``k`` of logprobs [V] plus the ``actual`` token."""
    out = {}
    if k > 0:
        values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]))
        out = {int(i): float(v) for v, i in zip(values, ids)}
    out[int(actual)] = float(logprobs[actual])
    return out
