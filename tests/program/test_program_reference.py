"""The decode Program run through its plain-torch twins equals the reference model, for every family:
same logits at each decode step (batched rows of different lengths, T = 1 and T > 1 rows per
sequence), same greedy tokens; and its super-op count is far below the eager aten-op count."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import random_model
from nonstop.program.count import count_decode_ops
from nonstop.runtime.superop import SuperOpExecutor
from tests.tiny_configs import TINY_CONFIGS


@pytest.fixture(scope="module", params=list(TINY_CONFIGS))
def model(request):
    return random_model(ModelConfig.from_hf_dict(TINY_CONFIGS[request.param]), torch.float32, seed=5)


def test_program_steps_equal_the_model(model):
    cfg = model.cfg
    ex = SuperOpExecutor(model, use_kernels=False)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen) for n in (5, 9, 2)]
    caches = [ModelCache(cfg, 3, capacity=4) for _ in range(2)]
    for cache in caches:  # prefill each sequence in its own slot with the reference model
        for slot, p in enumerate(prompts):
            b = cache.batch([slot], len(p))
            model(p[None], cache, b)
            cache.advance(b)
    for step in range(4):
        T = 1 if step < 2 else 3  # T > 1: speculative-verification-shaped rows
        ids = torch.randint(0, cfg.vocab_size, (3, T), generator=gen)
        ref_batch, prog_batch = caches[0].batch([0, 1, 2], T), caches[1].batch([0, 1, 2], T)
        want = model(ids, caches[0], ref_batch)
        got = ex.forward(ids, caches[1], prog_batch)
        caches[0].advance(ref_batch)
        caches[1].advance(prog_batch)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert ex.stats["program_steps"] == 4


def test_greedy_generation_through_the_program(model):
    from nonstop.engine.core import EngineCore
    from nonstop.engine.requests import Request
    from nonstop.engine.sampling import SamplingParams
    from nonstop.engine.tokenizer import ByteTokenizer

    def run(executor):
        core = EngineCore(model.cfg, executor, ByteTokenizer(model.cfg.vocab_size), 2, torch.float32, "cpu")
        reqs = [
            Request(str(i), None, p, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True), frozenset())
            for i, p in enumerate([[3, 4, 5, 6], [7, 8]])
        ]
        for r in reqs:
            core.add(r)
        while core.running:
            core.step()
        return [r.output_ids for r in reqs]

    from nonstop.runtime.executors import ReferenceExecutor

    assert run(SuperOpExecutor(model, use_kernels=False)) == run(ReferenceExecutor(model))


def test_far_fewer_super_ops_than_eager_ops(model):
    ex = SuperOpExecutor(model, use_kernels=False)
    eager = count_decode_ops(model).total
    assert eager >= 10 * len(ex.program.ops), (eager, len(ex.program.ops))


def test_narrow_twin_dispatches_the_same_ops(model):
    """`nonstop program` counts huge models' eager ops on a narrow twin: the count must not depend on widths
    (a full-width slice may dispatch as `alias` what a partial one dispatches as `slice`; the total is equal)."""
    from nonstop.program.twin import narrow_twin

    twin = random_model(narrow_twin(model.cfg), torch.float32, seed=1)
    assert count_decode_ops(twin).total == count_decode_ops(model).total


def test_program_command_prints_the_counts(capsys):
    from nonstop.cli import main

    assert main(["program", "--model", "kimi-k3", "--num-layers", "2", "--summary"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("eager ops per step:"))
    eager, superops = (int(part.split(":")[1]) for part in line.split(","))
    assert eager >= 10 * superops
