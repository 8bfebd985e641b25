"""The engine's decode steps on a kernel backend sample on the device with each request's parameters and
run several steps per launch when no token needs the host (``engine/device_decode.py``; the megakernel
runs them in one launch, the superop executor back to back without host round trips): greedy tokens are
the reference's; sampled tokens (temperature, top-k, top-p, seed) do not depend on how many steps a
launch runs; stop tokens and max_tokens end requests where step-by-step decoding does; a step of more
sequences than the kernels' ``max_rows`` runs as several launches (``sample_tokens`` refuses more)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nonstop.engine import device_decode
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.runtime.device_sampling import SampleRow
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.megakernel import MegakernelExecutor
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import skip_unless_kernels, tiny_model

PROMPTS = [[3, 4, 5, 6], [7, 8, 9], [20, 21]]


def new_core(model, executor, num_slots: int, batch_invariant: bool = False) -> EngineCore:
    cfg = model.cfg
    return EngineCore(
        cfg,
        executor,
        ByteTokenizer(cfg.vocab_size),
        num_slots,
        torch.float32,
        "cpu",
        page_size=4,
        batch_invariant=batch_invariant,
    )


def run(model, executor, params: list[SamplingParams], prompts=PROMPTS):
    """Every request added, then stepped to the end: (output ids, finish reasons) per request."""
    core = new_core(model, executor, len(prompts))
    reqs = [Request(str(i), None, p, sp, frozenset()) for i, (p, sp) in enumerate(zip(prompts, params))]
    for r in reqs:
        core.add(r)
    while core.running:
        core.step()
    return [r.output_ids for r in reqs], [r.finish_reason for r in reqs]


BACKENDS = {
    "megakernel": lambda m: MegakernelExecutor(m, graphs=False),
    "superop": lambda m: SuperOpExecutor(m, graphs=False),
}
LAUNCHES = {"superop": "sampling_calls", "megakernel": "sampling_launches"}  # each backend's count of calls


@pytest.fixture(scope="module")
def llama():
    return skip_unless_kernels(tiny_model("llama"))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_greedy_on_the_device_is_the_reference(llama, backend):
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in (7, 3, 5)]
    ex = BACKENDS[backend](llama)
    got = run(llama, ex, params)
    assert got == run(llama, ReferenceExecutor(llama), params)
    if backend == "megakernel":  # 2..6 decode tokens a request in launches of up to STEPS_PER_LAUNCH steps
        assert ex.stats["device_sampled_steps"] > ex.stats["sampling_launches"] >= 2


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_sampled_tokens_do_not_depend_on_steps_per_launch(llama, backend, monkeypatch):
    params = [
        SamplingParams(max_tokens=6, temperature=0.9, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=1.3, top_k=5, seed=12, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=0.7, top_p=0.6, seed=13, ignore_eos=True),
    ]
    several = run(llama, BACKENDS[backend](llama), params)
    monkeypatch.setattr(device_decode, "STEPS_PER_LAUNCH", 1)
    assert run(llama, BACKENDS[backend](llama), params) == several
    reseeded = [
        SamplingParams(
            max_tokens=6, temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed + 100, ignore_eos=True
        )
        for p in params
    ]
    assert run(llama, BACKENDS[backend](llama), reseeded)[0] != several[0]


def test_stops_end_requests_where_single_steps_do(llama, monkeypatch):
    """A stop token and max_tokens inside a multi-step launch: the request ends there (the tokens sampled
    past its end are dropped), as with one step a launch."""
    free = [SamplingParams(max_tokens=8, temperature=1.5, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    tokens = run(llama, MegakernelExecutor(llama, graphs=False), free)[0]
    i, stop_at = next((i, t) for i, out in enumerate(tokens) for t in out[2:] if t not in out[:2])
    params = list(free)
    params[i] = SamplingParams(max_tokens=8, temperature=1.5, seed=i + 1, stop_token_ids=[stop_at], ignore_eos=True)
    j = (i + 1) % 3
    params[j] = SamplingParams(max_tokens=3, temperature=1.5, seed=j + 1, ignore_eos=True)
    got = run(llama, MegakernelExecutor(llama, graphs=False), params)
    assert got[0][i] == tokens[i][: tokens[i].index(stop_at) + 1] and got[1][i] == "stop"
    assert got[0][j] == tokens[j][:3] and got[1][j] == "length"
    monkeypatch.setattr(device_decode, "STEPS_PER_LAUNCH", 1)
    assert run(llama, MegakernelExecutor(llama, graphs=False), params) == got
    assert run(llama, SuperOpExecutor(llama, graphs=False), params)[1] == got[1]  # the same stops (same noise)


HOST_ONLY = {
    "min_p": dict(min_p=0.2),
    "repetition_penalty": dict(repetition_penalty=1.4),
    "presence_penalty": dict(presence_penalty=0.8),
    "frequency_penalty": dict(frequency_penalty=0.6),
    "logprobs": dict(logprobs=2),
}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("feature", list(HOST_ONLY))
def test_host_only_parameters_sample_on_the_host(llama, backend, feature, monkeypatch):
    """min_p, the penalties (they read the request's past tokens) and logprobs are not known to the device
    sampler: a step holding such a request samples on the host - the device sampler is never called and the
    tokens are the reference executor's (same seeds, same host sampler)."""
    ex = BACKENDS[backend](llama)
    calls = []
    device_sample = ex.sample_tokens

    def counted(*args, **kwargs):
        calls.append(1)
        return device_sample(*args, **kwargs)

    monkeypatch.setattr(ex, "sample_tokens", counted)
    base = dict(max_tokens=6, temperature=0.9, ignore_eos=True)
    params = [
        SamplingParams(**base, seed=21, **HOST_ONLY[feature]),
        SamplingParams(**base, seed=22),
        SamplingParams(**base, seed=23, top_k=4),
    ]
    got = run(llama, ex, params)
    assert not calls, f"{feature}: the device sampler was called"
    assert got == run(llama, ReferenceExecutor(llama), params)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.engine.tiny_models import synth_checkpoint

    return synth_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_seeded_request_draws_the_same_tokens_on_the_host_and_the_device(llama, backend):
    """A seeded request's sampled tokens depend on its seed and positions only: alone (its decode steps sample
    on the device), asking for logprobs (every token on the host), beside a request that asks for logprobs
    (the whole step on the host) and on the reference executor (host only), the tokens are the same. The host
    once drew with ``torch.multinomial``: one client's logprobs changed another's seeded completion."""
    seeded = SamplingParams(max_tokens=7, temperature=1.0, top_k=11, top_p=0.95, seed=1234, ignore_eos=True)
    other = SamplingParams(max_tokens=4, temperature=0.7, seed=9, logprobs=2, ignore_eos=True)
    with_logprobs = dataclasses.replace(seeded, logprobs=2)
    ex = BACKENDS[backend](llama)
    alone = run(llama, ex, [seeded], PROMPTS[:1])[0][0]
    assert ex.stats["device_sampled_steps"] >= 1  # its decode steps did sample on the device
    assert run(llama, BACKENDS[backend](llama), [with_logprobs], PROMPTS[:1])[0][0] == alone
    assert run(llama, BACKENDS[backend](llama), [seeded, other], PROMPTS[:2])[0][0] == alone
    assert run(llama, ReferenceExecutor(llama), [seeded], PROMPTS[:1])[0][0] == alone
    reseeded = dataclasses.replace(seeded, seed=4321)
    assert run(llama, ReferenceExecutor(llama), [reseeded], PROMPTS[:1])[0][0] != alone  # the seed does matter


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_keys_with_the_top_bit_set_draw_on_the_device_as_on_the_host(llama, backend):
    """A seed of 2^63 or more (or a negative one) keys Philox with the top bit set (an int64 key < 0): the device
    sampler splits it into 32-bit halves as the host does. Seeds one mod 2^64 draw alike (2^64 - 1 and -1), and
    2^63 - 1 apart from them (the key was once the seed mod 2^63, which made -1 and 2^63 - 1 one stream)."""
    params = [
        SamplingParams(max_tokens=4, temperature=1.0, seed=seed, ignore_eos=True) for seed in (2**64 - 1, 2**63 - 1, -1)
    ]
    prompts = [PROMPTS[0]] * 3
    ex = BACKENDS[backend](llama)
    device = run(llama, ex, params, prompts)[0]
    assert ex.stats["device_sampled_steps"] >= 1
    assert device == run(llama, ReferenceExecutor(llama), params, prompts)[0]
    assert device[0] == device[2] != device[1]


def _sampled_llm(model_dir, backend):
    from nonstop.engine.llm import LLM

    llm = LLM(model_dir, dtype="float32", backend=backend, max_batch=3, tokenizer="bytes")
    skip_unless_kernels(llm.model)
    return llm


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_llm_and_server_sample_on_the_device(llama_dir, backend, monkeypatch):
    """``LLM(backend=...)`` and the OpenAI server over it: decode tokens are sampled on the device with each
    request's temperature / top-k / top-p / seed - the executor counts device-sampled steps, several per
    launch (megakernel) or call (superop) when no token needs the host - and they are the tokens of
    step-by-step decoding (one step a launch); the server's completion is ``LLM.generate``'s."""
    import httpx

    from nonstop.server import build_context
    from tests.server.inprocess import serve_in_thread

    prompts = [[5, 17, 40], [90, 3], [7, 8, 9, 10]]
    params = [
        SamplingParams(max_tokens=6, temperature=0.8, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=1.2, top_k=7, seed=6, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=1.0, top_p=0.7, seed=7),  # as the server's request below
    ]
    llm = _sampled_llm(llama_dir, backend)
    outs = llm.generate(prompt_token_ids=prompts, sampling=params)
    stats = llm.executor.stats
    launches = stats.get("sampling_launches", stats.get("sampling_calls", 0))
    assert stats["device_sampled_steps"] >= 5 and launches >= 1  # the first token comes from the prefill
    assert stats["device_sampled_steps"] > launches  # several steps per launch / call
    monkeypatch.setattr(device_decode, "STEPS_PER_LAUNCH", 1)
    single = _sampled_llm(llama_dir, backend)
    assert [o.token_ids for o in single.generate(prompt_token_ids=prompts, sampling=params)] == [
        o.token_ids for o in outs
    ]
    one = single.executor.stats
    assert one["device_sampled_steps"] == one.get("sampling_launches", one.get("sampling_calls"))

    before = stats["device_sampled_steps"]
    with serve_in_thread(build_context(llm, ["tiny"], max_batch=3)) as url:
        body = {"model": "tiny", "prompt": prompts[2], "max_tokens": 6, "temperature": 1.0, "top_p": 0.7, "seed": 7}
        reply = httpx.post(url + "/v1/completions", json=body, timeout=600).json()
    assert reply["choices"][0]["text"] == outs[2].text
    assert llm.executor.stats["device_sampled_steps"] > before  # the server's decode steps sampled on the device


# ---------------------------------------------------------------- more sequences than max_rows


def _wide(params: list[SamplingParams]) -> list[list[int]]:
    return [[5, 6 + i] for i in range(len(params))]


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("B", [17, 20])
def test_greedy_steps_of_more_than_max_rows_are_the_reference(llama, backend, B):
    params = [SamplingParams(max_tokens=3, temperature=0, ignore_eos=True) for _ in range(B)]
    ex = BACKENDS[backend](llama)
    assert ex.max_rows < B
    got, _ = run(llama, ex, params, _wide(params))
    assert got == run(llama, ReferenceExecutor(llama), params, _wide(params))[0]
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
    got, _ = run(llama, ex, params, _wide(params))
    assert got == run(llama, ReferenceExecutor(llama), params, _wide(params))[0]
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
