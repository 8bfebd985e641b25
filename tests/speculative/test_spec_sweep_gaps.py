"""Gaps a second mutation sweep of ``nonstop/engine/speculative`` found: the n-gram drafter's use of the
whole sequence and of its configured sizes, config pass-through and preset errors, the DSpark drafter's
context window on a long first observation, its block-size cap and its filtered draft distribution, the
drafter's causal block mask, context mask and RoPE, its tap range, and the distillation helpers
(training windows, anchor range, loss and acceptance report)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.speculative import SpeculativeConfig, make_drafter
from nonstop.engine.speculative.config import drafter_dir
from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel, rotate
from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
from nonstop.engine.speculative.ngram import NgramDrafter
from tests.speculative.helpers import teacher_forced_logits

# ----------------------------------------------------------------------------- n-gram drafter


def _request(prompt: list[int], output: list[int]) -> Request:
    req = Request("0", None, list(prompt), SamplingParams(temperature=0), frozenset())
    req.output_ids = list(output)
    return req


def test_ngram_drafter_looks_up_prompt_and_output_and_drafts_k_tokens():
    """The drafter must search prompt + output (not the output only) and propose exactly k tokens: the
    suffix [5, 6] (its 5 from the prompt) recurs in the prompt, followed by 7, 8, 9."""
    req = _request([5, 6, 7, 8, 9, 5], [6])
    assert NgramDrafter(3, 2).propose(req, 2).tokens == [7, 8]
    assert NgramDrafter(3, 2).propose(req, 3).tokens == [7, 8, 9]


def test_ngram_drafter_uses_its_own_max_and_min_sizes():
    """n = 3 ([1, 2, 3] at 0, then 9) beats the later n = 1 match ([3] at 5, then 1): a drafter that mixed
    up max_n and min_n would take the 1-gram; with min_n = max_n = 3 a suffix that only recurs as a 1-gram
    gives no draft."""
    req = _request([1, 2, 3, 9, 7, 3, 1, 2, 3], [])
    assert NgramDrafter(3, 1).propose(req, 2).tokens == [9, 7]
    assert NgramDrafter(3, 3).propose(_request([4, 3, 8, 1, 2, 3], []), 2).tokens == []
    assert NgramDrafter(3, 1).propose(_request([4, 3, 8, 1, 2, 3], []), 2).tokens == [8, 1]


@pytest.mark.parametrize("max_n, min_n, error", [(3, 0, ValueError), (True, 1, TypeError), (3, False, TypeError)])
def test_ngram_drafter_refuses_bad_sizes(max_n, min_n, error):
    """min_n = 0 would look up an empty suffix (an IndexError while drafting); a bool is not a size."""
    with pytest.raises(error, match="n"):
        NgramDrafter(max_n, min_n)


# ----------------------------------------------------------------------------- config


def test_make_drafter_passes_the_configured_ngram_sizes():
    """speculative={'ngram_max': 5, 'ngram_min': 3} must reach the drafter (not its defaults 4 / 2)."""
    drafter = make_drafter(SpeculativeConfig.parse({"method": "ngram", "ngram_max": 5, "ngram_min": 3}), None, None)
    assert (drafter.max_n, drafter.min_n) == (5, 3)


def test_parse_takes_a_config_object_as_it_is():
    """LLM(speculative=SpeculativeConfig(...)) is documented: parse must return it, not refuse it as a non-dict."""
    cfg = SpeculativeConfig("ngram", num_tokens=2)
    assert SpeculativeConfig.parse(cfg) is cfg
    assert SpeculativeConfig.parse(None) is None


def test_dspark_on_a_preset_without_a_drafter_says_what_to_do(tmp_path):
    """A preset has no model directory: a clear ValueError (not a TypeError from Path(None)); a model
    directory without dspark/config.json is named."""
    with pytest.raises(ValueError, match="a preset .random weights. has no model directory"):
        drafter_dir(SpeculativeConfig("dspark"), None)
    with pytest.raises(ValueError, match="none at .*dspark .no config.json"):
        drafter_dir(SpeculativeConfig("dspark"), tmp_path)


# ----------------------------------------------------------------------------- DSpark drafter

V, D, LAYERS = 23, 16, 4


def _target(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(V, D, generator=g)
    return SimpleNamespace(
        cfg=SimpleNamespace(hidden_size=D, vocab_size=V, num_hidden_layers=LAYERS),
        embed_tokens=SimpleNamespace(weight=embed),
        lm_head_weight=torch.randn(V, D, generator=g),
    )


def _model(window: int = 8, block: int = 4, taps=(1, 4)) -> DSparkModel:
    torch.manual_seed(1)
    cfg = DSparkConfig(
        V, D, taps=taps, block_size=block, num_heads=2, head_dim=8, intermediate_size=24, context_window=window
    )
    model = DSparkModel(cfg)
    with torch.no_grad():
        model.markov_w2.weight.normal_(0, 1.0)
    return model.eval()


def _observed_drafter(params: SamplingParams, n: int, window: int = 8):
    target, model = _target(), _model(window)
    drafter = DSparkDrafter(model, target, num_tokens=4)
    g = torch.Generator().manual_seed(2)
    hidden = {1: torch.randn(n, D, generator=g), 4: torch.randn(n, D, generator=g)}
    req = SimpleNamespace(output_ids=[7], params=params, generator=torch.Generator().manual_seed(3))
    drafter.start(req)
    drafter.observe(req, hidden)  # a prompt longer than the window, in one call
    feats = torch.cat([hidden[1], hidden[4]], dim=-1)[-window:]
    return drafter, req, model, target, feats


def test_a_long_first_observation_keeps_only_the_window():
    """A prompt of 11 positions observed at once with a window of 8: drafting attends positions 3..10 only,
    as the training pass does (the first observation must be cut to the window too)."""
    drafter, req, model, target, feats = _observed_drafter(SamplingParams(temperature=1.0), n=11)
    draft = drafter.propose(req, 4)
    logits = teacher_forced_logits(model, target, feats, 7, 11, [7] + draft.tokens[:3])
    torch.testing.assert_close(draft.probs.float(), torch.softmax(logits, -1), rtol=1e-4, atol=1e-6)


def test_sampled_drafts_come_from_the_requests_filtered_distribution():
    """At temperature 0.5 with top_k 5 each draft's q is softmax(logits / 0.5) over the 5 largest logits
    (written out here), the distribution the draft token was drawn from."""
    params = SamplingParams(temperature=0.5, top_k=5)
    drafter, req, model, target, feats = _observed_drafter(params, n=6)
    draft = drafter.propose(req, 4)
    logits = teacher_forced_logits(model, target, feats, 7, 6, [7] + draft.tokens[:3]).double()
    for i, row in enumerate(logits):
        kept = row.topk(5).indices
        want = torch.zeros(V, dtype=torch.float64)
        z = torch.exp((row[kept] - row.max()) / 0.5)
        want[kept] = z / z.sum()
        torch.testing.assert_close(draft.probs[i].double(), want, rtol=1e-4, atol=1e-7)
        assert int(draft.tokens[i]) in kept.tolist()


def test_drafts_per_step_are_capped_at_the_block_size():
    """Without a num_tokens check the drafter still drafts at most block_size (4) tokens when asked for 9."""
    target, model = _target(), _model(block=4)
    drafter = DSparkDrafter(model, target)
    req = SimpleNamespace(output_ids=[3], params=SamplingParams(temperature=0), generator=None)
    drafter.start(req)
    drafter.observe(req, {1: torch.randn(5, D), 4: torch.randn(5, D)})
    assert len(drafter.propose(req, 9).tokens) == 4
    assert len(drafter.propose(req, 2).tokens) == 2


def test_drafter_taps_cover_the_embedding_and_the_final_residual_only():
    """Tap 0 (the stream entering layer 0) and tap num_layers (the final residual) are valid; one past
    the last layer is refused by name."""
    target = _target()
    assert DSparkDrafter(_model(taps=(0, LAYERS)), target).taps == (0, LAYERS)
    with pytest.raises(ValueError, match=rf"taps \[{LAYERS + 1}\] are outside the target's layers 0..{LAYERS}"):
        DSparkDrafter(_model(taps=(1, LAYERS + 1)), target)


def test_a_block_size_below_one_is_refused():
    """DSparkConfig(block_size=0) could never draft: a ValueError."""
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        DSparkConfig(V, D, taps=(1,), block_size=0, head_dim=8)


def _block_inputs(model, W: int = 5, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, W, 2 * D, generator=g)
    pos = torch.arange(W)[None]
    kv = [layer.context_kv(model.context(feats), pos) for layer in model.layers]
    return feats, pos, kv, torch.randn(1, D, generator=g), torch.tensor([W])


def test_block_slots_see_only_earlier_slots():
    """Slot i attends the context and slots 0..i: the first two slots of a 4-slot block equal a 2-slot
    block (a mask that let a slot see later slots would change them)."""
    model = _model()
    _, _, kv, emb, anchor_pos = _block_inputs(model)
    valid = torch.ones(1, 5, dtype=torch.bool)
    with torch.no_grad():
        two = model.block_hidden(kv, valid, emb, anchor_pos, 2)
        four = model.block_hidden(kv, valid, emb, anchor_pos, 4)
    torch.testing.assert_close(four[:, :2], two, rtol=1e-5, atol=1e-6)


def test_invalid_context_positions_are_ignored():
    """Context positions marked invalid (before the sequence start in training) must not change the
    block; valid ones do."""
    model = _model()
    feats, pos, kv, emb, anchor_pos = _block_inputs(model)
    valid = torch.tensor([[False, False, True, True, True]])
    other = feats.clone()
    other[:, :2] = torch.randn(1, 2, 2 * D)
    kv2 = [layer.context_kv(model.context(other), pos) for layer in model.layers]
    changed = feats.clone()
    changed[:, 3] += 1.0
    kv3 = [layer.context_kv(model.context(changed), pos) for layer in model.layers]
    with torch.no_grad():
        a = model.block_hidden(kv, valid, emb, anchor_pos, 3)
        b = model.block_hidden(kv2, valid, emb, anchor_pos, 3)
        c = model.block_hidden(kv3, valid, emb, anchor_pos, 3)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert (a - c).abs().max() > 1e-3


def test_rotate_is_half_split_rope():
    """rotate against RoPE written out: pair (i, i + D/2) turned by pos * theta^(-2i/D)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 2, 6, generator=g)
    positions = torch.tensor([[0, 5, 17]])
    theta = 100.0
    got = rotate(x, positions, theta)
    want = torch.empty_like(x)
    for s in range(3):
        for h in range(2):
            for i in range(3):
                angle = float(positions[0, s]) * theta ** (-2 * i / 6)
                a, b = float(x[0, s, h, i]), float(x[0, s, h, i + 3])
                want[0, s, h, i] = a * math.cos(angle) - b * math.sin(angle)
                want[0, s, h, i + 3] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- distillation helpers


