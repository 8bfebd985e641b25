"""SamplingParams and the host sampler: greedy, temperature, top-k, top-p, min-p, penalties, seeded RNG.

The math of the filtered distribution and of the penalties lives in ``nonstop/model/sampling.py``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import FrozenInstanceError, dataclass, field, fields

import torch

from nonstop.engine.tokenizer import TokenizerError, check_text
from nonstop.model.sampling import filter_logits, gumbel_max, penalize

__all__ = ["InvalidSamplingParam", "SamplingParams", "filter_logits", "sample", "sampling_probs", "top_logprobs"]

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
# presence / frequency penalties: vLLM's and OpenAI's range (the server's too). repetition_penalty: > 0 as in vLLM,
# and a number float32 logits can be divided and multiplied by (below float32's smallest normal it rounds to 0
# there, above its largest to inf); ``penalize`` keeps the penalised logits finite for any value in range.
ADDITIVE_PENALTY_RANGE = (-2.0, 2.0)
REPETITION_PENALTY_RANGE = (float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max))
# n: completions per prompt, each its own engine request (the server's API takes the same bound); beyond it a
# typo (n=10**9) would queue requests for ever.
MAX_N = 128


class InvalidSamplingParam(ValueError):
    """A sampling parameter out of range; ``param`` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _plain(v):
    """A numpy (or other registered) number as the Python int / float it stands for, as token ids are
    taken (``inputs``); anything else unchanged, so that bools, numpy's included, are still refused."""
    if isinstance(v, (bool, int, float)) or not isinstance(v, numbers.Number):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    return float(v) if isinstance(v, numbers.Real) else v


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_stop_text(stop: str | list[str] | tuple[str, ...] | None) -> None:
    """Refuse a stop string that is not valid Unicode (``tokenizer.check_text``): no decoded text holds one.
    The error names ``stop``, or ``stop[i]`` in a list."""
    named = [("stop", stop)] if isinstance(stop, str) else [(f"stop[{i}]", s) for i, s in enumerate(stop or ())]
    for what, text in named:
        try:
            check_text(text, what)
        except TokenizerError as exc:
            raise InvalidSamplingParam("stop", str(exc)) from None


