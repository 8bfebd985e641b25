"""Black-box checks of the public Python API (``LLM`` / ``SamplingParams``) as a vLLM user drives it: batches
beyond ``max_batch``, ``n`` beyond ``max_batch``, seeds at any batch position, stop strings that repeat or
are prefixes of each other, ``max_tokens`` at the context's edge, near-greedy temperatures, a top_k beyond
the vocabulary, an interrupted stream, two threads on one LLM, logprobs and chunked prompt logprobs.

Expected values come from the engine run one request at a time (a different schedule), from Python's own
string search, or from hand arithmetic on the context size - never from the path under test itself."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from nonstop import LLM, SamplingParams

pytestmark = pytest.mark.timeout(120)

PROMPTS = ["The Python interpreter", "A list is", "import os", "def main():", "Hello"]


@pytest.fixture(scope="module")
def k3():
    return LLM("k3-nano", backend="reference", max_batch=2)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """The tiny Llama checkpoint with a context of 24 tokens (byte tokenizer)."""
    from tests.engine.tiny_models import synth_checkpoint

    d = synth_checkpoint("llama", tmp_path_factory.mktemp("llama24"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 24
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _alone(llm, prompt, sp):
    return llm.generate([prompt], sp)[0]


def test_a_seeded_request_gives_the_same_tokens_at_any_batch_position(k3):
    """The same prompt and seed at batch position 0 (alone) and at position 3 of five prompts, with
    max_batch 2 (so it waits in the queue and shares slots with others), samples the same tokens.
    Catches noise keyed by the batch row or slot instead of the request's seed and position."""
    sp = SamplingParams(max_tokens=8, temperature=0.9, seed=7)
    want = _alone(k3, PROMPTS[3], sp).token_ids
    got = k3.generate(PROMPTS, sp)
    assert got[3].token_ids == want
    assert [o.prompt for o in got] == PROMPTS  # outputs come back in prompt order


def test_greedy_tokens_do_not_depend_on_the_batch_or_its_overflow(k3):
    """Greedy decoding of five prompts with max_batch 2 gives each prompt the tokens it gets alone.
    Catches a queued request admitted with another's state or outputs returned out of order."""
    sp = SamplingParams(max_tokens=8, temperature=0)
    want = [_alone(k3, p, sp).token_ids for p in PROMPTS]
    assert [o.token_ids for o in k3.generate(PROMPTS, sp)] == want


def test_n_larger_than_max_batch_gives_the_seed_plus_i_completions(k3):
    """n=5 with max_batch 2: completion i is the completion of a single request seeded seed + i (the
    documented rule), the output's own fields are the first completion's, and all 5 are distinct."""
    sp = SamplingParams(max_tokens=5, temperature=1.0, n=5, seed=11)
    out = _alone(k3, PROMPTS[0], sp)
    assert len(out.samples) == 5
    want = [
        _alone(k3, PROMPTS[0], SamplingParams(max_tokens=5, temperature=1.0, seed=11 + i)).token_ids for i in range(5)
    ]
    assert [s.token_ids for s in out.samples] == want
    assert out.token_ids == want[0]
    assert len({tuple(w) for w in want}) == 5


def _cut(text: str, stops) -> str:
    """``text`` before the earliest occurrence of any stop string (Python's str.find)."""
    at = [text.find(s) for s in stops if s in text]
    return text[: min(at)] if at else text


@pytest.mark.parametrize(
    "stops",
    [
        pytest.param(lambda t: [t[4:8], t[4:8]], id="duplicate"),
        pytest.param(lambda t: [t[4:12], t[4:7]], id="longer-first-prefix"),
        pytest.param(lambda t: [t[4:7], t[4:12]], id="shorter-first-prefix"),
        pytest.param(lambda t: [t[9:14], t[4:12]], id="later-listed-earlier-match"),
    ],
)
def test_stop_strings_cut_at_the_first_match_and_are_excluded(k3, stops):
    """Stop strings that repeat or are prefixes of each other: the text ends just before the earliest
    match (stop string excluded, as vLLM), finish_reason is ``stop``, the tokens are a prefix of the
    unstopped ones, and streamed pieces add up to the same text."""
    free = _alone(k3, PROMPTS[0], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    stop = stops(free.text)
    sp = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=stop)
    out = _alone(k3, PROMPTS[0], sp)
    assert out.text == _cut(free.text, stop)
    assert out.finish_reason == "stop"
    assert out.token_ids == free.token_ids[: len(out.token_ids)]
    pieces = []
    streamed = k3.stream(PROMPTS[0], sp, on_text=pieces.append)
    assert "".join(pieces) == streamed.text == out.text