def _data(N: int = 2, L: int = 10, m: int = 3):
    """Features whose value names (sequence, position); seqs / argmax / top ids likewise."""
    pos = torch.arange(L)
    feats = (torch.arange(N)[:, None, None] * 100 + pos[None, :, None]).expand(N, L, m).half()
    seqs = torch.arange(N)[:, None] * 100 + pos
    return {
        "features": feats,
        "seqs": seqs,
        "argmax": seqs + 1000,
        "top_ids": torch.stack([seqs, seqs + 1], -1),
        "top_probs": torch.full((N, L, 2), 0.5),
    }


def test_make_batch_windows_anchor_and_labels():
    """Anchor p: context = the W positions before p (those before 0 invalid), Markov inputs = tokens at
    p..p+k-1, labels = the target's argmax there (slot i predicts position p+i+1)."""
    from nonstop.engine.speculative.distill import make_batch

    cfg = SimpleNamespace(context_window=3, block_size=2)
    b = make_batch(_data(), torch.tensor([0, 1]), torch.tensor([1, 5]), cfg)
    assert b["valid"].tolist() == [[False, False, True], [True, True, True]]
    assert b["features"][:, :, 0][b["valid"]].tolist() == [0.0, 102.0, 103.0, 104.0]
    assert b["ctx_pos"][1].tolist() == [2, 3, 4]
    assert b["anchor_ids"].tolist() == [1, 105] and b["anchor_pos"].tolist() == [1, 5]
    assert b["prev_ids"].tolist() == [[1, 2], [105, 106]]
    assert b["labels"].tolist() == [[1001, 1002], [1105, 1106]]


