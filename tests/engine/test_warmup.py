"""``warm_up`` runs every step shape class a server's traffic meets (``nonstop serve`` calls it before
it listens, so no first request waits for a compile)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from nonstop import LLM, SamplingParams
from nonstop.engine.warmup import warm_up
from tests.engine.tiny_models import synth_checkpoint


@pytest.fixture(scope="module")
def k3_dir(tmp_path_factory):
    return synth_checkpoint("k3", tmp_path_factory.mktemp("k3"))


@contextmanager
def recording(executor):
    """Record each forward's class while the block runs: (one row?, one token per row?, context of one
    token?), as the cpu executor keys its compiled programs (batch 1 / B>1, context 1 / L>1)."""
    seen: set[tuple[bool, bool, bool]] = set()
    forward = executor.forward

    def recorded(input_ids, cache, batch, last_only=False):
        if batch is not None:
            seen.add((input_ids.shape[0] == 1, input_ids.shape[1] == 1, int(batch.end.max()) == 1))
        return forward(input_ids, cache, batch, last_only=last_only)

    executor.forward = recorded
    try:
        yield seen
    finally:
        executor.forward = forward


def _traffic(llm: LLM, core) -> None:
    """Requests as clients send them: one- and many-token prompts, alone and together, joining late."""
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    waves = [[[7]], [[3, 4, 5, 6]], [[7], [8], [9]], [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11]]]
    for wave in waves:
        for i, ids in enumerate(wave):
            core.admit(llm.make_request(None, ids, params))
            if i == 0:
                core.step()  # the next joins a running request
        while core.active:
            core.step()


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_warm_up_covers_every_shape_class_of_traffic(k3_dir, batch_invariant):
    llm = LLM(k3_dir, backend="reference", max_batch=4, prefill_chunk=3, batch_invariant=batch_invariant)
    core = llm.new_core(4)
    with recording(llm.executor) as warmed:
        assert warm_up(core, llm.make_request) >= 0
    assert not core.active and len(core.free_slots) == 4  # the server starts with every slot free
    with recording(llm.executor) as served:
        _traffic(llm, core)
    assert served <= warmed, f"traffic met shapes the warm-up did not run: {served - warmed}"
    assert (True, True, True) in warmed and (True, True, False) in warmed  # one-token context and longer
    assert any(not one_row for one_row, _, _ in served) != batch_invariant  # rows batched unless invariant


def test_warm_up_with_one_slot(k3_dir):
    llm = LLM(k3_dir, backend="reference", max_batch=1)
    core = llm.new_core(1)
    with recording(llm.executor) as seen:
        warm_up(core, llm.make_request)
    assert not core.active and {one_row for one_row, _, _ in seen} == {True}


@pytest.mark.parametrize("max_len", [2, 3, 4])
def test_warm_up_fits_a_context_of_a_few_tokens(k3_dir, max_len):
    """``nonstop serve --max-model-len 4`` compiled, then failed its own warm-up (a 2-token prompt with 3
    tokens to decode is more than 4): warm-up asks only for what fits, as a client may, and still runs a
    prefill and the longest context the server allows."""
    llm = LLM(k3_dir, backend="reference", max_batch=2)
    core = llm.new_core(2, max_len=max_len)
    longest = []
    forward = llm.executor.forward

    def recorded(input_ids, cache, batch, last_only=False):
        if batch is not None:
            longest.append(int(batch.end.max()))
        return forward(input_ids, cache, batch, last_only=last_only)

    llm.executor.forward = recorded
    try:
        warm_up(core, llm.make_request)
    finally:
        llm.executor.forward = forward
    assert not core.active and len(core.free_slots) == 2
    assert max(longest) == max_len - 1  # the last generated token is sampled, never fed back
