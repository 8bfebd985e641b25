"""``MegakernelExecutor.decode_steps`` at its limit: as many steps in one launch as the token log holds,
for sequences of different lengths. Checks a mutation audit of the megakernel's host side found missing.

Expected tokens come from the plain-torch model (``CausalLM`` with its own cache), step by step.
"""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from tests.runtime.helpers import tiny_model

pytest.importorskip("triton")

from nonstop.runtime.megakernel import advance  # noqa: E402
from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402

PROMPTS = [[3, 4, 5], [9, 10, 11, 12, 13]]  # odd lengths that differ: the two slots start at 3 and 5


def _prefilled(model) -> tuple[ModelCache, torch.Tensor]:
    """Both slots prefilled on their own (different lengths); returns the cache and each slot's next token [2, 1]."""
    cache = ModelCache(model.cfg, 2, capacity=8, dtype=torch.float32, device="cpu", page_size=4)
    nxt = []
    for slot, prompt in enumerate(PROMPTS):
        batch = cache.batch([slot], len(prompt))
        nxt.append(model(torch.tensor([prompt]), cache, batch)[:, -1:].argmax(-1))
        cache.advance(batch)
    return cache, torch.cat(nxt)


def test_decode_steps_runs_exactly_as_many_steps_as_the_token_log_holds(monkeypatch):
    """Catches ``decode_steps`` refusing n == LOG (an off-by-one in its 1..LOG check), not advancing the
    cache's lengths by the n steps it ran, and reading the ring-indexed token log in the wrong order when
    the n positions wrap around it. LOG is shrunk to 3 so the interpreter runs the full log quickly."""
    monkeypatch.setattr(advance, "LOG", 3)
    model = tiny_model("llama")
    n = advance.LOG

    cache, ids = _prefilled(model)
    want = []
    for _ in range(1 + n):
        batch = cache.batch([0, 1], 1)
        ids = model(ids, cache, batch)[:, -1:].argmax(-1)
        cache.advance(batch)
        want.append(ids)
    want = torch.cat(want, 1)

    cache, ids = _prefilled(model)
    ex = MegakernelExecutor(model, graphs=False)  # its token log has LOG = 3 entries per sequence
    batch = cache.batch([0, 1], 1)
    first = ex.forward(ids, cache, batch)[:, -1:].argmax(-1)  # the shape's first step takes host inputs
    cache.advance(batch)
    assert tuple(ex.static_step(2, 1).buf["token_log"].shape) == (2, 3)
    got = ex.decode_steps(cache, [0, 1], n)  # n == LOG steps in one launch
    assert torch.equal(torch.cat([first, got], 1), want)
    assert cache.lengths.tolist() == [len(PROMPTS[0]) + 1 + n, len(PROMPTS[1]) + 1 + n]


def test_sample_tokens_advances_the_cache_by_the_steps_it_ran():
    """Catches ``sample_tokens`` leaving the cache's lengths where they were after its n device steps: the
    next step would then write over the tokens just generated (and attend to the wrong positions)."""
    from nonstop.runtime.device_sampling import SampleRow

    model = tiny_model("llama")
    cache, ids = _prefilled(model)
    ex = MegakernelExecutor(model, graphs=False)
    got = ex.sample_tokens(ids, cache, [0, 1], 2, [SampleRow(), SampleRow()])  # greedy rows
    assert tuple(got.shape) == (2, 2)
    assert cache.lengths.tolist() == [len(PROMPTS[0]) + 2, len(PROMPTS[1]) + 2]
