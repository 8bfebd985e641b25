"""Defects a mutation audit of the engine's text input / output found, each checked against an independent
implementation: the ``tokenizers`` library's own whole-sequence decode, transformers' chat-template
rendering, and numpy's bool scalars."""

from __future__ import annotations

import random

import numpy as np
import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.tokenizer import Tokenizer


def _sentencepiece_style(tmp_path):
    """A Llama-2 / Mistral-style tokenizer.json: ``▁`` for spaces, byte fallback, and a decoder that strips
    the leading space of the first token decoded; plus two special tokens (``<tool>``, ``</tool>``)."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HF

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    words = ["<unk>", "▁", "x", "y", "é", "▁x", "▁y", "▁é"]
    vocab |= {w: 256 + i for i, w in enumerate(words)}
    merges = [("▁", "x"), ("▁", "y"), ("▁", "é")]
    hf = HF(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    hf.add_special_tokens([AddedToken("<tool>", special=True), AddedToken("</tool>", special=True)])
    hf.save(str(tmp_path / "tokenizer.json"))
    return hf, Tokenizer.load(tmp_path, hf.get_vocab_size())


def test_streamed_text_keeps_the_space_after_a_special_token(tmp_path):
    """After a special token the next decode window started on it; ``decode`` skips it, so the next real
    token was the first decoded and the SentencePiece ``Strip`` took its leading space: ``▁x <tool> ▁y``
    streamed as "xy" where the tokenizer's own decode is "x y". The streamed pieces must add up to the
    whole-sequence decode for any mix of words, byte-fallback pieces and special tokens."""
    hf, tok = _sentencepiece_style(tmp_path)
    specials = [hf.token_to_id("<tool>"), hf.token_to_id("</tool>")]
    units = [[hf.token_to_id(w)] for w in ("▁x", "▁y", "x", "▁é", "▁")] + [[0xC3, 0xA9], [0x41]]  # é as bytes
    units += [[s] for s in specials]
    rng = random.Random(11)
    cases = [[units[0][0], specials[0], units[1][0]], [specials[0], units[1][0], specials[1], specials[0], 0xC3, 0xA9]]
    # whole characters only: tokenizers' ByteFallback turns every byte of an invalid run into U+FFFD (a valid
    # "A" beside a cut "é" included), which no streaming decoder can know in advance
    cases += [sum((rng.choice(units) for _ in range(rng.randint(1, 20))), []) for _ in range(300)]
    for ids in cases:
        dec = IncrementalDecoder(tok)
        streamed = "".join(dec.push(i) for i in ids)
        whole = hf.decode(ids, skip_special_tokens=True)
        assert whole.startswith(streamed) and whole[len(streamed) :] in ("", "\ufffd"), (ids, streamed, whole)
    dec = IncrementalDecoder(tok)
    assert [dec.push(i) for i in cases[0]] == ["x", "", " y"]


@pytest.mark.parametrize("value", [np.True_, np.False_, np.bool_(1)])
def test_numpy_bools_are_flags(value):
    """``check_flag`` looked for numpy's type name ``bool_``; numpy 2 calls it ``bool``, so ``np.True_`` was
    refused as "must be True or False", against its docstring. Strings and ints still are refused."""
    from nonstop.engine.inputs import check_flag

    assert check_flag(value, "batch_invariant") is bool(value)
    for bad in ("no", 1, np.int64(1), None):
        with pytest.raises(TypeError, match="batch_invariant must be True or False"):
            check_flag(bad, "batch_invariant")


def test_templates_see_documents_as_none_as_in_transformers():
    """``documents`` was left undefined: a template testing ``documents is not none`` (retrieval-augmented
    templates do) rendered an empty documents section, where transformers passes None and renders none."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from nonstop.engine.chat_template import render_chat

    template = (
        "{% if documents is not none %}<docs>{% for d in documents %}{{ d.text }}{% endfor %}</docs>{% endif %}"
        "{{ messages[0]['content'] }}"
    )
    messages = [{"role": "user", "content": "hi"}]
    theirs = render_jinja_template([messages], chat_template=template, add_generation_prompt=True)[0][0]
    assert render_chat(messages, template) == theirs == "hi"
