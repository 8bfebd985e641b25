"""Per-row parameters of the device sampler (``nonstop/kernels/sample.py``) and how a step's buffers get them.

A row r of a step samples its token from the LM head's logits on the device with
    temperature[r] (0: greedy argmax), top_k[r] (<= 0: off), top_p[r] (1: off), and Gumbel noise of
    Philox4x32 with key seed[r] and counter (entry // 4, offset[r]).
``offset[r]`` is the position of the token being sampled, so the noise of a request's k-th token depends
only on (seed, position): several steps in one launch (the ``advance`` task adds T to the offsets after
each step) draw exactly the tokens that one step at a time would. A request without a seed gets a fresh
random seed per call (independent noise per position: the same distribution).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

SEED_BITS = 63


@dataclass(frozen=True)
class SampleRow:
    """How one row samples: ``SamplingParams``' temperature, top_k, top_p and a 63-bit seed."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int = 0

    @staticmethod
    def of(params, generator: torch.Generator | None = None) -> SampleRow:
        """The row of a request's ``SamplingParams``: its seed when it has one, else a random one (from
        ``generator`` when given)."""
        if params.seed is not None:
            seed = params.seed
        elif generator is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        else:
            seed = random.getrandbits(SEED_BITS)
        return SampleRow(float(params.temperature), int(params.top_k), float(params.top_p), seed % 2**SEED_BITS)


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