def test_sample_examples_anchors_span_min_anchor_to_the_last_full_block():
    """Anchors lie in [min_anchor, L - k]: the last block's labels end at position L - 1."""
    from nonstop.engine.speculative.distill import sample_examples

    cfg = SimpleNamespace(block_size=3)
    _, anchors = sample_examples(_data(L=10), 3000, 2, cfg, torch.Generator().manual_seed(0))
    assert int(anchors.min()) == 2 and int(anchors.max()) == 10 - 3


def test_loss_is_hard_plus_soft_cross_entropy():
    """loss = mean NLL of the argmax labels + mean over slots of -sum_top p log q, computed by hand."""
    from nonstop.engine.speculative.distill import loss_fn

    logits = torch.tensor([[[1.0, 2.0, 0.0], [0.5, -1.0, 3.0]]])
    b = {
        "features": None,
        "valid": None,
        "ctx_pos": None,
        "anchor_ids": None,
        "anchor_pos": None,
        "prev_ids": None,
        "labels": torch.tensor([[1, 0]]),
        "top_ids": torch.tensor([[[1, 0], [2, 1]]]),
        "top_probs": torch.tensor([[[0.75, 0.25], [0.6, 0.4]]]),
    }
    loss, agree = loss_fn(lambda *args: logits, b, None, None)
    logp = [[x - math.log(sum(math.exp(v) for v in row)) for x in row] for row in logits[0].tolist()]
    hard = -(logp[0][1] + logp[1][0]) / 2
    soft = -((0.75 * logp[0][1] + 0.25 * logp[0][0]) + (0.6 * logp[1][2] + 0.4 * logp[1][1])) / 2
    assert float(loss) == pytest.approx(hard + soft, rel=1e-5)
    assert agree.tolist() == [1.0, 0.0]


