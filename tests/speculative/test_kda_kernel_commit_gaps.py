"""Gaps the mutation audit found around the KDA Triton kernels' per-token histories.

A speculative verification step through the kernels (``keep_states``) followed by ``ModelCache.commit``
of a partially accepted draft must leave each slot's KDA recurrent state and conv window exactly as
plain one-token decoding of the kept tokens (through the same kernels, which then never touch a
history) leaves them, in slots that are neither 0..B-1 nor in order, and must leave a slot outside the
step untouched. The twin comparison in ``tests/kernels/harness.py`` checks kernel against twin; this
checks the history the kernels write against the semantics ``commit`` gives it.
"""

from __future__ import annotations

import warnings

import pytest
import torch

triton = pytest.importorskip("triton")

from nonstop.cache.state import KDAState, ModelCache  # noqa: E402
from nonstop.kernels import kda  # noqa: E402
from nonstop.program.reference import REFERENCE  # noqa: E402
from nonstop.runtime.superop import SuperOpExecutor  # noqa: E402
from tests.speculative.helpers import tiny_model  # noqa: E402

PROMPTS = {0: [5, 6, 7], 1: [9, 8, 7, 6, 5], 3: [2, 4, 6, 8]}  # slot -> prompt (slot 2 unused)


def _executor(model):
    """KDA kernels, twins for every other kind (the CPU interpreter runs the kernels)."""
    return SuperOpExecutor(model, use_kernels=True, graphs=False, kernels={**REFERENCE, **kda.KERNELS})


def _prefill(ex, cache, slot, prompt):
    b = cache.batch([slot], len(prompt))
    ex.forward(torch.tensor([prompt]), cache, b)
    cache.advance(b)


def _plain_state(model, ex, prompt, tokens):
    """KDA (recurrent, conv) per layer after plain one-token steps over ``tokens`` after ``prompt``."""
    cache = ModelCache(model.cfg, 1, capacity=16)
    _prefill(ex, cache, 0, prompt)
    for t in tokens:
        b = cache.batch([0], 1)
        ex.forward(torch.tensor([[t]]), cache, b)
        cache.advance(b)
    return [(x.recurrent[0].clone(), x.conv[0].clone()) for x in cache.layers if isinstance(x, KDAState)]


@pytest.mark.parametrize("config", ["kimi_linear", "kimi_k3"])
def test_kernel_verify_then_partial_commit_equals_plain_decode(config):
    """Catches a kernel that stores the state (kda_core) or conv window (kda_in_proj) of the wrong token in
    the history (off by one, reversed order) or into the wrong slot's history (sequence index b for slot
    ``slots[b]``): after a verification step of T = 4 rows on slots [3, 1] and a commit keeping 3 and 1
    rows, each slot's state must equal plain decoding of the kept tokens; slot 0 (not in the step) keeps
    its state."""
    model = tiny_model(config)
    ex = _executor(model)
    rows = torch.tensor([[11, 12, 13, 14], [21, 22, 23, 24]])  # slot 3, slot 1
    keep = [3, 1]  # partial (two drafts accepted), all drafts rejected
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cache = ModelCache(model.cfg, 4, capacity=16)
        for slot, prompt in PROMPTS.items():
            _prefill(ex, cache, slot, prompt)
        kda_layers = [x for x in cache.layers if isinstance(x, KDAState)]
        untouched = [(x.recurrent[0].clone(), x.conv[0].clone()) for x in kda_layers]
        b = cache.batch([3, 1], 4, keep_states=True)
        ex.forward(rows, cache, b)
        cache.commit(b, torch.tensor(keep))
        want = {
            slot: _plain_state(model, ex, PROMPTS[slot], rows[i, :n].tolist())
            for i, (slot, n) in enumerate(zip([3, 1], keep))
        }
    assert kda_layers
    for i, layer in enumerate(kda_layers):
        assert torch.equal(layer.recurrent[0], untouched[i][0]), f"KDA layer {i}: slot 0 recurrent changed"
        assert torch.equal(layer.conv[0], untouched[i][1]), f"KDA layer {i}: slot 0 conv changed"
        for slot in (3, 1):
            rec, conv = want[slot][i]
            torch.testing.assert_close(layer.recurrent[slot], rec, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(layer.conv[slot], conv, rtol=1e-5, atol=1e-6)