@dataclass(frozen=True)
class SamplingParams:
    """How to generate. Immutable: validated once, here; make a changed copy with
    ``dataclasses.replace(params, stop=[...])`` (which validates again).

    ``temperature == 0`` is greedy (any finite temperature > 0 samples). ``top_k`` -1 or 0, ``top_p == 1``
    and ``min_p == 0`` disable those filters (``model/sampling.filter_logits``). Penalties, applied to
    the logits before anything else (greedy included), as in vLLM: ``repetition_penalty`` (> 0, 1 = off;
    at least 1.2e-38 and at most 3.4e38, the positive normal float32 numbers) on tokens of the prompt and
    the output, ``presence_penalty`` / ``frequency_penalty`` (in [-2, 2], as vLLM and OpenAI accept) on
    tokens of the output (``model/sampling.penalize``). ``n``: completions per prompt, at most ``MAX_N``
    (sample i uses seed + i). ``stop``: None, a non-empty string or a list / tuple of them (kept as a
    tuple), valid Unicode (no lone surrogate, which no text can match); ``stop_token_ids``: None or a
    list / tuple of token ids >= 0 (kept as a tuple; a bare int is refused, as vLLM takes a list);
    ``ignore_eos``: a bool. Numbers may be numpy's (kept as Python's).
    ``logprobs`` / ``prompt_logprobs``: how many top alternatives to return per position (the sampled /
    actual token is always included); log-probabilities are those of the model's own distribution,
    before penalties, temperature and filters."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    stop_strings: tuple[str, ...] = field(init=False, repr=False, compare=False)  # ``stop`` as a tuple

    def __post_init__(self):
        for name in _NUMBER_FIELDS:
            object.__setattr__(self, name, _plain(getattr(self, name)))
        if isinstance(self.stop_token_ids, (list, tuple)):
            object.__setattr__(self, "stop_token_ids", [_plain(i) for i in self.stop_token_ids])

        def check(cond, param, want):
            if not cond:
                raise InvalidSamplingParam(param, f"{param} must be {want}, got {getattr(self, param)!r}")

        check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1")
        check(_is_number(self.temperature) and self.temperature >= 0, "temperature", "a finite number >= 0")
        check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(_is_int(self.top_k) and self.top_k >= -1, "top_k", "an integer >= 1, or -1 / 0 (off)")
        check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]")
        rep = self.repetition_penalty
        lo, hi = REPETITION_PENALTY_RANGE
        check(_is_number(rep) and lo <= rep <= hi, "repetition_penalty", f"a number in [{lo:.2g}, {hi:.2g}] (1 = off)")
        lo, hi = ADDITIVE_PENALTY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            check(_is_number(v) and lo <= v <= hi, name, f"a number in [{lo:g}, {hi:g}]")
        check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"an integer in [1, {MAX_N}]")
        seed_ok = self.seed is None or (_is_int(self.seed) and SEED_RANGE[0] <= self.seed <= SEED_RANGE[1])
        check(seed_ok, "seed", "an integer in [-2^63, 2^64 - 1]")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            check(v is None or (_is_int(v) and v >= 0), name, "an integer >= 0")
        stop = self.stop
        stops = (stop,) if isinstance(stop, str) else tuple(stop) if isinstance(stop, (list, tuple)) else None
        ok = stop is None or (stops is not None and all(isinstance(s, str) and s for s in stops))
        check(ok, "stop", "None, a non-empty string or a list of them")
        _check_stop_text(stop)
        ids = self.stop_token_ids
        ok = ids is None or (isinstance(ids, (list, tuple)) and all(_is_int(i) and i >= 0 for i in ids))
        check(ok, "stop_token_ids", "None or a list of non-negative integers")
        check(isinstance(self.ignore_eos, bool), "ignore_eos", "True or False")
        # the derived and normalised fields: tuples, so that nothing inside a SamplingParams changes later
        if isinstance(stop, list):
            object.__setattr__(self, "stop", stops)
        object.__setattr__(self, "stop_strings", stops or ())
        object.__setattr__(self, "stop_token_ids", tuple(ids or ()))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def seed_for(self, index: int) -> int | None:
        """The seed of completion ``index`` of ``n`` (seed + index, wrapped into the seed range)."""
        if self.seed is None:
            return None
        return (self.seed + index - SEED_RANGE[0]) % 2**64 + SEED_RANGE[0]


# every field that holds one number (numpy's taken as Python's)
_NUMBER_FIELDS = tuple(
    f.name for f in fields(SamplingParams) if f.init and f.name not in ("stop", "stop_token_ids", "ignore_eos")
)


def _refuse_assignment(self, name, value=None):
    raise FrozenInstanceError(
        f"SamplingParams is immutable (it is validated once, when made): cannot change {name!r}; "
        f"make a new one with dataclasses.replace(params, {name}=...)"
    )


# the frozen dataclass's own refusal, with a message that says what to do instead
SamplingParams.__setattr__ = _refuse_assignment
SamplingParams.__delattr__ = _refuse_assignment


def apply_penalties(logits: torch.Tensor, params: SamplingParams, history) -> torch.Tensor:
    """logits [V] with ``params``' penalties applied; ``history.penalty_ids()`` gives (seen ids, output
    ids, output counts) as in ``model/sampling.penalize`` (a ``Request`` provides it)."""
    if not params.penalized or history is None:
        return logits
    seen, out_ids, counts = history.penalty_ids()
    dev = logits.device
    p = params
    return penalize(
        logits,
        seen.to(dev),
        out_ids.to(dev),
        counts.to(dev),
        p.repetition_penalty,
        p.presence_penalty,
        p.frequency_penalty,
    )


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: [V] float64 (one-hot argmax for greedy)."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).double()
    return torch.softmax(filter_logits(logits, params.temperature, params.top_k, params.top_p, params.min_p), dim=-1)


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, history=None, position: int = 0
) -> int:
    """One token id from logits [V] (fp32): penalties (with ``history``), then argmax when greedy, else the
    Gumbel-max draw from ``sampling_probs``' distribution that the device sampler makes
    (``model/sampling.gumbel_max``): Philox noise keyed by the request's seed (``SampleRow.of``: a seeded
    request's own, else one drawn from ``generator``) at ``position``, the sampled token's position in its
    sequence. So a seeded request's tokens depend on its seed and positions only: not on the backend, on
    whether a step samples on the host or the device, or on the other requests of its batch."""
    from nonstop.runtime.device_sampling import SampleRow

    logits = apply_penalties(logits, params, history)
    if params.greedy:
        return int(logits.argmax())
    row = SampleRow.of(params, generator)
    if row.temperature == 0:  # a temperature below GREEDY_BELOW_TEMPERATURE: greedy, as on the device
        return int(logits.argmax())
    x = filter_logits(logits.float(), params.temperature, params.top_k, params.top_p, params.min_p)
    return gumbel_max(x, row.seed, position)


def top_logprobs(logprobs: torch.Tensor, k: int, actual: int) -> dict[int, float]:
    """{token_id: logprob} for the top ``k`` of logprobs [V] plus the ``actual`` token."""
    out = {}
    if k > 0:
        values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]))
        out = {int(i): float(v) for v, i in zip(values, ids)}
    out[int(actual)] = float(logprobs[actual])
    return out