def test_a_held_back_stop_prefix_is_released_when_max_tokens_ends_the_request(k3):
    """The text ends with the start of a stop string that never completes: at finish_reason ``length``
    the held-back tail is part of the final text and of the streamed pieces (nothing is lost)."""
    free = _alone(k3, PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    tail = free.text[-3:]
    assert tail not in free.text[:-3]
    stop = [tail + "\u2603never"]
    pieces = []
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=stop)
    out = k3.stream(PROMPTS[0], sp, on_text=pieces.append)
    assert out.finish_reason == "length" and out.text == free.text == "".join(pieces)


def test_a_stop_token_id_is_kept_in_the_ids_and_left_out_of_the_text(k3):
    """stop_token_ids=[third greedy token]: three token ids, finish_reason ``stop``, and the text is that
    of the first two tokens only."""
    free = _alone(k3, PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    third = free.token_ids[2]
    assert third not in free.token_ids[:2]
    out = _alone(
        k3,
        PROMPTS[0],
        SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[third]),
    )
    assert out.token_ids == free.token_ids[:3] and out.finish_reason == "stop"
    assert out.text == k3.tokenizer.decode(free.token_ids[:2])


@pytest.mark.parametrize("speculative", [None, {"method": "ngram", "num_tokens": 6, "ngram_min": 1}])
def test_max_tokens_exactly_at_the_context_edge(tiny_llama, speculative):
    """Context 24, prompt 6: max_tokens 18 generates exactly 18 tokens (finish ``length``), with or
    without speculative drafts that could run past the edge, and the tokens are plain decoding's;
    max_tokens 19 is a ValueError naming max_tokens and the context before anything runs."""
    plain = LLM(tiny_llama, dtype="float32", backend="reference", tokenizer="bytes")
    llm = LLM(
        tiny_llama,
        dtype="float32",
        backend="reference",
        tokenizer="bytes",
        speculative=speculative,
    )
    prompt = [5, 6, 7, 5, 6, 7]
    sp = SamplingParams(max_tokens=24 - len(prompt), temperature=0, ignore_eos=True)
    out = llm.generate(prompt_token_ids=[prompt], sampling=sp)[0]
    assert len(out.token_ids) == 18 and out.finish_reason == "length"
    assert out.token_ids == plain.generate(prompt_token_ids=[prompt], sampling=sp)[0].token_ids
    over = SamplingParams(max_tokens=19, temperature=0, ignore_eos=True)
    with pytest.raises(ValueError, match=r"max_tokens \(19\).*context of 24"):
        llm.generate(prompt_token_ids=[prompt], sampling=over)


def test_a_near_zero_temperature_is_greedy_and_a_huge_top_k_is_no_filter(k3):
    """temperature 1e-6 (and 5e-324, the smallest float) gives the greedy tokens; top_k beyond the
    vocabulary samples exactly as top_k off with the same seed (no error, no clamp to a smaller k)."""
    greedy = _alone(k3, PROMPTS[1], SamplingParams(max_tokens=10, temperature=0)).token_ids
    for t in (1e-6, 5e-324):
        assert _alone(k3, PROMPTS[1], SamplingParams(max_tokens=10, temperature=t, seed=1)).token_ids == greedy
    off = _alone(k3, PROMPTS[1], SamplingParams(max_tokens=6, temperature=1.0, seed=3)).token_ids
    vocab = k3.cfg.vocab_size
    for k in (vocab, vocab + 1, 10**12):
        got = _alone(
            k3,
            PROMPTS[1],
            SamplingParams(max_tokens=6, temperature=1.0, seed=3, top_k=k),
        ).token_ids
        assert got == off


def test_an_interrupted_stream_leaves_the_llm_usable(k3):
    """A KeyboardInterrupt raised from on_text mid-generation propagates, and the same LLM then gives
    the same tokens as before for a batch (no slot, cache or request left behind)."""
    sp = SamplingParams(max_tokens=10, temperature=0)
    before = [o.token_ids for o in k3.generate(PROMPTS[:3], sp)]
    seen = []

    def interrupt(text):
        seen.append(text)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        k3.stream(PROMPTS[0], sp, on_text=interrupt)
    assert [o.token_ids for o in k3.generate(PROMPTS[:3], sp)] == before


