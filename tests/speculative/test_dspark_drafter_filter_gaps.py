"""``DSparkDrafter.propose`` for a sampled request with top-k / top-p: each draft slot's distribution q is
the request's filtered distribution of the draft logits (the module docstring), not the plain softmax.

The expected q is built here from the definitions (divide by the temperature; keep the top_k largest
logits; keep the smallest most-probable prefix whose mass reaches top_p; softmax over the kept ones),
from the logits of the training pass (``teacher_forced_logits``), not from ``filter_logits``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
from tests.runtime.helpers import tiny_model
from tests.speculative.helpers import teacher_forced_logits
from tests.speculative.test_mutation_gaps import _dspark


def _filtered(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    x = logits.double() / temperature
    order = sorted(range(x.shape[0]), key=lambda i: (-float(x[i]), i))
    keep = order[:top_k] if top_k > 0 else order
    p = torch.softmax(x[keep], 0)
    if top_p < 1.0:
        mass, n = 0.0, 0
        for v in p.tolist():
            mass += v
            n += 1
            if mass >= top_p:
                break
        keep = keep[:n]
    q = torch.zeros_like(x)
    q[keep] = torch.softmax(x[keep], 0)
    return q


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (-1, 0.6)])
def test_sampled_drafts_come_from_the_filtered_distribution(top_k, top_p):
    # fails on a mutation that drops top_k / top_p from filter_logits in propose (S18, S19, S24, S25)
    target = tiny_model("kimi_k3")
    model = _dspark(target, window=8)
    drafter = DSparkDrafter(model, target, num_tokens=4)
    d, n, anchor = target.cfg.hidden_size, 9, 23
    gen = torch.Generator().manual_seed(4)
    hidden = {2: torch.randn(n, d, generator=gen), 5: torch.randn(n, d, generator=gen)}
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    req = SimpleNamespace(output_ids=[anchor], params=params, generator=torch.Generator().manual_seed(5))
    drafter.start(req)
    drafter.observe(req, hidden)
    draft = drafter.propose(req, 4)
    assert len(draft.tokens) == 4 and draft.probs is not None
    feats = torch.cat([hidden[2], hidden[5]], dim=-1)[-8:]
    logits = teacher_forced_logits(model, target, feats, anchor, n, [anchor] + draft.tokens[:3])
    want = torch.stack([_filtered(row, 0.7, top_k, top_p) for row in logits.float()])
    kept = (want > 0).sum(-1)
    assert (kept < logits.shape[-1]).all()  # the filter really removes tokens here
    torch.testing.assert_close(draft.probs.double(), want, rtol=1e-4, atol=1e-6)
    for tok, q in zip(draft.tokens, want):
        assert q[tok] > 0  # every draft is a token the filter keeps


def test_propose_drafts_at_most_the_block_size_when_asked_for_more():
    # fails on the mutation `k = min(k, block_size)` -> `k` (S11): "None: not checked, propose drafts at
    # most the block size" (DSparkDrafter's docstring)
    target = tiny_model("kimi_k3")
    model = _dspark(target, window=8)  # block_size 4
    drafter = DSparkDrafter(model, target)  # num_tokens None: not checked at construction
    gen = torch.Generator().manual_seed(6)
    hidden = {t: torch.randn(5, target.cfg.hidden_size, generator=gen) for t in (2, 5)}
    req = SimpleNamespace(output_ids=[11], params=SamplingParams(temperature=0.0), generator=None)
    drafter.start(req)
    drafter.observe(req, hidden)
    try:
        draft = drafter.propose(req, 6)
    except Exception as exc:  # noqa: BLE001 - a crash is the defect this guards against too
        pytest.fail(f"propose(k=6) with block size 4 raised {exc!r}")
    assert len(draft.tokens) == 4
    assert draft.tokens == drafter.propose(req, 4).tokens
