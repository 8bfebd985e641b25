"""Tests for the byte-level BPE tokenizer trainer (small, in-test corpus)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from nonstop.train.corpus import load_heldout_sample
from nonstop.train.tokenizer import (
    BOS_TOKEN,
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    bytes_per_token,
    save_tokenizer,
    train_tokenizer,
)

TRAIN_TEXT = (
    "The quick brown fox jumps over the lazy dog. "
    "A list is a mutable sequence; a tuple is an immutable one. "
    "Functions return values, and modules group related functions together.\n\n"
) * 50

ROUND_TRIP_CASES = [
    "Hello, world!",
    "",
    " leading space and trailing space ",
    "tabs\tand\nnewlines\r\nand  double  spaces\n\n\n",
    "naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji 🎉🐍 and combining e\u0301 and zero\u200bwidth",
    "control \x00\x01\x7f bytes and a noncharacter \uffff",
    "def f(*args, **kwargs):\n    return {'a': [1, 2, 3]}  # code\n",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer([TRAIN_TEXT], vocab_size=400)


def test_special_tokens_have_ids_0_1_2(tokenizer: Tokenizer):
    assert [tokenizer.token_to_id(t) for t in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)] == [0, 1, 2]


def test_vocab_size_and_merges(tokenizer: Tokenizer):
    assert 3 + 256 < tokenizer.get_vocab_size() <= 400
    # Common words are merged into single tokens.
    assert len(tokenizer.encode(" the").ids) == 1


@pytest.mark.parametrize("text", ROUND_TRIP_CASES)
def test_round_trip_is_exact(tokenizer: Tokenizer, text: str):
    ids = tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text


def test_round_trip_random_unicode(tokenizer: Tokenizer):
    rng = random.Random(1234)
    pools = [range(0x20, 0x7F), range(0x00, 0x20), range(0xA0, 0x800), range(0x3000, 0xD7FF), range(0x1F300, 0x1FAFF)]
    for _ in range(200):
        text = "".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randrange(0, 60)))
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_special_tokens_are_recognised_in_text(tokenizer: Tokenizer):
    ids = tokenizer.encode(f"{BOS_TOKEN}Hi{EOS_TOKEN}").ids
    assert ids[0] == 0 and ids[-1] == 1
    assert tokenizer.decode(ids) == "Hi"
    assert tokenizer.decode(ids, skip_special_tokens=False) == f"{BOS_TOKEN}Hi{EOS_TOKEN}"


def test_too_small_vocab_is_rejected():
    with pytest.raises(ValueError):
        train_tokenizer(["abc"], vocab_size=100)


def test_save_writes_tokenizer_and_config(tokenizer: Tokenizer, tmp_path: Path):
    save_tokenizer(tokenizer, tmp_path, model_max_length=256)
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert loaded.decode(loaded.encode(ROUND_TRIP_CASES[4]).ids) == ROUND_TRIP_CASES[4]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
    assert config["model_max_length"] == 256
    assert config["chat_template"] == CHAT_TEMPLATE


def test_chat_template_renders_role_lines():
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = template.render(messages=messages, bos_token=BOS_TOKEN, add_generation_prompt=True)
    assert rendered == "<|bos|><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    assert not template.render(messages=messages, bos_token=BOS_TOKEN).endswith("<|assistant|>\n")


def test_trains_on_heldout_sample_and_compresses_english():
    sample = load_heldout_sample()
    tokenizer = train_tokenizer([sample], vocab_size=1024)
    assert tokenizer.decode(tokenizer.encode(sample).ids) == sample
    assert bytes_per_token(tokenizer, [sample]) > 2.5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--min-frequency", "-1"], "--min-frequency must be a non-negative integer, got -1"),
        (["--model-max-length", "0"], "--model-max-length must be a positive integer, got 0"),
        (["--model-max-length", "-5"], "--model-max-length must be a positive integer, got -5"),
        (["--vocab-size", "65537"], "--vocab-size must be in"),
        (["--vocab-size", "10"], "--vocab-size must be in"),
    ],
)
def test_the_tokenizer_command_refuses_impossible_flags(tmp_path: Path, capsys, flags, message):
    """A negative --min-frequency ended in an OverflowError traceback from the trainer; a --model-max-length
    of 0 or below was written into tokenizer_config.json; a vocabulary past uint16 was accepted here and
    refused only by `nonstop train` later. Each is now argparse's one-line error, before any file is read."""
    from nonstop.train.tokenizer import main

    with pytest.raises(SystemExit) as stop:
        main(["--corpus", str(tmp_path / "none"), "--out", str(tmp_path / "out"), *flags])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_vocabulary_of_exactly_65536_fits_uint16_ids(tmp_path: Path):
    """Ids of a 65,536-token vocabulary are 0..65535, which uint16 holds; the check refused it (``> 65535``)
    while accepting the ids themselves. One more token is refused, naming the size."""
    import numpy as np

    from nonstop.train.tokens import encode_documents

    (tmp_path / "t.txt").write_text("alpha beta\n")

    class Sized:
        def __init__(self, n):
            self.n = n

        def get_vocab_size(self):
            return self.n

        def token_to_id(self, token):
            return 65535

        def encode_batch(self, docs, add_special_tokens=False):
            return [type("E", (), {"ids": [7, 65534]})() for _ in docs]

    assert encode_documents(tmp_path / "t.txt", Sized(65536)).tolist() == [7, 65534, 65535]
    assert encode_documents(tmp_path / "t.txt", Sized(65536)).dtype == np.uint16
    with pytest.raises(ValueError, match="vocabulary of 65537 tokens is too large for uint16"):
        encode_documents(tmp_path / "t.txt", Sized(65537))


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("file", "is an existing file, not a directory"),
        ("file/sub", "which is a file"),
        ("", "--out is empty"),
    ],
)
def test_the_tokenizer_command_refuses_an_output_it_cannot_write_before_training(tmp_path: Path, capsys, out, message):
    """An --out naming a file (or a path under one) trained the whole tokenizer and then ended in a
    FileExistsError traceback; an empty --out wrote into the working directory. Each is now argparse's one-line
    error, before the corpus is read."""
    from nonstop.train.tokenizer import main

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train.txt").write_text("alpha beta gamma\n")
    (tmp_path / "file").write_text("keep me")
    with pytest.raises(SystemExit) as stop:
        main(["--corpus", str(tmp_path / "c"), "--out", str(tmp_path / out) if out else ""])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "keep me"


@pytest.mark.parametrize(
    ("train", "heldout", "message"),
    [
        (b"", None, "holds no text to train on"),
        (b"\n\n  \n", None, "holds no text to train on"),
        (b"\xff\xfe caf\xe9\n", None, "not UTF-8 text"),
        (b"alpha beta\n", b"\xffbad\n", "not UTF-8 text"),
    ],
)
def test_the_tokenizer_command_refuses_a_corpus_with_nothing_to_learn(tmp_path: Path, capsys, train, heldout, message):
    """An empty train.txt trained a 259-token tokenizer (bytes and specials only, whatever --vocab-size asked) and
    wrote it as if all went well; a train.txt or heldout.txt that is not UTF-8 ended in a ValueError traceback.
    Each is now one `error:` line and exit status 1, with nothing written."""
    from nonstop.train.tokenizer import main

    (tmp_path / "train.txt").write_bytes(train)
    if heldout is not None:
        (tmp_path / "heldout.txt").write_bytes(heldout)
    assert main(["--corpus", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
