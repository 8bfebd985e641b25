"""Incremental detokenisation with a SentencePiece-style byte-fallback tokenizer.json (Llama 2 / Mistral):
characters outside the vocabulary arrive as runs of ``<0xHH>`` tokens, one after another. The streamed
pieces must add up to ``tokenizers``' own decode of all the ids (a check a mutation audit found missing:
the bytes / byte-level BPE tokenizers of test_detokenize.py never group byte tokens)."""

from __future__ import annotations

import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def byte_fallback(tmp_path_factory):
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, normalizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab |= {"<unk>": 256, "▁": 257, "x": 258, "y": 259, "▁x": 260, "▁y": 261}
    hf = HF(models.BPE(vocab=vocab, merges=[("▁", "x"), ("▁", "y")], unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    d = tmp_path_factory.mktemp("byte-fallback")
    hf.save(str(d / "tokenizer.json"))
    return hf, Tokenizer.load(d, len(vocab))


@pytest.mark.parametrize("text", ["日本語", "x 🎉🎉🎉 y", "😀é😀 x"])
def test_pieces_of_consecutive_byte_token_characters_add_up_to_the_whole_decode(byte_fallback, text):
    hf, tok = byte_fallback
    ids = hf.encode(text, add_special_tokens=False).ids
    assert sum(1 for i in ids if i < 256) >= 6  # two or more characters made of byte tokens, back to back
    expected = hf.decode(ids, skip_special_tokens=True)
    assert expected == text
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == expected
    assert all("\ufffd" not in p for p in pieces)
