"""Gaps in the DSpark distillation data helpers (``nonstop/engine/speculative/distill.py``): the token
stream choice, prompt windows, the target's batched generation, the teacher labels and the set builder.
Expected values come from plain loops over the cache-free forward written here."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from nonstop.cache.state import StepBatch
from nonstop.engine.speculative import distill
from tests.speculative.helpers import tiny_model

# ----------------------------------------------------------------------------- token stream and prompts


class _RecordingTokenizer:
    def __init__(self):
        self.calls = []

    def encode(self, text, add_special_tokens=True):
        self.calls.append((len(text), add_special_tokens))
        return [ord(c) % 7 for c in text]


def _corpus_root(tmp_path, text: str):
    (tmp_path / "build" / "corpus").mkdir(parents=True)
    (tmp_path / "build" / "corpus" / "train.txt").write_text(text)
    (tmp_path / "build" / "tokens").mkdir(parents=True)
    return tmp_path


def test_token_stream_takes_the_first_cached_stream_that_fits_the_vocabulary(tmp_path):
    """A cached stream holding an id >= vocab (another tokenizer's) is skipped; one whose largest id is
    vocab - 1 is used as is (a ``<=`` check would skip it, an unchecked one would take the first)."""
    root = _corpus_root(tmp_path, "abc")
    np.save(root / "build" / "tokens" / "train-0.npy", np.array([1, 2, 10], dtype=np.int64))
    np.save(root / "build" / "tokens" / "train-1.npy", np.array([3, 9, 4], dtype=np.int64))
    tok = _RecordingTokenizer()
    ids = distill.token_stream("train", tok, 10, root)
    assert np.asarray(ids).tolist() == [3, 9, 4]
    assert tok.calls == []


def test_token_stream_falls_back_to_the_whole_corpus_without_special_tokens(tmp_path):
    """No cached stream fits: the corpus text is tokenized (all of a 9000-character text; no BOS/EOS)."""
    text = "hello world " * 750
    root = _corpus_root(tmp_path, text)
    np.save(root / "build" / "tokens" / "train-0.npy", np.array([1, 50], dtype=np.int64))
    tok = _RecordingTokenizer()
    ids = distill.token_stream("train", tok, 10, root)
    assert tok.calls == [(len(text), False)]
    assert ids.dtype == np.int64 and ids.tolist() == [ord(c) % 7 for c in text]


def test_sample_prompts_are_contiguous_windows_covering_every_start():
    """Each prompt is stream[s : s + length], every start 0..len - length drawn (the last full window was
    never picked, and a stream exactly one window long raised ValueError)."""
    stream = np.arange(100, 120)
    prompts = distill.sample_prompts(stream, 600, 5, np.random.default_rng(0))
    assert prompts.shape == (600, 5) and prompts.dtype == torch.int64
    starts = set()
    for row in prompts.tolist():
        s = row[0] - 100
        assert row == list(range(100 + s, 105 + s))
        starts.add(s)
    assert starts == set(range(0, 16))
    assert distill.sample_prompts(np.arange(7, 12), 2, 5, np.random.default_rng(1)).tolist() == [[7, 8, 9, 10, 11]] * 2


# ----------------------------------------------------------------------------- generation


_NANO = []


def _nano():
    """The trained k3-nano target (a random tiny model's next token hardly depends on the context)."""
    if not _NANO:
        from pathlib import Path

        import nonstop
        from nonstop.config import ModelConfig
        from nonstop.model.build import load_model

        path = Path(nonstop.__file__).parent / "assets" / "k3-nano"
        _NANO.append(load_model(ModelConfig.from_file(path), path, torch.float32))
    return _NANO[0]


def _full_logits(model, seqs: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(seqs)


def test_greedy_generation_matches_a_cache_free_loop():
    """Greedy decode of a batch of different prompts equals, token by token, the argmax of a cache-free
    forward over the sequence so far (catches a missing cache advance, rows swapped between slots, an
    argmin, a temperature test inverted)."""
    model = _nano()
    prompts = torch.tensor([[310, 45, 1200, 66], [90, 1700, 2, 441]])
    got = distill.generate(model, prompts, 5, 0.0, torch.Generator().manual_seed(0))
    want = prompts.clone()
    for _ in range(5):
        want = torch.cat([want, _full_logits(model, want)[:, -1].argmax(-1)[:, None]], 1)
    assert got.tolist() == want.tolist()


def test_sampled_generation_draws_softmax_over_t_from_the_callers_generator():
    """At T = 0.8 each token is multinomial(softmax(logits / T)) drawn from the given generator: a plain
    loop with an identically seeded generator gives the same tokens, whatever the global RNG holds."""
    model = _nano()
    prompts = torch.tensor([[310, 45, 1200, 66], [90, 1700, 2, 441]])
    torch.manual_seed(1)
    got = distill.generate(model, prompts, 6, 0.8, torch.Generator().manual_seed(5))
    torch.manual_seed(2)
    again = distill.generate(model, prompts, 6, 0.8, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    want = prompts.clone()
    for _ in range(6):
        probs = torch.softmax(_full_logits(model, want)[:, -1] / 0.8, -1)
        want = torch.cat([want, torch.multinomial(probs, 1, generator=g)], 1)
    assert got.tolist() == again.tolist() == want.tolist()


# ----------------------------------------------------------------------------- teacher labels


def test_teacher_features_argmax_and_renormalised_top8():
    """features = the residual streams entering the tapped layers (in tap order; L = after the last
    layer), fp16; argmax and the top-8 ids of the target's next-token distribution, their probabilities
    renormalised to sum 1 (computed here from the cache-free forward with plain loops)."""
    model = tiny_model("llama")
    seqs = torch.tensor([[3, 4, 5, 6, 7], [90, 17, 2, 44, 8]])
    B, L = seqs.shape
    taps = (3, 1)
    out = distill.teacher(model, seqs, taps)

    with torch.inference_mode():
        batch = StepBatch(torch.arange(B), torch.zeros(B, dtype=torch.long), L)
        h = model.embed_tokens(seqs)
        entering = []
        for layer in model.layers:
            entering.append(h)
            h = h + layer.attention(h, batch, None)
            h = h + layer.ffn(h)
        entering.append(h)
        logits = model(seqs)
    d = model.cfg.hidden_size
    assert out["features"].dtype == torch.float16 and out["features"].shape == (B, L, 2 * d)
    torch.testing.assert_close(out["features"][..., :d].float(), entering[3].half().float())
    torch.testing.assert_close(out["features"][..., d:].float(), entering[1].half().float())
    assert out["seqs"].tolist() == seqs.tolist()
    assert out["argmax"].tolist() == logits.argmax(-1).tolist()
    for b in range(B):
        for j in range(L):
            row = torch.softmax(logits[b, j].double(), -1).tolist()
            order = sorted(range(len(row)), key=lambda v: -row[v])[:8]
            mass = sum(row[v] for v in order)
            assert out["top_ids"][b, j].tolist() == order
            want = torch.tensor([row[v] / mass for v in order], dtype=torch.float32)
            torch.testing.assert_close(out["top_probs"][b, j], want, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- set builder


def test_build_set_batches_n_sequences_and_picks_the_temperature_by_share(monkeypatch):
    """n = 5 in batches of 2: batches of 2, 2, 1 (never more than n, never an empty batch); sampled_share 0
    gives greedy batches only, share 1 sampled (T = 0.8) only; the parts are concatenated in order."""
    calls = []

    def fake_generate(model, prompts, new_tokens, temperature, gen):
        calls.append((prompts.shape[0], temperature))
        return torch.cat([prompts, torch.full((prompts.shape[0], new_tokens), len(calls))], 1)

    monkeypatch.setattr(distill, "generate", fake_generate)
    monkeypatch.setattr(distill, "teacher", lambda model, seqs, taps: {"seqs": seqs})
    stream = np.arange(50)
    for share, temperature in ((0.0, 0.0), (1.0, 0.8)):
        calls.clear()
        out = distill.build_set(None, stream, 5, 3, 2, share, (1,), np.random.default_rng(0), None, 2, float("inf"))
        assert calls == [(2, temperature), (2, temperature), (1, temperature)]
        assert out["seqs"].shape == (5, 5)
        assert out["seqs"][:, 3:].tolist() == [[1, 1], [1, 1], [2, 2], [2, 2], [3, 3]]


def test_a_set_whose_deadline_has_passed_still_gets_one_batch(monkeypatch):
    """A data budget already spent (the model loaded slowly, the held-out set took it all) made ``build_set``
    return nothing and fail with IndexError on ``parts[0]`` before training began; it now builds one batch."""
    monkeypatch.setattr(
        distill, "generate", lambda model, prompts, new, temperature, gen: torch.cat([prompts, prompts[:, :new]], 1)
    )
    monkeypatch.setattr(distill, "teacher", lambda model, seqs, taps: {"seqs": seqs})
    stream = np.arange(50)
    out = distill.build_set(None, stream, 5, 3, 2, 0.0, (1,), np.random.default_rng(0), None, 2, float("-inf"))
    assert out["seqs"].shape == (2, 5)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--new-tokens", "5", "--block-size", "6"], "--block-size 6 exceeds --new-tokens 5"),
        (["--sequences", "0"], "--sequences must be >= 1, got 0"),
        (["--heldout-sequences", "0"], "--heldout-sequences must be >= 1, got 0"),
        (["--block-size", "0"], "--block-size must be >= 1, got 0"),
        (["--data-share", "1.5"], r"--data-share in \(0, 1\), got 20.0 and 1.5"),
    ],
)
def test_sizes_that_cannot_make_a_drafter_are_refused_before_the_model_loads(flags, message, capsys):
    """A block longer than the generated continuation failed after all the data was built with torch's
    "random_ expects 'from' to be less than 'to'"; zero sequences with IndexError. Each is now a usage error
    (exit 2) naming the options, before anything loads (the model path here does not exist)."""
    with pytest.raises(SystemExit) as exit_info:
        distill.main(["--model", "/nonexistent/model", *flags])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def _nano_dir():
    from pathlib import Path

    import nonstop

    return Path(nonstop.__file__).parent / "assets" / "k3-nano"


@pytest.mark.parametrize(
    "flags,corpus_chars,message",
    [
        (["--model", "/nonexistent/model"], None, "config.json not found"),
        (["--taps", "a"], None, "--taps: expected comma-separated layer indices >= 0, got 'a'"),
        (["--taps", "3,-1"], None, "--taps: expected comma-separated layer indices >= 0, got '3,-1'"),
        (["--taps", "3,9"], None, r"--taps 3,9: the target's layers are 0\.\.8"),
        ([], None, "no train token stream under .*python -m nonstop.train.corpus"),
        (["--prompt-len", "4000"], 2000, "--prompt-len 4000 is longer than the shortest token stream"),
    ],
)
def test_bad_inputs_are_one_line_errors_not_tracebacks(flags, corpus_chars, message, tmp_path, capsys):
    """A missing model, a malformed or out-of-range ``--taps`` (layer 9 of 8 was a KeyError in the teacher
    pass), a root without a corpus and a prompt longer than the token stream (a ValueError from numpy) were
    tracebacks; each is now an exit-2 error naming the cause."""
    root = tmp_path / "root"
    if corpus_chars is not None:
        (root / "build" / "corpus").mkdir(parents=True)
        for split in ("train", "heldout"):
            (root / "build" / "corpus" / f"{split}.txt").write_text("the quick brown fox " * (corpus_chars // 20))
    argv = ["--model", str(_nano_dir()), "--root", str(root), "--out", str(tmp_path / "out"), *flags]
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as exit_info:
            distill.main(argv)
    finally:
        torch.set_num_threads(threads)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- the training run


class _Clock:
    """A stand-in for the ``time`` module whose clock advances 30 ms per reading (deterministic budgets)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.03
        return self.now

    @staticmethod
    def strftime(fmt: str) -> str:
        return "00:00:00"


def test_a_short_training_run_uses_the_documented_taps_anchors_and_schedule(tmp_path, monkeypatch):
    """``main`` on k3-nano (8 layers, AttnRes blocks of 3): taps = the block boundaries 3, 6 + the final
    residual 8; training anchors start at prompt_len // 2, held-out evaluation on greedy continuations
    from prompt_len; the learning rate warms up linearly over 100 steps (step s: lr * (s + 1) / 100) times
    a cosine factor in (0, 1] that never grows; the Markov bias starts at zero."""
    import json
    from pathlib import Path

    import nonstop

    model_dir = Path(nonstop.__file__).parent / "assets" / "k3-nano"
    corpus = tmp_path / "root" / "build" / "corpus"
    corpus.mkdir(parents=True)
    text = (Path(nonstop.__file__).parent / "assets" / "heldout_sample.txt").read_text()[:6000]
    for split in ("train", "heldout"):
        (corpus / f"{split}.txt").write_text(text)

    seen = {"anchors": [], "lrs": [], "temps": [], "markov_w2": []}
    real_sample, real_evaluate, real_generate = distill.sample_examples, distill.evaluate, distill.generate

    def sample_examples(data, n, min_anchor, cfg, gen):
        seen["anchors"].append(min_anchor)
        return real_sample(data, n, min_anchor, cfg, gen)

    def evaluate(drafter, data, min_anchor, embed, head, **kw):
        seen["eval_anchor"] = min_anchor
        seen["eval_sequences"] = int(data["seqs"].shape[0])
        return real_evaluate(drafter, data, min_anchor, embed, head, **kw)

    def generate(model, prompts, new_tokens, temperature, gen):
        seen["temps"].append((prompts.shape[0], temperature))
        return real_generate(model, prompts, new_tokens, temperature, gen)

    class AdamW(torch.optim.AdamW):
        def step(self, *args, **kw):
            seen["lrs"].append(self.param_groups[0]["lr"])
            return super().step(*args, **kw)

    real_loss = distill.loss_fn

    def loss_fn(drafter, b, embed, head):
        if not seen["markov_w2"]:
            seen["markov_w2"].append(float(drafter.markov_w2.weight.detach().abs().max()))
        return real_loss(drafter, b, embed, head)

    monkeypatch.setattr(distill, "sample_examples", sample_examples)
    monkeypatch.setattr(distill, "evaluate", evaluate)
    monkeypatch.setattr(distill, "generate", generate)
    monkeypatch.setattr(distill, "loss_fn", loss_fn)
    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    monkeypatch.setattr(distill, "time", _Clock())  # 30 ms per reading: the budget counts clock readings
    threads = torch.get_num_threads()
    out = tmp_path / "out"
    argv = ["--model", str(model_dir), "--root", str(tmp_path / "root"), "--out", str(out), "--minutes", "0.03"]
    argv += ["--data-share", "0.5", "--heldout-sequences", "2", "--sequences", "4", "--prompt-len", "8"]
    argv += ["--new-tokens", "5", "--block-size", "2", "--context-window", "4", "--batch", "4", "--threads", "2"]
    argv += ["--heads", "1", "--head-dim", "8", "--intermediate", "16", "--markov-rank", "4", "--seed", "3"]
    try:
        assert distill.main(argv) == 0
    finally:
        torch.set_num_threads(threads)

    config = json.loads((out / "config.json").read_text())
    assert config["taps"] == [3, 6, 8] and config["block_size"] == 2
    assert config["training"]["heldout_sequences"] == 2 and config["training"]["train_sequences"] == 4
    assert seen["temps"][0] == (2, 0.0)  # held-out continuations are greedy
    assert seen["eval_anchor"] == 8 and seen["eval_sequences"] == 2
    lrs = seen["lrs"]
    assert len(lrs) >= 3 and config["training"]["steps"] == len(lrs)
    assert seen["anchors"] == [4] * len(lrs) + [8]  # training steps, then the held-out evaluation
    assert seen["markov_w2"] == [0.0]
    factors = [lr / (2e-3 * (s + 1) / 100) for s, lr in enumerate(lrs)]
    assert all(0 < f <= 1 + 1e-9 for f in factors[:-1]) and 0 <= factors[-1] < 0.2  # decayed by the end
    assert all(b <= a + 1e-12 for a, b in zip(factors, factors[1:]))


# ----------------------------------------------------------------------------- examples and evaluation


def _chain_data(L: int = 12) -> dict:
    """One sequence 0, 1, ..., L-1 whose target argmax at position j is j + 1 (the next token)."""
    seqs = torch.arange(L)[None]
    return {
        "features": torch.zeros(1, L, 2, dtype=torch.float16),
        "seqs": seqs,
        "argmax": seqs + 1,
        "top_ids": torch.stack([seqs + 1, seqs], -1),
        "top_probs": torch.full((1, L, 2), 0.5),
    }


def test_sample_examples_draws_only_from_the_given_generator():
    """Sequences and anchors come from ``gen`` alone: identically seeded generators give the same examples
    whatever torch's global RNG holds (the seeded evaluation and training runs are reproducible)."""
    from types import SimpleNamespace

    data = {"seqs": torch.zeros(50, 20, dtype=torch.long)}
    cfg = SimpleNamespace(block_size=3)
    torch.manual_seed(1)
    a = distill.sample_examples(data, 64, 2, cfg, torch.Generator().manual_seed(3))
    torch.manual_seed(2)
    b = distill.sample_examples(data, 64, 2, cfg, torch.Generator().manual_seed(3))
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()


class _MarkovOnly:
    """A drafter whose block logits are all zero and whose Markov head scores token prev + 1: the drafts
    follow the chain only if each slot adds the Markov bias of the previous slot's draft."""

    def __init__(self, k: int, V: int = 40):
        from types import SimpleNamespace

        self.cfg = SimpleNamespace(block_size=k, context_window=2)
        self.layers, self.k, self.V = [], k, V

    def context(self, features):
        return features

    def block_hidden(self, kv, valid, anchor_emb, anchor_pos, k):
        return anchor_pos

    def base_logits(self, anchor_pos, head):
        return torch.zeros(anchor_pos.shape[0], self.k, self.V)

    def markov(self, prev):
        return torch.nn.functional.one_hot((prev + 1) % self.V, self.V).float()


def test_evaluate_adds_the_markov_bias_of_the_previous_draft():
    """With the chain drafter every slot is right (drafts p+1, p+2, ... = the labels): acceptance 1 at every
    slot and tau(k) = 1 + k; without the Markov bias every draft would be token 0 and none accepted."""
    report = distill.evaluate(_MarkovOnly(3), _chain_data(), 2, torch.zeros(40, 1), None, n=50, seed=0)
    assert report["per_slot_conditional_acceptance"] == [1.0, 1.0, 1.0]
    assert report["tau_by_num_tokens"] == {"1": 2.0, "2": 3.0, "3": 4.0}
