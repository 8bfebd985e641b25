"""KDA state rollback and cache truncation: a verification step of T rows with ``keep_states``,
then ``commit`` of n rows (all rejected: n = 1; all accepted: n = T; partial; zero drafts: T = 1),
leaves the caches exactly as plain one-token decoding of the kept tokens would, and the next steps
continue identically (bit for bit on k3-nano's shapes; to float rounding on odd tiny shapes)."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import KDAState, ModelCache
from nonstop.model.rows import row_exact
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.speculative.helpers import tiny_model

FAMILIES = ["kimi_k3", "kimi_linear", "kimi_linear_layer_types", "deepseek_v3", "llama"]


def executors(model):
    return {"reference": ReferenceExecutor(model), "superop": SuperOpExecutor(model, use_kernels=False)}


def prefilled(model, ex, prompts):
    cache = ModelCache(model.cfg, len(prompts), capacity=8)
    with torch.inference_mode():
        for slot, p in enumerate(prompts):
            b = cache.batch([slot], len(p))
            ex.forward(torch.tensor([p]), cache, b)
            cache.advance(b)
    return cache


def plain_logits(model, ex, prompt, tokens):
    """Logits of one-token decode steps over ``tokens`` after ``prompt``, and the final cache."""
    cache = prefilled(model, ex, [prompt])
    rows = []
    with torch.inference_mode():
        for t in tokens:
            b = cache.batch([0], 1)
            rows.append(ex.forward(torch.tensor([[t]]), cache, b)[0, 0])
            cache.advance(b)
    return torch.stack(rows), cache


def check_equal(got, want, exact):
    if exact:
        assert torch.equal(got, want), (got - want).abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "superop"])
@pytest.mark.parametrize("name", FAMILIES + ["k3-nano"])
def test_commit_then_continue(name, backend):
    model = tiny_model(name)
    ex = executors(model)[backend]
    exact = name == "k3-nano"  # widths that are multiples of the CPU vector block: bit-identical
    V = model.cfg.vocab_size
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (6, 9, 4)]
    T = 5
    rows = torch.randint(0, V, (3, T), generator=g)
    keep = [1, T, 3]  # all rejected, all accepted, partial
    nxt = torch.randint(0, V, (3, 2), generator=g)
    cache = prefilled(model, ex, prompts)
    with torch.inference_mode(), row_exact():
        b = cache.batch([0, 1, 2], T, keep_states=True)
        verify_logits = ex.forward(rows, cache, b)
        cache.commit(b, torch.tensor(keep))
        assert cache.lengths.tolist() == [len(p) + n for p, n in zip(prompts, keep)]
        after = []
        for j in range(2):  # two more plain steps for all three sequences at once
            b = cache.batch([0, 1, 2], 1)
            after.append(ex.forward(nxt[:, j : j + 1], cache, b)[:, 0])
            cache.advance(b)
    for s, (p, n) in enumerate(zip(prompts, keep)):
        want, want_cache = plain_logits(model, ex, p, rows[s].tolist()[:n] + nxt[s].tolist())
        if n == T:
            check_equal(verify_logits[s], want[:T], exact)
        check_equal(torch.stack([a[s] for a in after]), want[n:], exact)
        for mine, theirs in zip(cache.layers, want_cache.layers):
            if isinstance(mine, KDAState):
                check_equal(mine.recurrent[s], theirs.recurrent[0], exact)
                check_equal(mine.conv[s], theirs.conv[0], exact)


@pytest.mark.parametrize("name", ["kimi_k3", "k3-nano"])
def test_zero_drafts_step_equals_a_plain_step(name):
    model = tiny_model(name)
    ex = ReferenceExecutor(model)
    prompt = [5, 7, 11, 13]
    want, _ = plain_logits(model, ex, prompt, [17, 19])
    cache = prefilled(model, ex, [prompt])
    with torch.inference_mode(), row_exact():
        got = []
        for t in (17, 19):
            b = cache.batch([0], 1, keep_states=True)
            got.append(ex.forward(torch.tensor([[t]]), cache, b)[0, 0])
            cache.commit(b, torch.tensor([1]))
    check_equal(torch.stack(got), want, name == "k3-nano")


def test_commit_needs_the_history():
    """An executor that ignores keep_states leaves no history: commit refuses instead of installing garbage."""
    model = tiny_model("kimi_k3")
    ex = ReferenceExecutor(model)
    cache = prefilled(model, ex, [[1, 2, 3]])
    with torch.inference_mode():
        b = cache.batch([0], 3)  # no keep_states
        ex.forward(torch.tensor([[4, 5, 6]]), cache, b)
        b.keep_states = True
        with pytest.raises(RuntimeError, match="history"):
            cache.commit(b, torch.tensor([2]))


def test_commit_checks_counts():
    model = tiny_model("kimi_k3")
    cache = ModelCache(model.cfg, 1, capacity=8)
    b = cache.batch([0], 3, keep_states=True)
    for bad in ([0], [4]):
        with pytest.raises(ValueError, match="counts"):
            cache.commit(b, torch.tensor(bad))