class _ScriptedBlock:
    """A stand-in drafter for ``evaluate``: slot i drafts the right label when i < right(p) and at slot 3
    (after a miss, which must not count), else a wrong token; the Markov head adds nothing."""

    def __init__(self, data, k: int):
        self.cfg = SimpleNamespace(block_size=k, context_window=2)
        self.layers, self.data, self.k = [], data, k

    @staticmethod
    def right(p: int) -> int:
        return p % 3

    def context(self, features):
        return features

    def block_hidden(self, kv, valid, anchor_emb, anchor_pos, k):
        self.anchor_pos = anchor_pos
        return anchor_pos

    def base_logits(self, anchor_pos, head):
        labels = self.data["argmax"][0]
        out = torch.zeros(anchor_pos.shape[0], self.k, 2000)
        for n, p in enumerate(anchor_pos.tolist()):
            for i in range(self.k):
                token = int(labels[p + i]) if i < self.right(p) or i == 3 else 0
                out[n, i, token] = 1.0
        return out

    def markov(self, prev):
        return torch.zeros(prev.shape[0], 2000)


def test_evaluate_reports_conditional_acceptance_and_tau():
    """Acceptance stops at the first miss (a later right slot does not count); per-slot conditional
    acceptance = accepted at i / accepted at i-1, tau(k) = 1 + mean accepted among the first k, both
    counted here from the anchors the report used."""
    from nonstop.engine.speculative.distill import evaluate

    data = _data(N=1, L=12)
    drafter = _ScriptedBlock(data, k=4)
    report = evaluate(drafter, data, 1, torch.zeros(2000, 1), None, n=300, seed=0)
    accepted = [_ScriptedBlock.right(p) for p in drafter.anchor_pos.tolist()]
    alive = [len(accepted)] + [sum(a >= i for a in accepted) for i in range(1, 5)]
    want_cond = [round(alive[i + 1] / max(alive[i], 1), 4) for i in range(4)]
    want_tau = {str(i): round(1 + sum(min(a, i) for a in accepted) / len(accepted), 4) for i in range(1, 5)}
    assert len(set(accepted)) == 3  # anchors with 0, 1 and 2 accepted
    assert report["per_slot_conditional_acceptance"] == want_cond
    assert report["tau_by_num_tokens"] == want_tau


