"""Tokenizer loading, vocabulary checks and decoding: checks a mutation audit found missing.

Expected values come from transformers' / tokenizers' own decode of the same ids, or from the documented
contract (``Tokenizer.load``, ``find_chat_template``), not from the code under test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop
from nonstop.engine.tokenizer import IdTokenizer, Tokenizer, TokenizerError, find_chat_template

K3_NANO = Path(nonstop.__file__).resolve().parent / "assets" / "k3-nano"


@pytest.fixture(scope="module")
def nano():
    from tokenizers import Tokenizer as HF

    hf = HF.from_file(str(K3_NANO / "tokenizer.json"))
    return hf, Tokenizer.load(K3_NANO, hf.get_vocab_size(), "auto")


def test_an_id_equal_to_the_vocabulary_size_is_refused(nano):
    hf, _ = nano
    ids = hf.encode("Hello world", add_special_tokens=False).ids
    top = max(ids)  # a model whose vocabulary ends just below this id cannot embed it
    small = Tokenizer.load(K3_NANO, top, "auto")
    with pytest.raises(TokenizerError, match=f"id {top} outside"):
        small.encode("Hello world", add_special_tokens=False)
    assert Tokenizer.load(K3_NANO, top + 1, "auto").encode("Hello world", add_special_tokens=False) == ids


def test_decode_leaves_out_special_tokens_as_tokenizers_does(nano):
    hf, ours = nano
    bos, eos = hf.token_to_id("<|bos|>"), hf.token_to_id("<|eos|>")
    ids = [bos, *hf.encode("Hi there", add_special_tokens=False).ids, eos]
    expected = hf.decode(ids, skip_special_tokens=True)
    assert "<|" not in expected
    assert ours.decode(ids) == expected


def test_tokenizer_ids_without_a_checkpoint_refuses_text():
    tok = Tokenizer.load(None, 320, "ids")  # a preset (no directory) with --tokenizer ids
    assert isinstance(tok, IdTokenizer)
    with pytest.raises(TokenizerError, match="--tokenizer ids"):
        tok.encode("hi")


def test_a_template_given_as_text_may_hold_only_statements():
    template = "{% for m in messages %}<{% if m.role %}x{% endif %}>{% endfor %}"  # no "{{" in it
    assert find_chat_template(None, {}, template) == template


def _write_tiktoken(d: Path, ranks: list[tuple[bytes, int]], added: dict[int, str] | None = None) -> Path:
    import base64
    import json

    d.mkdir(parents=True, exist_ok=True)
    (d / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks))
    decoder = {str(i): {"content": s, "special": True} for i, s in (added or {}).items()}
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    return d


def test_every_one_of_the_258_special_ids_after_the_base_vocabulary_is_a_token(tmp_path):
    # Kimi's tokenizer: 256 reserved + 2 special ids follow the N base tokens, ids N .. N + 257
    d = _write_tiktoken(tmp_path / "kimi", [(bytes([i]), i) for i in range(256)], {256: "<|bos|>"})
    tok = Tokenizer.load(d, 256 + 258, "auto")
    last = 256 + 257
    assert tok.token_text(256) == "<|bos|>"
    assert tok.token_text(last) == f"<|reserved_token_{last}|>"
    assert tok.encode(f"a<|reserved_token_{last}|>") == [ord("a"), last]


def test_a_tiktoken_file_whose_ranks_skip_a_number_is_refused(tmp_path):
    d = _write_tiktoken(tmp_path / "gap", [(bytes([i]), i if i < 100 else i + 1) for i in range(256)])
    with pytest.raises(TokenizerError, match="ranks must be 0..255"):
        Tokenizer.load(d, 256 + 258, "auto")


def test_byte_tokenizer_decodes_bytes_around_an_id_above_255_once():
    from nonstop.engine.tokenizer import ByteTokenizer

    tok = ByteTokenizer(320)
    assert tok.decode([ord("h"), 300, ord("i")]) == "h<|300|>i"
    assert tok.decode([0xC3, 0xA9, 256, 0x21]) == "é<|256|>!"


def test_byte_tokenizer_token_text_of_an_id_above_255_is_its_name():
    from nonstop.engine.tokenizer import ByteTokenizer

    tok = ByteTokenizer(320)
    assert tok.token_text(256) == "<|256|>"
    assert tok.token_text(255) == "bytes:\\xff"  # one byte that is no UTF-8 character alone
    assert tok.token_text(ord("A")) == "A"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # what transformers 5.x (apply_chat_template) shows a template as image_token / video_token
        (
            {
                "additional_special_tokens": {"image_token": "<A>"},
                "extra_special_tokens": {"image_token": "<B>", "video_token": "<V>"},
            },
            {"image_token": "<B>", "video_token": "<V>"},
        ),
        ({"additional_special_tokens": {"image_token": "<A>"}, "image_token": "<K>"}, {"image_token": "<A>"}),
        ({"extra_special_tokens": {"image_token": "<B>"}, "image_token": "<K>"}, {"image_token": "<B>"}),
    ],
)
def test_special_token_names_win_as_in_transformers(config, expected):
    from nonstop.engine.tokenizer import special_tokens_map

    names = special_tokens_map(config)
    assert {k: names.get(k) for k in expected} == expected


def test_an_added_token_with_empty_content_is_refused(tmp_path):
    d = _write_tiktoken(tmp_path / "empty", [(bytes([i]), i) for i in range(256)], {256: ""})
    with pytest.raises(TokenizerError, match="added_tokens_decoder entry '256'"):
        Tokenizer.load(d, 256 + 258, "auto")


def test_a_named_token_past_the_reserved_ids_is_a_token_too(tmp_path):
    extra = 256 + 258 + 10  # beyond the 258 reserved special ids
    d = _write_tiktoken(tmp_path / "extra", [(bytes([i]), i) for i in range(256)], {extra: "<|tool|>"})
    tok = Tokenizer.load(d, extra + 1, "auto")
    assert tok.token_text(extra) == "<|tool|>"
    assert tok.encode("a<|tool|>") == [ord("a"), extra]


@pytest.mark.parametrize("make", [lambda: Tokenizer.load(K3_NANO, 6144, "auto"), lambda: Tokenizer.load(None, 320)])
def test_text_with_a_lone_surrogate_is_refused_by_name(make):
    with pytest.raises(TokenizerError, match="lone surrogate U\\+DC80 at character 1"):
        make().encode("a\udc80b")
