"""The sampler's Gumbel-max draw (``model/sampling.gumbel_max``): the noise of a few entries is the noise of the
whole vocabulary at them, bit for bit; the draw equals the full-vocabulary argmax of x + g it is defined by, on
peaked, flat, filtered and tied rows; the engine's host sampler takes each token of a seeded request from
that draw at the token's position (the device sampler's counter), whatever the backend; and the draw is keyed
by the seed mod 2^64, as ``torch.Generator.manual_seed`` keys a seed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nonstop.model.philox import GUMBEL_MAX, GUMBEL_MIN, gumbel_noise, gumbel_noise_at
from nonstop.model.sampling import filter_logits, gumbel_max


def _torch_key(seed: int) -> int:
    """The 64-bit key torch makes of ``seed`` (``manual_seed``: mod 2^64), as the int64 with its bits."""
    key = torch.Generator().manual_seed(seed).initial_seed()
    return key - 2**64 if key >= 2**63 else key


def _full_draw(x: torch.Tensor, seed: int, offset: int) -> int:
    """The definition: argmax over the finite entries of x + g with the whole vocabulary's noise."""
    g = gumbel_noise(seed, offset, x.shape[-1])
    return int(torch.where(torch.isfinite(x), x + g, float("-inf")).argmax())


@pytest.mark.parametrize("vocab", [1, 5, 37, 1003])
def test_noise_at_some_entries_is_the_whole_vocabularys_there(vocab):
    gen = torch.Generator().manual_seed(vocab)
    for seed, offset in ((0, 0), (2**62 + 17, 3), (12345, 2**33 + 7)):
        index = torch.randperm(vocab, generator=gen)[: max(1, vocab // 3)]
        assert torch.equal(gumbel_noise_at(seed, offset, index), gumbel_noise(seed, offset, vocab)[index])


def test_the_noise_stays_within_its_bounds():
    g = gumbel_noise(7, 11, 100_003)
    assert GUMBEL_MIN <= float(g.min()) and float(g.max()) <= GUMBEL_MAX


@pytest.mark.parametrize("scale", [0.01, 1.0, 8.0, 60.0])
def test_the_draw_is_the_full_vocabulary_argmax(scale):
    """Flat rows (every entry a candidate) to peaked ones (a few), with filters and with ties."""
    gen = torch.Generator().manual_seed(int(scale * 100))
    for trial in range(40):
        vocab = int(torch.randint(2, 700, (1,), generator=gen))
        logits = torch.randn(vocab, generator=gen) * scale
        if trial % 5 == 0:
            logits[torch.randint(0, vocab, (vocab // 3,), generator=gen)] = logits.max()  # ties at the top
        top_k = [-1, 1, 3, vocab // 2][trial % 4]
        top_p = [1.0, 0.9, 0.3][trial % 3]
        x = filter_logits(logits, [0.5, 1.0, 1.7][trial % 3], top_k, top_p, [0.0, 0.05][trial % 2])
        seed, offset = int(torch.randint(0, 2**62, (1,), generator=gen)), trial * 7 + 1
        assert gumbel_max(x, seed, offset) == _full_draw(x, seed, offset), (scale, trial)


def test_rows_with_nan_or_nothing_finite_draw_as_the_definition():
    """NaN entries never win (the twin sees garbage logits in the megakernel's read audit); a row with nothing
    finite gives the full argmax's first index."""
    x = torch.tensor([float("nan"), 0.5, float("-inf"), 2.0, float("nan")], dtype=torch.float64)
    for seed in range(20):
        assert gumbel_max(x, seed, 3) == _full_draw(x, seed, 3) in (1, 3)
    for nothing in (float("-inf"), float("nan")):
        assert gumbel_max(torch.full((9,), nothing), 5, 1) == _full_draw(torch.full((9,), nothing), 5, 1) == 0


def test_a_seeded_request_samples_each_token_from_its_position():
    """On the reference executor (host sampling), token i of a seeded request is the Gumbel-max draw from its
    filtered logits with the request's seed at position len(prompt) + i, the counter the device sampler
    uses (``batch.start + 1``); n = 2 gives each completion its own seed (``seed_for``)."""
    from nonstop.engine.core import EngineCore
    from nonstop.engine.requests import Request
    from nonstop.engine.sampling import SamplingParams
    from nonstop.engine.tokenizer import ByteTokenizer
    from nonstop.runtime.executors import ReferenceExecutor
    from tests.runtime.helpers import tiny_model

    model = tiny_model("llama")
    cfg = model.cfg
    prompt = [3, 4, 5, 6, 7]
    base = SamplingParams(max_tokens=6, temperature=1.3, top_k=20, top_p=0.95, seed=-77, ignore_eos=True)
    for index in (0, 1):
        params = dataclasses.replace(base, seed=base.seed_for(index))
        core = EngineCore(cfg, ReferenceExecutor(model), ByteTokenizer(cfg.vocab_size), 1, torch.float32, "cpu")
        req = Request("r", None, prompt, params, frozenset())
        core.add(req)
        while core.running or core.prefilling:
            core.step()
        ids = prompt + req.output_ids
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0]
        for i, token in enumerate(req.output_ids):
            position = len(prompt) + i
            x = filter_logits(logits[position - 1], params.temperature, params.top_k, params.top_p)
            assert token == _full_draw(x, _torch_key(params.seed), position), (index, i)


SEEDS = (0, 1, 1234, 2**62 + 5, 2**63 - 1, 2**63, 2**64 - 1, -1, -77, -(2**63))


def test_the_key_is_the_seed_mod_2_64_as_torch_keys_it():
    """Seeds span [-2^63, 2^64 - 1], what ``torch.Generator.manual_seed`` takes: the key is the seed mod 2^64
    (once mod 2^63, so 0 and 2^63 drew one stream, -1 and 2^63 - 1 another), held as an int64; a seed in
    [0, 2^63) is its own key (its stream did not change)."""
    from nonstop.engine.sampling import SamplingParams
    from nonstop.runtime.device_sampling import SampleRow

    for seed in SEEDS:
        key = SampleRow.of(SamplingParams(temperature=1.0, seed=seed)).seed
        assert key == _torch_key(seed), seed
        assert -(2**63) <= key < 2**63 and (key == seed or not 0 <= seed < 2**63), seed


def _host_tokens(seed: int, vocab: int = 1000, steps: int = 8) -> list[int]:
    """The host sampler's tokens of a flat row (every entry a candidate) at positions 0..steps-1."""
    from nonstop.engine.sampling import SamplingParams, sample

    params = SamplingParams(temperature=1.0, seed=seed)
    return [sample(torch.zeros(vocab), params, None, position=p) for p in range(steps)]


def test_seeds_apart_by_2_63_draw_apart_and_seeds_one_mod_2_64_draw_alike():
    assert _host_tokens(0) != _host_tokens(2**63)
    assert _host_tokens(-1) != _host_tokens(2**63 - 1)
    assert _host_tokens(-1) == _host_tokens(2**64 - 1)
    assert _host_tokens(-(2**63)) == _host_tokens(2**63)
