"""Gaps a mutation audit of the engine's text input / output found: incremental detokenisation of bytes
that never form a character, and (added below) stop-string trimming, tokenizers and chat templates."""

from __future__ import annotations

from nonstop.engine.detokenize import MAX_PENDING, IncrementalDecoder
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer


class _Counting:
    """A tokenizer wrapper recording the longest id list passed to ``decode``."""

    def __init__(self, inner):
        self.inner, self.largest = inner, 0

    def decode(self, ids):
        self.largest = max(self.largest, len(ids))
        return self.inner.decode(ids)

    def __getattr__(self, name):  # everything else (special_name) from the wrapped tokenizer
        return getattr(self.inner, name)


def test_invalid_bytes_are_emitted_after_max_pending_tokens_and_the_window_stays_bounded():
    """Catches a decoder that waits for a character to complete without limit: a stream of bytes that are
    never UTF-8 (0xFF) would show nothing at all and decode an ever longer window each token."""
    tok = _Counting(ByteTokenizer(256))
    dec = IncrementalDecoder(tok)
    n = 3 * MAX_PENDING + 2
    pieces = [dec.push(0xFF) for _ in range(n)]
    shown = "".join(pieces)
    assert set(shown) == {"\ufffd"}  # each invalid byte is one U+FFFD, as bytes.decode(errors="replace")
    assert len(shown) >= n - MAX_PENDING  # at most one window of bytes is still waiting
    assert tok.largest <= 2 * MAX_PENDING


def test_a_request_of_invalid_bytes_ending_at_max_tokens_keeps_all_but_the_last_window():
    """Catches the same unbounded wait through a request: 40 bytes 0xFF ending at max_tokens must leave
    the replacement characters in the text (each 16 pending tokens are emitted), not an empty text."""
    tok = ByteTokenizer(256)
    req = Request("r", None, [1], SamplingParams(temperature=0, max_tokens=40), frozenset())
    pieces = [req.append(0xFF, tok) for _ in range(40)]
    assert req.finish_reason == "length"
    assert "".join(pieces) == req.text
    assert len(req.text) >= 40 - MAX_PENDING and set(req.text) == {"\ufffd"}


def test_an_empty_stop_string_is_ignored_not_matched_or_crashed_on():
    """Catches StopStrings keeping an empty stop string: it would index s[0] of "" (IndexError) instead of
    matching the other strings. Expected by hand: "b" starts at index 1 of "ab"."""
    from nonstop.engine.stop_strings import StopStrings

    matcher = StopStrings(["", "b"])
    assert matcher.feed("a") is None and matcher.held == 0
    assert matcher.feed("b") == 1


_SPECIALS_TEMPLATE = "{{ eos_token }}|{{ image_token }}|{{ foo_token }}|{% if tools is not none %}TOOLS{% endif %}"


def _render_both(tmp_path, config: dict) -> tuple[str, str]:
    """The same one-message chat rendered by transformers' apply_chat_template and by nonstop, from a
    checkpoint holding the k3-nano tokenizer.json and ``config`` as tokenizer_config.json."""
    import json
    import shutil

    from transformers import AutoTokenizer

    from nonstop.engine.chat_template import chat_text, check_messages
    from nonstop.engine.tokenizer import Tokenizer
    from nonstop.weights.resolve import ASSETS

    shutil.copy(ASSETS / "k3-nano" / "tokenizer.json", tmp_path / "tokenizer.json")
    full = {"tokenizer_class": "PreTrainedTokenizerFast", **config, "chat_template": _SPECIALS_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(full))
    messages = [{"role": "user", "content": "hi"}]
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ours = chat_text(Tokenizer.load(tmp_path, 6144), check_messages(messages))
    return theirs, ours


def test_an_extra_special_token_overrides_a_top_level_key_of_the_same_name_as_in_transformers(tmp_path):
    """Catches the tables of special tokens merged in the wrong order: where ``image_token`` is both a
    top-level key and an ``extra_special_tokens`` entry, transformers gives templates the extra entry."""
    config = {"eos_token": "<|eos|>", "image_token": "<|pad|>", "extra_special_tokens": {"image_token": "<|bos|>"}}
    theirs, ours = _render_both(tmp_path, config)
    assert theirs == ours == "<|eos|>|<|bos|>||"


def test_a_plain_dict_under_a_custom_token_key_is_not_a_special_token_as_in_transformers(tmp_path):
    """Catches ``_added_token`` reading any dict's content: transformers names a custom ``*_token`` key
    only when it is a string or an AddedToken ({"__type": "AddedToken", ...}), so ``foo_token`` here is
    undefined in the template (renders empty)."""
    config = {"eos_token": "<|eos|>", "foo_token": {"content": "<|pad|>"}}
    theirs, ours = _render_both(tmp_path, config)
    assert theirs == ours == "<|eos|>|||"


