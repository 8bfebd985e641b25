"""``decode_next`` / ``decode_steps`` after the sequences moved on through a step of ANOTHER shape.

The device continuation reads the shape's own ``ids`` and ``start`` (left by its previous launch). When a
step of another shape (a 1x2 chunk, a speculative verification) ran on the same slots in between, those
are stale: the kernel writes the cache at the old position (over a committed token) from the old token
while the host advances the lengths from where the cache really is. The executor already refuses the
other misuses of a device continuation (no step of the shape yet, other slots) with a ValueError; this
one must also be refused - or continue correctly. Expected tokens come from the reference executor.

Found by the differential fuzz (work/fuzz_mk2.py, seed 2: a verify step, then ``decode_next``)."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.executors import ReferenceExecutor
from tests.runtime.helpers import tiny_model

pytest.importorskip("triton")

from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402

STEPS = ([[3, 4]], [[5]], [[6, 7]])  # a 1x2 prefill, a 1x1 decode step, then a 1x2 step (another shape)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _run(ex, model):
    cache = ModelCache(model.cfg, 1, capacity=8, page_size=4)
    for ids in STEPS:
        batch = cache.batch([0], len(ids[0]))
        logits = ex.forward(torch.tensor(ids), cache, batch)
        cache.advance(batch)
    return cache, int(logits[0, -1].argmax())


def _reference_next(model, n: int) -> list[int]:
    ref = ReferenceExecutor(model)
    cache, tok = _run(ref, model)
    out = []
    for _ in range(n):
        batch = cache.batch([0], 1)
        tok = int(ref.forward(torch.tensor([[tok]]), cache, batch)[0, -1].argmax())
        cache.advance(batch)
        out.append(tok)
    return out


def test_decode_next_after_a_step_of_another_shape(llama):
    """Catches ``decode_next`` continuing from the 1x1 shape's stale device ``start`` / ``ids`` after a
    1x2 step moved the sequence on: today it silently writes position 3 again (over a committed token)
    with the 1x1 step's old token, and returns a token the reference never gives. Either a ValueError
    (like the executor's other continuation checks) or the reference's next token."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache, _ = _run(ex, llama)
    try:
        got = int(ex.decode_next(cache, cache.batch([0], 1))[0, 0])
    except ValueError:
        return
    assert got == _reference_next(llama, 1)[0]
    assert ex.static_step(1, 1).start.tolist() == cache.lengths.tolist()


def test_decode_steps_after_a_step_of_another_shape(llama):
    """The same for ``decode_steps`` (n steps in one launch): refused, or the reference's n tokens."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache, _ = _run(ex, llama)
    try:
        got = ex.decode_steps(cache, [0], 3)
    except ValueError:
        return
    assert got[0].tolist() == _reference_next(llama, 3)


def test_decode_next_after_a_reset_and_a_prefill_of_the_same_length_is_refused(llama):
    """A slot reset and filled again to the same length (another request in it): the device's position matches
    the cache's, but its token is the old sequence's; the continuation must be refused, not decode the old
    request's token into the new one's cache."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8, page_size=4)
    for ids in ([[3, 4]], [[5]]):  # 1x2 prefill, then a 1x1 step: the shape (1, 1) holds the token it sampled
        batch = cache.batch([0], len(ids[0]))
        ex.forward(torch.tensor(ids), cache, batch)
        cache.advance(batch)
    cache.reset(0)
    batch = cache.batch([0], 3)  # a new request of 3 tokens: length 3 again
    ex.forward(torch.tensor([[9, 8, 7]]), cache, batch)
    cache.advance(batch)
    with pytest.raises(ValueError, match="moved on"):
        ex.decode_next(cache, cache.batch([0], 1))


def test_decode_next_continues_its_own_steps(llama):
    """The check refuses only what moved on: decode_next after decode_next (each advanced) gives the reference's
    tokens."""
    ex = MegakernelExecutor(llama, graphs=False)
    cache = ModelCache(llama.cfg, 1, capacity=8, page_size=4)
    batch = cache.batch([0], 1)
    tok = int(ex.forward(torch.tensor([[3]]), cache, batch)[0, -1].argmax())
    cache.advance(batch)
    got = [tok]
    for _ in range(2):
        batch = cache.batch([0], 1)
        got.append(int(ex.decode_next(cache, batch)[0, 0]))
        cache.advance(batch)
    ref = ReferenceExecutor(llama)
    cache = ModelCache(llama.cfg, 1, capacity=8, page_size=4)
    want, tok = [], 3
    for _ in range(3):
        batch = cache.batch([0], 1)
        tok = int(ref.forward(torch.tensor([[tok]]), cache, batch)[0, -1].argmax())
        cache.advance(batch)
        want.append(tok)
    assert got == want