# ----------------------------------------------------------------------------- engine step and RNG


def _tiny_engine_run(params, right: int = 1, seed_global: int = 0):
    from nonstop.runtime.executors import ReferenceExecutor
    from tests.speculative.helpers import ScriptedDrafter, generate, tiny_model

    model = tiny_model("llama")
    prompts = [[3, 4, 5, 3, 4], [9, 8, 9]]
    truth = {"0": [0] * 12, "1": [0] * 12}
    torch.manual_seed(seed_global)
    drafter = ScriptedDrafter(truth, right, model.cfg.vocab_size)
    return generate(model, ReferenceExecutor(model), prompts, params, drafter, num_tokens=3)


def test_sampled_verification_draws_from_the_requests_generator_only():
    """A seeded sampled request gives the same tokens whatever torch's global RNG holds, and neither a
    sampled nor a greedy speculative run draws from (changes) the caller's global generator."""
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5, ignore_eos=True)
    a = _tiny_engine_run(params, seed_global=0)
    b = _tiny_engine_run(params, seed_global=1)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for p in (params, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)):
        torch.manual_seed(11)
        before = torch.random.get_rng_state()
        _tiny_engine_run(p, seed_global=11)
        assert torch.equal(torch.random.get_rng_state(), before)


def test_the_longest_drafts_verify_one_request_per_program_step():
    """num_tokens 15: 16 verify rows per request fill the superop program's 16-row step, so each forward
    holds one request (never 2 x 16 rows beyond the program's limit)."""
    from nonstop.runtime.superop import SuperOpExecutor
    from tests.speculative.helpers import ScriptedDrafter, generate, record_verify_rows, tiny_model

    model = tiny_model("kimi_k3")
    ex = SuperOpExecutor(model, use_kernels=False)
    rows_seen = record_verify_rows(ex)
    params = SamplingParams(max_tokens=17, temperature=0, ignore_eos=True)
    drafter = ScriptedDrafter({"0": [], "1": []}, 99, model.cfg.vocab_size)
    generate(model, ex, [[3, 4, 5], [7, 1, 7]], params, drafter, num_tokens=15, batch_invariant=False)
    assert rows_seen and max(rows_seen) == ex.max_rows == 16


