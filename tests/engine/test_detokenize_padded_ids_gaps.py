"""Streamed text when the model emits ids its tokenizer.json does not have (a vocabulary padded past the
tokenizer's, as DeepSeek-V3's 129280 ids over about 128.8K tokens): ``decode`` skips them and joins the bytes
on either side, so an id inside a multi-byte character must not close the character early. The pieces the
incremental decoder emits add up to the whole-sequence decode."""

from __future__ import annotations

import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.tokenizer import Tokenizer
from tests.engine.tiny_models import synth_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    tok = Tokenizer.load(synth_checkpoint("k3", tmp_path_factory.mktemp("padded")), 320)
    assert tok.encode("a€b") == [97, 226, 130, 172, 98]  # byte-level: one token a byte, 256 of 320 ids
    return tok


@pytest.mark.parametrize(
    "ids",
    [
        [97, 226, 300, 130, 172, 98],  # a padded id after the lead byte (old: "a\ufffd" + "\ufffd\ufffdb")
        [97, 226, 130, 301, 172, 98],  # after a continuation byte
        [226, 300, 319, 130, 172],  # two in a row, the character last
        [300, 97, 256, 98, 257],  # around whole characters
    ],
)
def test_streamed_pieces_add_up_to_the_decode(tokenizer, ids):
    dec = IncrementalDecoder(tokenizer)
    pieces = [dec.push(t) for t in ids]
    streamed = "".join(pieces) + dec.flush()
    want = bytes(t for t in ids if t < 256).decode("utf-8")  # the byte-level tokens' own bytes
    assert tokenizer.decode(ids) == want
    assert streamed == want, pieces
    assert "\ufffd" not in "".join(pieces)