def test_two_threads_generating_on_one_llm_get_their_own_tokens(k3):
    """Two threads call generate on one (reference-backend) LLM at once: each gets the tokens its
    prompts get alone (seeded sampling and greedy), no error and no hang."""
    greedy = SamplingParams(max_tokens=8, temperature=0)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, seed=5)
    jobs = [
        (PROMPTS[0], greedy),
        (PROMPTS[1], seeded),
        (PROMPTS[2], greedy),
        (PROMPTS[3], seeded),
    ]
    want = [_alone(k3, p, sp).token_ids for p, sp in jobs]
    got = _at_once([lambda p=p, sp=sp: [o.token_ids for o in k3.generate([p, p], sp)] for p, sp in jobs], 60)
    assert got == [[w, w] for w in want]


def _at_once(calls: list, timeout: float) -> list:
    """Each of ``calls`` run in a thread of its own, all started together: their results (an exception's
    repr for one that raised), in order; every thread must end within ``timeout`` seconds."""
    got: dict[int, object] = {}
    start = threading.Barrier(len(calls))

    def work(i):
        start.wait()
        try:
            got[i] = calls[i]()
        except Exception as exc:  # noqa: BLE001 - reported by the caller's assertion
            got[i] = repr(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads)
    return [got[i] for i in range(len(calls))]


def test_logprobs_hold_the_sampled_token_and_form_a_distribution(k3):
    """logprobs=vocab: every position's dict covers the vocabulary, its probabilities sum to 1, and
    under greedy the emitted token is the most likely; logprobs=0 gives only the emitted token."""
    vocab = k3.cfg.vocab_size
    out = _alone(k3, PROMPTS[0], SamplingParams(max_tokens=3, temperature=0, logprobs=vocab))
    assert len(out.logprobs) == 3
    for row, tok in zip(out.logprobs, out.token_ids):
        assert len(row) == vocab
        assert sum(torch.tensor(list(row.values()), dtype=torch.float64).exp()).item() == pytest.approx(1, abs=1e-4)
        assert max(row, key=row.get) == tok
    zero = _alone(k3, PROMPTS[0], SamplingParams(max_tokens=3, temperature=0, logprobs=0))
    assert [list(r) for r in zero.logprobs] == [[t] for t in zero.token_ids]


def test_prompt_logprobs_do_not_depend_on_the_prefill_chunk(k3):
    """prompt_logprobs with prefill_chunk 2 equal those of a whole-prompt prefill (same keys, values
    within float noise), hold each actual prompt token, and start with None for the first position."""
    chunked = LLM("k3-nano", backend="reference", max_batch=2, prefill_chunk=2)
    sp = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2)
    text = "The Python interpreter is a program that reads"
    a, b = _alone(k3, text, sp), _alone(chunked, text, sp)
    assert len(a.prompt_logprobs) == len(a.prompt_token_ids) > 4
    assert a.prompt_logprobs[0] is None and b.prompt_logprobs[0] is None
    for i, (x, y) in enumerate(zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]), start=1):
        assert a.prompt_token_ids[i] in x and set(x) == set(y)
        assert all(abs(x[k] - y[k]) < 1e-4 for k in x)
    assert a.token_ids == b.token_ids


def test_threads_sharing_a_superop_llm_take_turns(tiny_llama):
    """The superop executor keeps one set of step buffers per step shape, and the Triton interpreter is not
    thread-safe: two threads generating on one superop LLM at once once crashed inside the kernels (or, on a
    GPU, could read each other's buffers). Calls now run one at a time: each thread gets its tokens alone."""
    llm = LLM(str(tiny_llama), backend="superop", max_batch=2)
    sp = SamplingParams(max_tokens=4, temperature=0)
    prompts = [[3, 5, 7], [11, 2]]
    want = [llm.generate(prompt_token_ids=[ids], sampling=sp)[0].token_ids for ids in prompts]
    calls = [lambda ids=ids: llm.generate(prompt_token_ids=[ids], sampling=sp)[0].token_ids for ids in prompts]
    assert _at_once(calls, 100) == want
