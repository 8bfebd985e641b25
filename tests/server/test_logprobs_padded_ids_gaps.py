"""Logprobs of ids the tokenizer does not know (a model vocabulary padded past tokenizer.json's, as the
tiny test checkpoints and e.g. DeepSeek-V3 have): each must keep its own text, else a completion's
``top_logprobs`` (a dict keyed by token text) merges distinct tokens and can pair the chosen token with
another token's logprob. Expected values are built here from the rows, not by the code under test."""

from __future__ import annotations

import pytest

from nonstop.engine.tokenizer import Tokenizer
from nonstop.server.responses import ResponseBuilder
from tests.engine.tiny_models import synth_checkpoint


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    d = synth_checkpoint("k3", tmp_path_factory.mktemp("tiny-k3-tok"))
    tok = Tokenizer.load(d, 320)
    assert tok.encode("ab") == [97, 98]  # a byte-level tokenizer.json of 256 tokens under a 320-token model
    return tok


def test_ids_past_the_tokenizers_vocabulary_have_distinct_texts(tokenizer):
    # fails on base: HFTokenizer.token_text gives "" for every id in 256..319
    texts = [tokenizer.token_text(i) for i in range(256, 320)]
    assert all(texts), texts[:4]
    assert len(set(texts)) == len(texts)


def test_completion_top_logprobs_keep_every_distinct_token_and_the_chosen_ones_logprob(tokenizer):
    # fails on base: ids 300 and 301 share the text "" so the dict keeps one entry (-1.5 for both)
    builder = ResponseBuilder("completion", "m", tokenizer, 2, "cmpl-x")
    row = {300: -1.0, 301: -1.5, 97: -3.0}
    out = builder.logprobs([301], [row])
    assert out["token_logprobs"] == [-1.5]
    top = out["top_logprobs"][0]
    assert len(top) == 2  # the two best, the chosen one among them
    assert top[out["tokens"][0]] == -1.5
    assert sorted(top.values()) == [-1.5, -1.0]


def test_chat_logprobs_name_padded_ids_apart(tokenizer):
    # fails on base: both entries read token "" with bytes []
    builder = ResponseBuilder("chat", "m", tokenizer, 2, "chatcmpl-x")
    row = {300: -1.0, 301: -1.5, 97: -3.0}
    content = builder.logprobs([300], [row])["content"][0]
    tokens = [t["token"] for t in content["top_logprobs"]]
    assert len(set(tokens)) == 2 and all(tokens)
    assert content["token"] == tokens[0]


def test_a_padded_id_adds_no_bytes_and_is_left_out_of_the_text(tokenizer):
    """decode skips an id tokenizer.json lacks and joins the bytes on either side, so its chat ``bytes`` are
    empty (the entries' bytes still rebuild the content) and the tokenizer counts it as left out."""
    builder = ResponseBuilder("chat", "m", tokenizer, 1, "chatcmpl-x")
    ids = [97, 226, 300, 130, 172, 98]  # "a", then "€" (E2 82 AC) split by the padded id 300, then "b"
    assert tokenizer.decode(ids) == "a€b"
    content = builder.logprobs(ids, [{t: -0.5} for t in ids])["content"]
    assert bytes(b for e in content for b in e["bytes"]).decode() == "a€b"
    assert content[2]["bytes"] == [] and content[2]["token"] == "<|300|>"
    assert tokenizer.left_out(300) and not tokenizer.left_out(97)