def test_templates_see_tools_as_none_as_in_transformers(tmp_path):
    """Catches rendering with ``tools=[]`` (or leaving it undefined): ``tools is not none`` would add a
    tool section to every prompt; transformers passes None when no tools are given."""
    theirs, ours = _render_both(tmp_path, {"eos_token": "<|eos|>"})
    assert "TOOLS" not in theirs
    assert ours == theirs


def test_an_empty_conversation_is_refused():
    """Catches check_messages passing an empty list on: the template would render a prompt of only the
    generation header (a prompt nobody wrote) instead of a ValueError saying the messages are empty."""
    import pytest

    from nonstop.engine.chat_template import check_messages

    with pytest.raises(ValueError, match="empty"):
        check_messages([])


def test_an_assistant_message_without_content_needs_tool_calls():
    """Catches the content check reading any assistant message as allowed to leave content out: without
    tool_calls, a missing content is a mistake (ValueError), not an empty turn; with them it is accepted."""
    import pytest

    from nonstop.engine.chat_template import check_messages

    with pytest.raises(ValueError, match="no content"):
        check_messages([{"role": "assistant"}])
    with pytest.raises(ValueError, match="no content"):
        check_messages([{"role": "assistant", "content": None, "tool_calls": []}])
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert check_messages([{"role": "assistant", "tool_calls": call}]) == [
        {"role": "assistant", "content": "", "tool_calls": call}
    ]


def _byte_level_with_added_tokens(tmp_path):
    """A byte-level BPE tokenizer.json whose vocabulary holds the 256 byte characters, a token "a中" whose
    name is partly outside the byte alphabet, a non-special added token "naïve" and a special "<|end|>"."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HF

    from nonstop.engine.tokenizer import Tokenizer, _byte_level_inverse

    vocab = {c: i for i, c in enumerate(sorted(_byte_level_inverse()))}
    vocab["a中"] = 256
    hf = HF(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_tokens([AddedToken("naïve", special=False)])
    hf.add_special_tokens([AddedToken("<|end|>", special=True)])
    hf.save(str(tmp_path / "tokenizer.json"))
    return hf, Tokenizer.load(tmp_path, 300)


def test_token_text_of_added_and_odd_byte_level_tokens(tmp_path):
    """Catches token_bytes reading an added token's name as byte-alphabet characters (added tokens are
    text, not bytes: "naïve" would list as ``bytes:...\\xef...``), a non-special added token listed as a
    special one, and a name only partly in the byte alphabet read as bytes (a KeyError). Expected texts:
    the special token's own name, else ``tokenizers``' decode of the one id."""
    hf, tok = _byte_level_with_added_tokens(tmp_path)
    added, end = hf.token_to_id("naïve"), hf.token_to_id("<|end|>")
    assert tok.special_name(added) is None and tok.special_name(end) == "<|end|>"
    assert tok.token_bytes(added) is None and tok.token_bytes(256) is None
    assert tok.token_text(added) == hf.decode([added])
    assert tok.token_text(256) == hf.decode([256]) == "a中"
    assert tok.token_text(end) == "<|end|>"
    assert tok.token_bytes(hf.token_to_id("Ġ")) == b" "  # GPT-2's alphabet: U+0120 stands for the space


def test_a_message_content_that_is_not_valid_unicode_is_refused_naming_it():
    """Catches check_messages leaving content out of its Unicode check: a lone surrogate in a message's
    text must be refused there, naming messages[i]['content'], not later by the tokenizer without a place."""
    import pytest

    from nonstop.engine.chat_template import check_messages
    from nonstop.engine.tokenizer import TokenizerError

    with pytest.raises(TokenizerError, match=r"messages\[1\]\['content'\]"):
        check_messages([{"role": "user", "content": "ok"}, {"role": "user", "content": "a\ud800b"}])
    with pytest.raises(TokenizerError, match=r"messages\[0\]\['content'\]"):
        check_messages([{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}])


def test_a_non_text_part_of_any_type_is_refused_as_unsupported():
    """Catches the part-type check naming only some types: an audio (or any non-text) part must be a
    ValueError saying only text parts are supported, not a TypeError about the part's shape."""
    import pytest

    from nonstop.engine.chat_template import check_messages

    for kind in ("input_audio", "image_url", "file"):
        part = {"type": kind, kind: {"data": "xx"}}
        with pytest.raises(ValueError, match="only text parts are supported"):
            check_messages([{"role": "user", "content": [part]}])


def test_raise_exception_in_a_template_gives_its_own_message():
    """Catches render_chat wrapping the template's own refusal: raise_exception('...') must reach the user
    as that message, not as "chat template failed: ChatTemplateError: ..."."""
    import pytest

    from nonstop.engine.chat_template import ChatTemplateError, render_chat

    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must be user') }}{% endif %}x"
    with pytest.raises(ChatTemplateError) as info:
        render_chat([{"role": "system", "content": "s"}], template)
    assert str(info.value) == "first message must be user"
    assert render_chat([{"role": "user", "content": "u"}], template) == "x"


