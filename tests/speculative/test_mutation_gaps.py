"""Gaps the mutation audit found in the speculative tests: the bonus token's row, the n-gram lookup's
choice of match (longest n first, then the latest occurrence), the drafter and config edge checks, the
acceptance metrics when a stop ends a block inside the accepted drafts, the rows a drafter observes,
and verification groups that fit the executor's row limit."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig
from nonstop.engine.speculative.drafter import Draft
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel
from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
from nonstop.engine.speculative.ngram import NgramDrafter, lookup
from nonstop.engine.speculative.verify import sample_verify, verify
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.speculative.helpers import (
    ScriptedDrafter,
    generate,
    record_verify_rows,
    teacher_forced_logits,
    tiny_model,
)

GREEDY = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
REPEATING = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 8, 9, 8, 9, 8, 9], [1, 2, 3, 1, 2]]


# ----------------------------------------------------------------------------- verification


def test_bonus_token_is_drawn_from_the_row_after_the_last_draft():
    """Row i of the target is the distribution after d_i: with every draft certain to be accepted, the
    bonus is a draw from row k (here one-hot on a token no other row allows)."""
    target = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert sample_verify([1, 2], None, target, g) == [1, 2, 3]
        assert sample_verify([1, 2], target[1:3].clone(), target, g) == [1, 2, 3]  # sampled drafts, q = p
    logits = torch.tensor([[0.0, 50.0, 0.0, 0.0], [0.0, 0.0, 0.0, 50.0]])
    assert verify([1], None, logits, SamplingParams(temperature=1.0), g) == [1, 3]


# ----------------------------------------------------------------------------- n-gram drafting


def test_ngram_prefers_the_latest_earlier_occurrence():
    # [1, 2] occurs at 0 (followed by 8) and at 3 (followed by 9): the latest one wins
    assert lookup([1, 2, 8, 1, 2, 9, 1, 2], 1, 2, 2) == [9]
    assert lookup([4, 7, 5, 4, 7, 6, 0, 4, 7], 3, 2, 1) == [6, 0, 4]


def test_ngram_prefers_the_longest_suffix():
    # n = 3: [1, 2, 3] recurs at 0 (then 7); n = 1: [3] recurs more recently at 5 (then 8)
    assert lookup([1, 2, 3, 7, 9, 3, 8, 1, 2, 3], 1, 3, 1) == [7]


def test_ngram_drafter_refuses_min_above_max():
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(max_n=2, min_n=3)
    assert NgramDrafter(max_n=3, min_n=3).min_n == 3


def test_zero_draft_tokens_is_a_valid_config():
    # README: "--num-draft-tokens K ... K is 0..15"
    assert SpeculativeConfig.parse({"method": "ngram", "num_tokens": 0}).num_tokens == 0


def test_equal_ngram_sizes_are_a_valid_config():
    cfg = SpeculativeConfig.parse({"method": "ngram", "ngram_max": 3, "ngram_min": 3})
    assert (cfg.ngram_min, cfg.ngram_max) == (3, 3)


# ----------------------------------------------------------------------------- engine step


def test_metrics_when_a_stop_token_ends_the_block_inside_the_drafts():
    """All drafts right, k = 4, a stop token at output position j (1 <= j <= 3, a draft, not the bonus):
    the first verification step emits t_1..t_j and stops, so exactly j drafts were accepted and emitted."""
    model = tiny_model("kimi_k3")
    free = generate(model, ReferenceExecutor(model), REPEATING, GREEDY)
    checked = 0
    for prompt, out in zip(REPEATING, free):
        ids = out.token_ids
        j = next((j for j in (3, 2, 1) if ids[j] not in ids[:j]), None)
        if j is None:
            continue
        params = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True, stop_token_ids=[ids[j]])
        drafter = ScriptedDrafter({"0": ids}, 99, model.cfg.vocab_size)
        got = generate(model, ReferenceExecutor(model), [prompt], params, drafter, num_tokens=4)[0]
        m = got.metrics
        assert got.token_ids[: j + 1] == ids[: j + 1] and got.finish_reason == "stop"
        assert (m["verify_steps"], m["drafted_tokens"], m["accepted_tokens"]) == (1, 4, j)
        assert m["mean_accepted_length"] == j
        checked += 1
    assert checked


class RecordingDrafter(ScriptedDrafter):
    """A scripted drafter with a tap: checks that, whenever it is asked to propose, it has observed
    exactly the positions in the cache (prompt + output less the last emitted token)."""

    taps = (0,)

    def __init__(self, truth, right, vocab):
        super().__init__(truth, right, vocab)
        self.seen: dict[str, int] = {}
        self.proposals = 0

    def observe(self, req, hidden) -> None:
        self.seen[req.request_id] = self.seen.get(req.request_id, 0) + hidden[0].shape[0]

    def propose(self, req, k: int) -> Draft:
        assert self.seen.get(req.request_id, 0) == len(req.prompt_ids) + len(req.output_ids) - 1
        self.proposals += 1
        return super().propose(req, k)


def test_a_drafter_observes_only_the_committed_rows():
    model = tiny_model("kimi_k3")
    want = generate(model, ReferenceExecutor(model), REPEATING, GREEDY)
    drafter = RecordingDrafter({o.request_id: o.token_ids for o in want}, 1, model.cfg.vocab_size)
    got = generate(model, ReferenceExecutor(model), REPEATING, GREEDY, drafter, num_tokens=3)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert drafter.proposals > len(REPEATING)  # several verification steps, with rejected drafts in them


def test_verification_groups_fit_the_program_row_limit():
    """Five requests with 3 drafts (4 rows each) under the superop program (16 rows): groups of at most
    4 requests, so every verification forward runs at most max_rows rows (none falls back to the reference)."""
    model = tiny_model("kimi_k3")
    ex = SuperOpExecutor(model, use_kernels=False)
    rows_seen = record_verify_rows(ex)
    prompts = REPEATING + [[7, 1, 7, 1, 7], [2, 2, 2, 2]]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    always_three = ScriptedDrafter({str(i): [] for i in range(len(prompts))}, 99, model.cfg.vocab_size)
    generate(model, ex, prompts, params, always_three, num_tokens=3, batch_invariant=False)
    assert rows_seen and max(rows_seen) == ex.max_rows == 16  # 4 requests x 4 rows, then 1 x 4


# ----------------------------------------------------------------------------- DSpark drafter


def _dspark(target, window: int, **cfg) -> DSparkModel:
    torch.manual_seed(1)
    d = dict(block_size=4, num_heads=2, head_dim=8, intermediate_size=32, context_window=window, markov_rank=4)
    model = DSparkModel(DSparkConfig(target.cfg.vocab_size, target.cfg.hidden_size, taps=(2, 5), **{**d, **cfg}))
    with torch.no_grad():  # a Markov head big enough to steer the drafts
        model.markov_w1.weight.mul_(3.0)
        model.markov_w2.weight.normal_(0, 3.0)
    return model.eval()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dspark_drafts_equal_the_teacher_forced_training_pass(temperature):
    """Observing 11 positions in two calls (a window of 8) and drafting from the anchor at position 11
    gives what the training pass (``DSparkModel.forward``) predicts from the last 8 context features at
    positions 3..10, the anchor at 11 and, before slot i, draft i-1: its argmax (greedy), or its softmax
    as the draft distribution q (sampling at temperature 1, no filter)."""
    from types import SimpleNamespace

    target = tiny_model("kimi_k3")
    model = _dspark(target, window=8)
    drafter = DSparkDrafter(model, target, num_tokens=4)
    d, n, anchor = target.cfg.hidden_size, 11, 17
    gen = torch.Generator().manual_seed(2)
    hidden = {2: torch.randn(n, d, generator=gen), 5: torch.randn(n, d, generator=gen)}
    params = SamplingParams(temperature=temperature)
    req = SimpleNamespace(output_ids=[anchor], params=params, generator=torch.Generator().manual_seed(3))
    drafter.start(req)
    drafter.observe(req, {t: h[:5] for t, h in hidden.items()})
    drafter.observe(req, {t: h[5:] for t, h in hidden.items()})
    draft = drafter.propose(req, 4)
    assert len(draft.tokens) == 4
    feats = torch.cat([hidden[2], hidden[5]], dim=-1)[-8:]
    logits = teacher_forced_logits(model, target, feats, anchor, n, [anchor] + draft.tokens[:3])
    if temperature == 0:
        assert draft.probs is None and logits.argmax(-1).tolist() == draft.tokens
    else:
        torch.testing.assert_close(draft.probs.float(), torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)


def test_dspark_drafter_of_another_vocabulary_is_refused():
    target = tiny_model("kimi_k3")
    torch.manual_seed(0)
    cfg = DSparkConfig(target.cfg.vocab_size + 1, target.cfg.hidden_size, taps=(2,), num_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="does not fit the target"):
        DSparkDrafter(DSparkModel(cfg), target)


def test_a_drafter_directory_without_config_is_named(tmp_path):
    from nonstop.engine.speculative.config import drafter_dir

    config = SpeculativeConfig.parse({"method": "dspark", "drafter": str(tmp_path)})
    with pytest.raises(ValueError, match="no config.json in the drafter directory"):
        drafter_dir(config, None)
