"""Per-row parameters of the device sampler (``nonstop/kernels/sample.py``) and how a step's buffers get them.

A row r of a step samples its token from the LM head's logits on the device with
    temperature[r] (0: greedy argmax), top_k[r] (<= 0: off), top_p[r] (1: off), and Gumbel noise of
    Philox4x32 with key seed[r] and counter (entry // 4, offset[r]).
``offset[r]`` is the position of the token being sampled, so the noise of a request's k-th token depends
only on (seed, position): several steps in one launch (the ``advance`` task adds T to the offsets after
each step) draw exactly the tokens that one step at a time would. A request without a seed gets a fresh
random seed per call (independent noise per position: the same distribution). The key is the seed mod 2^64,
as ``torch.Generator.manual_seed`` maps a seed (-1 and 2^64 - 1 are one key, 0 and 2^63 two), held in the int64
``sample_seed`` buffers as the int64 of those bits (``philox_key``); every consumer splits it into its 32-bit
halves as ``tl.philox`` does, top bit included (``model/philox.philox4x32``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

KEY_BITS = 64


def philox_key(seed: int) -> int:
    """The Philox key of a request's seed: seed mod 2^64 as a two's-complement int64, in [-2^63, 2^63) (a
    seed in [0, 2^63) is its own key)."""
    return (seed + 2 ** (KEY_BITS - 1)) % 2**KEY_BITS - 2 ** (KEY_BITS - 1)


TOP_K_BEYOND_ANY_VOCAB = 2**31  # a top_k this large (SamplingParams takes any int) keeps every id: off
# The device divides float32 logits by the temperature: below this, logit / T overflows (two logits > 3.4e8·T
# both +inf, all-negative ones all -inf) while every gap between float32 logits is already worth far more
# than the Gumbel noise, so such a row samples as greedy (the host's float64, max-shifted draw gives the
# same token barring an exact tie).
GREEDY_BELOW_TEMPERATURE = 1e-30
# A top_p under float32's smallest normal rounds to 0 in the buffer and kept no token at all (the device
# returned id 2**31 - 1); any top_p below the top token's probability keeps that token alone, as this does.
TOP_P_FLOOR = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class SampleRow:
    """How one row samples: ``SamplingParams``' temperature, top_k, top_p and its Philox key (``philox_key``)."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int = 0

    @staticmethod
    def of(params, generator: torch.Generator | None = None) -> SampleRow:
        """The row of a request's ``SamplingParams``: keyed by its seed when it has one, else by a random one
        (from ``generator`` when given)."""
        if params.seed is not None:
            seed = params.seed
        elif generator is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        else:
            seed = random.getrandbits(KEY_BITS)
        top_k = int(params.top_k)
        if top_k >= TOP_K_BEYOND_ANY_VOCAB:  # keeps every id, as the host sampler does; fits the int64 buffer
            top_k = -1
        temperature = float(params.temperature)
        if temperature < GREEDY_BELOW_TEMPERATURE:
            temperature = 0.0
        return SampleRow(temperature, top_k, max(float(params.top_p), TOP_P_FLOOR), philox_key(seed))


def fill_sample_rows(buf: dict, rows: list[SampleRow], positions: torch.Tensor) -> None:
    """Write ``rows`` (one per step row) into a step's ``sample_*`` buffers; ``positions`` [R]: the position
    of each row's sampled token (the noise counter)."""
    R = len(rows)
    if positions.shape[0] != R:
        raise ValueError(f"{R} sampling rows for {positions.shape[0]} positions")
    dev = buf["sample_temperature"].device
    buf["sample_temperature"][:R].copy_(
        torch.tensor([r.temperature for r in rows], dtype=torch.float32), non_blocking=True
    )
    buf["sample_top_k"][:R].copy_(torch.tensor([r.top_k for r in rows], dtype=torch.int64), non_blocking=True)
    buf["sample_top_p"][:R].copy_(torch.tensor([r.top_p for r in rows], dtype=torch.float32), non_blocking=True)
    buf["sample_seed"][:R].copy_(torch.tensor([r.seed for r in rows], dtype=torch.int64), non_blocking=True)
    buf["sample_offset"][:R].copy_(positions.to(device=dev, dtype=torch.int64), non_blocking=True)