def test_generation_config_without_do_sample_sets_no_temperature(tmp_path):
    """Catches a missing ``do_sample`` read as false: only an explicit ``do_sample: false`` (with no
    temperature) makes requests greedy; without the field the defaults hold just the file's fields."""
    import json

    from nonstop.engine.generation_config import load_generation_config

    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.9, "eos_token_id": 3}))
    gen = load_generation_config(tmp_path)
    assert gen.defaults == {"top_p": 0.9}
    assert gen.sampling().temperature == 1.0  # SamplingParams' own default
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.9, "do_sample": False}))
    assert load_generation_config(tmp_path).defaults == {"top_p": 0.9, "temperature": 0.0}


def _tiktoken_dir(d, merges: list[bytes], added: dict[int, str]):
    """A Kimi-style checkpoint: tiktoken.model with the 256 bytes then ``merges`` as ranks, and ``added``
    in tokenizer_config.json's added_tokens_decoder."""
    import base64
    import json

    ranks = [bytes([i]) for i in range(256)] + merges
    d.mkdir(parents=True, exist_ok=True)
    (d / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)))
    decoder = {str(i): {"content": s, "special": True} for i, s in added.items()}
    (d / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    return d


def test_a_named_special_token_right_after_the_reserved_block_is_a_token(tmp_path):
    """Catches an off-by-one at the end of the 258 reserved ids: a token named at id base + 258 (the first
    id past them) must still encode as itself. Ids by hand: 256 bytes, then 258 reserved, then 514."""
    from nonstop.engine.tokenizer import Tokenizer

    first_beyond = 256 + 258
    tok = Tokenizer.load(_tiktoken_dir(tmp_path / "k", [], {first_beyond: "<|tool|>"}), first_beyond + 1)
    assert tok.encode("a<|tool|>") == [ord("a"), first_beyond]
    assert tok.token_text(first_beyond) == "<|tool|>"


def test_a_long_run_is_cut_every_max_run_chars_as_kimis_tokenizer_cuts_it(tmp_path):
    """Catches the run cut moved off MAX_RUN_CHARS: Kimi's tokenization_kimi.py encodes a run of letters in
    pieces of exactly 25,000 characters. With the merge "ba", "a" + "ba" * 12,500 (25,001 letters) cut at
    25,000 is "a", 12,499 x "ba", "b" | "a": 12,502 tokens (uncut: 12,501)."""
    from nonstop.engine.tokenizer import MAX_RUN_CHARS, Tokenizer

    assert MAX_RUN_CHARS == 25_000
    tok = Tokenizer.load(_tiktoken_dir(tmp_path / "k", [b"ba"], {}), 256 + 1 + 258)
    ids = tok.encode("a" + "ba" * 12_500)
    assert ids == [ord("a")] + [256] * 12_499 + [ord("b"), ord("a")]


def test_a_null_field_in_generation_config_is_left_unset(tmp_path):
    """Catches null sampling fields passed on as None (a CheckpointError for a file transformers writes
    with nulls): a null is as if the field were absent."""
    import json

    from nonstop.engine.generation_config import load_generation_config

    raw = {"temperature": None, "top_k": None, "max_new_tokens": None, "top_p": 0.5}
    (tmp_path / "generation_config.json").write_text(json.dumps(raw))
    assert load_generation_config(tmp_path).defaults == {"top_p": 0.5}


def test_a_byte_beyond_a_small_vocabulary_is_refused_by_the_byte_tokenizer_itself():
    """Catches an off-by-one in ByteTokenizer's own check: with a vocabulary of 195, "é" (UTF-8 C3 A9 =
    195, 169) must be refused with the message telling the user to pass token ids."""
    import pytest

    from nonstop.engine.tokenizer import ByteTokenizer, TokenizerError

    with pytest.raises(TokenizerError, match="cannot hold every byte"):
        ByteTokenizer(195).encode("é")
    assert ByteTokenizer(196).encode("é") == [195, 169]


def test_additional_special_tokens_as_an_object_override_a_top_level_key_as_in_transformers(tmp_path):
    """Catches the merge order without ``extra_special_tokens``: where ``image_token`` is a top-level key and
    an entry of an object ``additional_special_tokens``, transformers gives templates the latter."""
    config = {"eos_token": "<|eos|>", "image_token": "<|pad|>", "additional_special_tokens": {"image_token": "<|bos|>"}}
    theirs, ours = _render_both(tmp_path, config)
    assert theirs == ours == "<|eos|>|<|bos|>||"


def test_a_one_element_1d_tensor_is_not_a_token_id():
    """Catches _token_like accepting 1-D arrays of one element (torch's ``__index__`` takes them): a list of
    such tensors is a list of 1-D arrays, refused with the position, not silently flattened into ids."""
    import pytest
    import torch

    from nonstop.engine.inputs import id_list

    with pytest.raises(TypeError, match=r"p\[0\] is a 1-D array"):
        id_list([torch.tensor([5]), 6], "p")
    assert id_list([torch.tensor(5), 6], "p") == [5, 6]
