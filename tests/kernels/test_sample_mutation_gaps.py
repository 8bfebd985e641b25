"""The ``sample`` kernel's top-p cut on an exact tie at the boundary (``tests/kernels/test_sample.py`` has
coarse-grid ties, but never one where the mass above a token equals top_p exactly).

Reference from the definition (``model/sampling.filter_logits`` docstring, vLLM's order): x = l / T; top-p
drops a token when the mass strictly above it in the stable descending order is already >= top_p; the draw
is argmax over the kept set of x + g (the Philox Gumbel noise of ``model/philox.gumbel_noise``).
"""

from __future__ import annotations

import torch

from nonstop.kernels.sample import KERNELS, sample_op
from nonstop.model.philox import gumbel_noise
from nonstop.program.reference import StepEnv


def _draw(logits: torch.Tensor, temperature: float, top_p: float, noise: torch.Tensor) -> int:
    x = logits.double() / temperature
    sorted_x, order = torch.sort(x, descending=True, stable=True)
    probs = torch.softmax(sorted_x, dim=-1)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
    x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    return int(torch.where(torch.isfinite(x), x + noise.double(), float("-inf")).argmax())


def test_top_p_boundary_tie_is_dropped():
    """Four equal logits and top_p = 0.5: the third token has exactly 0.5 of the mass above it, which is
    >= top_p, so only tokens 0 and 1 may be drawn (fp32 sums of e^0 are exact here)."""
    V, R = 4, 16
    logits = torch.zeros(R, V)
    seeds, offsets = torch.arange(R) * 977 + 3, torch.arange(R) * 5
    env = StepEnv(
        {
            "logits": logits,
            "sample_temperature": torch.ones(R),
            "sample_top_k": torch.full((R,), -1, dtype=torch.int64),
            "sample_top_p": torch.full((R,), 0.5),
            "sample_seed": seeds.clone(),
            "sample_offset": offsets.clone(),
            "next_ids": torch.full((R,), -1, dtype=torch.int64),
        },
        None,
        None,
    )
    op, _ = sample_op(V)
    KERNELS["sample"](op, env)
    got = env.buf["next_ids"]
    want = [_draw(logits[r], 1.0, 0.5, gumbel_noise(int(seeds[r]), int(offsets[r]), V)) for r in range(R)]
    assert set(want) == {0, 1}
    assert got.tolist() == want