def test_a_request_whose_verification_fails_ends_alone():
    """With isolate_errors a failure verifying one request's draft (here a draft distribution of the wrong
    width under sampling) ends that request with finish_reason 'error'; the others of the same forward
    finish normally (the failed row still commits its first row, so the step itself goes on)."""
    from nonstop.engine.core import EngineCore
    from nonstop.engine.speculative import SpeculativeDecoder
    from nonstop.engine.speculative.drafter import Draft
    from nonstop.engine.tokenizer import ByteTokenizer
    from nonstop.runtime.executors import ReferenceExecutor
    from tests.speculative.helpers import tiny_model

    model = tiny_model("llama")
    vocab = model.cfg.vocab_size

    class BadProbs:
        taps = ()

        def start(self, req):
            pass

        def observe(self, req, hidden):
            pass

        def propose(self, req, k):
            return Draft([3], torch.zeros(1, 2)) if req.request_id == "bad" else Draft([])

    decoder = SpeculativeDecoder(SpeculativeConfig("ngram", num_tokens=2), BadProbs())
    core = EngineCore(
        model.cfg,
        ReferenceExecutor(model),
        ByteTokenizer(vocab),
        2,
        torch.float32,
        "cpu",
        batch_invariant=False,
        isolate_errors=True,
        speculative_decoder=decoder,
    )
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=1, ignore_eos=True)
    good = Request("good", None, [1, 2, 3], params, frozenset())
    bad = Request("bad", None, [4, 5, 6], params, frozenset())
    core.admit(good)
    core.admit(bad)
    while core.active:
        core.step()
    assert (good.finish_reason, len(good.output_ids)) == ("length", 4)
    assert bad.finish_reason == "error" and "IndexError" in bad.error


def test_a_failed_verification_forward_ends_its_requests_with_an_error():
    """With isolate_errors an exception in the verification forward ends the requests of that forward
    (finish_reason 'error', the message kept) instead of escaping ``EngineCore.step``."""
    from nonstop.engine.core import EngineCore
    from nonstop.engine.speculative import SpeculativeDecoder
    from nonstop.engine.tokenizer import ByteTokenizer
    from nonstop.runtime.executors import ReferenceExecutor
    from tests.speculative.helpers import EmptyDrafter, tiny_model

    model = tiny_model("llama")
    ex = ReferenceExecutor(model)
    forward = ex.forward

    def failing(ids, cache, batch, *args, **kwargs):
        if batch.keep_states:
            raise RuntimeError("device lost")
        return forward(ids, cache, batch, *args, **kwargs)

    ex.forward = failing
    decoder = SpeculativeDecoder(SpeculativeConfig("ngram", num_tokens=2), EmptyDrafter())
    core = EngineCore(
        model.cfg,
        ex,
        ByteTokenizer(model.cfg.vocab_size),
        1,
        torch.float32,
        "cpu",
        isolate_errors=True,
        speculative_decoder=decoder,
    )
    req = Request("0", None, [1, 2, 3], SamplingParams(max_tokens=4, temperature=0), frozenset())
    core.admit(req)
    while core.active:
        core.step()
    assert req.finish_reason == "error" and "device lost" in req.error


def test_base_logits_are_the_lm_head_of_the_normed_hidden():
    """U = E_out RMSNorm(e) (the module docstring's formula, written out with the norm's weight)."""
    model = _model()
    with torch.no_grad():
        model.final_norm.weight.copy_(torch.linspace(0.5, 1.5, D))
    g = torch.Generator().manual_seed(6)
    hidden, head = torch.randn(2, D, generator=g), torch.randn(V, D, generator=g)
    eps = model.cfg.rms_norm_eps
    normed = hidden / torch.sqrt(hidden.pow(2).mean(-1, keepdim=True) + eps) * torch.linspace(0.5, 1.5, D)
    with torch.no_grad():
        torch.testing.assert_close(model.base_logits(hidden, head), normed @ head.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {"method": "dspark", "ngram_max": 8},
        {"method": "dspark", "ngram_min": 2},  # even at its default: asked for, it would do nothing
        {"method": "dspark", "ngram_max": 6, "ngram_min": 3, "drafter": "/x"},
    ],
)
def test_ngram_sizes_with_dspark_are_refused(options):
    """n-gram sizes given with dspark were accepted and silently dropped (a drafter given with ngram is refused)."""
    with pytest.raises(ValueError, match="ngram_m.. is an ngram option; method 'dspark' does not match n-grams"):
        SpeculativeConfig.parse(options)
    with pytest.raises(ValueError, match="is an ngram option"):
        SpeculativeConfig("dspark", ngram_max=8)
    assert SpeculativeConfig.parse({"method": "ngram", "ngram_max": 8}).ngram_max == 8
