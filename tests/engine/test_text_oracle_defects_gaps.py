"""Text <-> ids against transformers as the oracle: defects a differential probe found (these fail on
the code as it is; each docstring names the defect)."""

from __future__ import annotations

import json

import pytest

from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import Tokenizer
from nonstop.weights.resolve import ASSETS

K3 = ASSETS / "k3-nano"
IM_END = 6144  # an added token appended after k3-nano's 6144 ids


def _checkpoint(tmp_path, config_extra: dict):
    """k3-nano's tokenizer plus ``<|im_end|>`` as an added token tokenizer.json calls not special, and a
    tokenizer_config.json that (through ``config_extra``) declares it special."""
    tj = json.loads((K3 / "tokenizer.json").read_text())
    token = {"content": "<|im_end|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    tj["added_tokens"].append({"id": IM_END, **token, "special": False})
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    config = {**json.loads((K3 / "tokenizer_config.json").read_text()), **config_extra}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    "config_extra",
    [
        {"added_tokens_decoder": {str(IM_END): {"content": "<|im_end|>", "special": True}}},
        {"eos_token": "<|im_end|>"},
    ],
    ids=["added_tokens_decoder", "eos_token"],
)
def test_a_token_tokenizer_config_declares_special_is_left_out_of_the_text_as_in_transformers(tmp_path, config_extra):
    """Defect: ``HFTokenizer`` takes special-ness from tokenizer.json's ``added_tokens`` only, so a token
    that tokenizer_config.json declares special (``added_tokens_decoder`` with ``special: true``, or named
    as its eos_token) is shown in decoded and streamed text ("a<|im_end|>b") where
    transformers' ``decode(..., skip_special_tokens=True)`` leaves it out ("ab"), and ``special_name``
    does not know it."""
    from transformers import AutoTokenizer

    d = _checkpoint(tmp_path, config_extra)
    hf = AutoTokenizer.from_pretrained(str(d))
    tok = Tokenizer.load(d, IM_END + 1)
    ids = tok.encode("a<|im_end|>b", add_special_tokens=False)
    assert ids == hf.encode("a<|im_end|>b", add_special_tokens=False) and IM_END in ids
    expected = hf.decode(ids, skip_special_tokens=True)
    assert expected == "ab"
    assert tok.decode(ids) == expected
    assert tok.special_name(IM_END) == "<|im_end|>"


@pytest.mark.parametrize("end", ["length", "eos"])
def test_a_replacement_character_the_model_writes_last_stays_in_the_text(end):
    """Defect: ``IncrementalDecoder`` holds back any window whose decode ends in U+FFFD, taking it for an
    incomplete character, and nothing flushes it when the request ends; a complete U+FFFD (bytes EF BF BD,
    valid UTF-8) as the last character generated is dropped: the text of ``ok \\ufffd`` followed by the
    end (max_tokens or EOS) is "ok " while ``tokenizer.decode(token_ids)`` (and transformers) give
    "ok \\ufffd"."""
    from transformers import AutoTokenizer

    tok = Tokenizer.load(K3, 6144)
    hf = AutoTokenizer.from_pretrained(str(K3))
    ids = hf.encode("ok \ufffd", add_special_tokens=False)
    eos = hf.convert_tokens_to_ids("<|eos|>")
    generated = ids if end == "length" else [*ids, eos]
    max_tokens = len(ids) if end == "length" else 50
    req = Request("r", None, [5], SamplingParams(temperature=0, max_tokens=max_tokens), frozenset({eos}))
    pieces = [req.append(i, tok) for i in generated]
    assert req.finished
    expected = hf.decode(generated, skip_special_tokens=True)
    assert expected == "ok \ufffd"
    assert req.text == expected
    assert "".join(pieces) == expected
