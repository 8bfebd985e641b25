"""Defects found by the differential probe of ``TiktokenTokenizer`` against Moonshot's published
``tokenization_kimi.py`` (see test_kimi_tiktoken_differential_gaps.py for the re-implementation and its sources).
Every test here failed on the code before the fix; each docstring says what the right answer is and where the
fact comes from."""

from __future__ import annotations

import pytest

from nonstop.engine.tokenizer import Tokenizer, TokenizerError
from tests.engine.test_kimi_tiktoken_differential_gaps import (
    BASE,
    DEFAULT_ADDITIONAL,
    _reference,
    _write,
)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return Tokenizer.load(_write(tmp_path_factory.mktemp("kimi")), BASE + 258)


def _skip_special_decode(enc, ids: list[int], config: dict) -> str:
    """The published decode(ids, skip_special_tokens=True): leave out all_special_ids (the named tokens
    and additional_special_tokens), decode the rest, other special-block ids by their names."""
    names = [config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")]
    names += config.get("additional_special_tokens") or DEFAULT_ADDITIONAL
    skip = {enc._special_tokens[n] for n in names if n in enc._special_tokens}
    return enc.decode([i for i in ids if i not in skip])


def test_decode_leaves_out_only_the_ids_transformers_skips_for_kimi(kimi):
    """DEFECT (fails on the current code): decode drops every id past the base vocabulary, where the
    published tokenizer with skip_special_tokens=True leaves out only bos / eos / unk / pad and
    additional_special_tokens, so tool-call markers, <think> and reserved tokens keep their text (servers
    built on it, vLLM and SGLang, parse Kimi's tool calls from that text)."""
    enc = _reference()
    t = enc.encode("the")
    ids = [BASE, *t, BASE + 11, *t, BASE + 10, *t, BASE + 9, BASE + 2, BASE + 1]
    expected = _skip_special_decode(enc, ids, {"bos_token": "[BOS]", "eos_token": "[EOS]"})
    assert expected == f"the<think>the<|tool_calls_section_begin|>the<|reserved_token_{BASE + 9}|>"
    assert kimi.decode(ids) == expected


def test_distinct_ids_past_the_tokenizer_have_distinct_token_text(tmp_path):
    """DEFECT (fails on the current code): an id the model may sample past the tokenizer's special block
    (config vocab_size larger than the tokenizer) lists as "" in logprobs, so distinct tokens share one
    text, against Tokenizer.token_text's contract (the published tokenizer has no text for it at all:
    tiktoken raises KeyError)."""
    tok = Tokenizer.load(_write(tmp_path / "k"), BASE + 258 + 8)
    with pytest.raises(KeyError):
        _reference().decode([BASE + 258])
    a, b = tok.token_text(BASE + 258), tok.token_text(BASE + 259)
    assert a and b and a != b


def test_reserved_text_past_a_k3_vocabulary_is_plain_text(tmp_path):
    """DEFECT for K3 checkpoints (fails on the current code): Kimi K3's published tokenizer reserves 256
    special ids, so ``<|reserved_token_{base + 256}|>`` in a prompt is ordinary text there; nonstop reserves
    258 and refuses the prompt as holding an id outside the model's vocabulary of base + 256."""
    tok = Tokenizer.load(_write(tmp_path / "k3"), BASE + 256)
    text = f"a<|reserved_token_{BASE + 256}|>b"
    try:
        got = tok.encode(text)
    except TokenizerError as exc:
        pytest.fail(f"prompt refused: {exc}")
    assert got == _reference(256).encode(text, allowed_special="all")
