"""SamplingParams is validated once and cannot change afterwards; stop / stop_token_ids / ignore_eos /
n are checked strictly; an unseeded request leaves torch's global generator alone."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from nonstop import LLM, SamplingParams
from nonstop.config import ModelConfig
from nonstop.engine.sampling import MAX_N, InvalidSamplingParam
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import KIMI_K3


@pytest.fixture(scope="module")
def k3(tmp_path_factory):
    path = write_checkpoint(
        ModelConfig.from_hf_dict(KIMI_K3), tmp_path_factory.mktemp("k3") / "m", seed=3, dtype=torch.float32
    )
    return LLM(path, dtype="float32", backend="reference")


@pytest.mark.parametrize(
    "name, value",
    [
        ("stop", ["x"]),
        ("temperature", -5),
        ("max_tokens", 0),
        ("top_p", 0),
        ("seed", 3),
        ("stop_token_ids", [1]),
        ("stop_strings", ["x"]),
    ],
)
def test_assignment_is_refused_and_says_to_use_replace(name, value):
    params = SamplingParams(max_tokens=30, temperature=0)
    before = dataclasses.astuple(params)
    with pytest.raises(dataclasses.FrozenInstanceError, match=rf"{name}.*dataclasses\.replace"):
        setattr(params, name, value)
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(params, name)
    assert dataclasses.astuple(params) == before


def test_replace_validates_again():
    params = SamplingParams(max_tokens=30, temperature=0)
    for field, bad in [("temperature", -5), ("max_tokens", 0), ("top_p", 0), ("stop", 5), ("n", MAX_N + 1)]:
        with pytest.raises(InvalidSamplingParam) as info:
            dataclasses.replace(params, **{field: bad})
        assert info.value.param == field
    assert dataclasses.replace(params, stop="ab").stop_strings == ("ab",)


def test_nothing_inside_can_change_later():
    stops, ids = ["ab"], [5]
    params = SamplingParams(stop=stops, stop_token_ids=ids)
    stops.append("cd")
    ids.append(6)
    assert params.stop == ("ab",) and params.stop_strings == ("ab",) and params.stop_token_ids == (5,)
    assert params == SamplingParams(stop=("ab",), stop_token_ids=(5,))
    assert hash(params) == hash(SamplingParams(stop=["ab"], stop_token_ids=[5]))
    assert pickle.loads(pickle.dumps(params)) == params


def test_a_replaced_stop_is_honoured(k3):
    """The defect: ``sp.stop = [...]`` after construction was silently ignored. The way to change it now,
    ``dataclasses.replace``, recomputes the stop strings."""
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    full = k3.generate(prompt_token_ids=[[5, 9, 14]], sampling=params)[0].text
    assert len(full) > 4
    stop = full[2:4]
    out = k3.generate(prompt_token_ids=[[5, 9, 14]], sampling=dataclasses.replace(params, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.text == full[: full.index(stop)]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"stop_token_ids": 0}, "stop_token_ids"),  # was taken as "no stop tokens"
        ({"stop_token_ids": 5}, "stop_token_ids"),  # was "'int' object is not iterable"
        ({"stop_token_ids": "5"}, "stop_token_ids"),
        ({"stop_token_ids": {5}}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": [1.0]}, "stop_token_ids"),
        ({"stop": 0}, "stop"),  # was taken as "no stop strings"
        ({"stop": 5}, "stop"),  # was "'int' object is not iterable"
        ({"stop": ""}, "stop"),
        ({"stop": b"ab"}, "stop"),
        ({"stop": {"ab"}}, "stop"),
        ({"stop": ["ab", 3]}, "stop"),
        ({"ignore_eos": "no"}, "ignore_eos"),  # was taken as True
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"ignore_eos": None}, "ignore_eos"),
        ({"n": 10**9}, "n"),  # was accepted
        ({"n": MAX_N + 1}, "n"),
        ({"n": 0}, "n"),
        ({"top_k": -2}, "top_k"),  # was taken as "off"; vLLM and the server take -1 / 0 (off) or k >= 1
        ({"top_k": -5}, "top_k"),
    ],
)
def test_bad_values_name_their_field(kwargs, param):
    with pytest.raises(InvalidSamplingParam) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param and param in str(info.value)


@pytest.mark.parametrize("k", [-1, 0, 1, 50])
def test_top_k_off_or_positive_is_taken(k):
    assert SamplingParams(top_k=k).top_k == k


def test_good_stop_values():
    assert SamplingParams().stop_strings == () and SamplingParams().stop_token_ids == ()
    assert SamplingParams(stop="ab").stop_strings == ("ab",)
    assert SamplingParams(stop=["ab", "c"]).stop_strings == ("ab", "c")
    assert SamplingParams(stop=("ab",), stop_token_ids=(0, 7)).stop_token_ids == (0, 7)
    assert SamplingParams(stop=[], stop_token_ids=[]).stop_strings == ()
    assert SamplingParams(ignore_eos=True).ignore_eos is True


def test_n_bound_is_the_servers():
    from nonstop.server.protocol import SamplingFields

    assert SamplingParams(n=MAX_N).n == MAX_N
    limit = next(m.le for m in SamplingFields.model_fields["n"].metadata if getattr(m, "le", None) is not None)
    assert limit == MAX_N


def test_unseeded_sampling_leaves_the_global_generator_alone(k3):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    outs = [
        k3.generate(prompt_token_ids=[[5, 9, 14]], sampling=SamplingParams(max_tokens=8, temperature=1.0))[0]
        for _ in range(4)
    ]
    assert torch.equal(torch.rand(3), expected)
    assert len({tuple(o.token_ids) for o in outs}) > 1  # unseeded requests still differ from one another


def test_seeded_sampling_is_reproducible_whatever_the_global_state(k3):
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    torch.manual_seed(0)
    a = k3.generate(prompt_token_ids=[[5, 9, 14]], sampling=params)[0].token_ids
    torch.manual_seed(1)
    b = k3.generate(prompt_token_ids=[[5, 9, 14]], sampling=params)[0].token_ids
    assert a == b
