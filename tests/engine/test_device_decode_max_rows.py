"""Decode steps of more sequences than the kernels take in one step (``max_rows``, 16) on the backends that
sample on the device: ``engine/device_decode.py`` runs them as launches of at most ``max_rows`` sequences,
and the tokens are the reference's; ``sample_tokens`` itself refuses more than ``max_rows`` sequences with
a ValueError naming the limit (not a kernel's assert)."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.runtime.device_sampling import SampleRow
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.megakernel import MegakernelExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import kernel_skip_reason, tiny_model

BACKENDS = {
    "superop": lambda m: SuperOpExecutor(m, graphs=False),
    "megakernel": lambda m: MegakernelExecutor(m, graphs=False),
}
LAUNCHES = {"superop": "sampling_calls", "megakernel": "sampling_launches"}  # each backend's count of calls


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    reason = kernel_skip_reason(model)
    if reason:
        pytest.skip(reason)
    return model


def new_core(model, executor, num_slots: int, batch_invariant: bool = False) -> EngineCore:
    cfg = model.cfg
    return EngineCore(
        cfg, executor, ByteTokenizer(cfg.vocab_size), num_slots, torch.float32, "cpu", 512, None, batch_invariant
    )


def run(model, executor, params: list[SamplingParams]) -> list[list[int]]:
    """Every request prefilled first, then decoded together: each decode step has len(params) sequences."""
    core = new_core(model, executor, len(params))
    reqs = [Request(str(i), None, [5, 6 + i], p, frozenset()) for i, p in enumerate(params)]
    for r in reqs:
        core.add(r)
    while core.running:
        core.step()
    return [r.output_ids for r in reqs]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("B", [17, 20])
def test_greedy_steps_of_more_than_max_rows_are_the_reference(llama, backend, B):
    params = [SamplingParams(max_tokens=3, temperature=0, ignore_eos=True) for _ in range(B)]
    ex = BACKENDS[backend](llama)
    assert ex.max_rows < B
    got = run(llama, ex, params)
    assert got == run(llama, ReferenceExecutor(llama), params)
    assert all(len(t) == 3 for t in got)
    assert ex.stats["device_sampled_steps"] > 0  # sampled on the device, not through the host path
    assert ex.stats[LAUNCHES[backend]] >= 2  # a step of B sequences is at least two launches


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_seeded_sampling_of_more_than_max_rows_is_the_reference(llama, backend):
    params = [
        SamplingParams(max_tokens=3, temperature=0.9, top_k=[0, 8][i % 2], seed=100 + i, ignore_eos=True)
        for i in range(18)
    ]
    ex = BACKENDS[backend](llama)
    got = run(llama, ex, params)
    assert got == run(llama, ReferenceExecutor(llama), params)
    assert ex.stats["device_sampled_steps"] > 0


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_sample_tokens_refuses_more_than_max_rows(llama, backend):
    ex = BACKENDS[backend](llama)
    B = ex.max_rows + 1
    cache = ex.new_cache(llama.cfg, B, torch.float32, "cpu", 4)
    rows = [SampleRow.of(SamplingParams(temperature=0), None)] * B
    with pytest.raises(ValueError, match=f"at most max_rows = {ex.max_rows} sequences a call, got {B}"):
        ex.sample_tokens(torch.ones(B, 1, dtype=torch.long), cache, list(range(B)), 1, rows)


def test_row_groups_cut_to_a_limit(llama):
    reqs = [Request(str(i), None, [5], SamplingParams(), frozenset()) for i in range(5)]
    core = new_core(llama, ReferenceExecutor(llama), 5)
    assert core.row_groups(reqs) == [reqs]
    assert core.row_groups(reqs, 2) == [reqs[0:2], reqs[2:4], reqs[4:5]]
    alone = new_core(llama, ReferenceExecutor(llama), 5, batch_invariant=True)
    assert alone.row_groups(reqs, 2) == [[r] for r in reqs]
