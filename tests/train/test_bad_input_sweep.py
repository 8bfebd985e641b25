"""Bad training inputs refused with one line naming the file: a corrupt tokenizer.json, a corpus file that
is not UTF-8 or not a regular file, a cut or garbled .deb, a vocabulary too small for the bytes, and a
token stream too short for --seq-len (the message says what it needs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nonstop.train import corpus, tokenizer
from nonstop.train.corpus import CorpusError, iter_documents, read_deb
from nonstop.train.tokens import cached_token_ids, load_tokenizer
from tests.train.test_corpus import _fake_deb


def test_a_corrupt_tokenizer_json_is_a_value_error_naming_it(tmp_path: Path):
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match=r"tokenizer\.json: cannot load tokenizer"):
        load_tokenizer(tmp_path)


def test_a_directory_in_place_of_tokenizer_json_is_named(tmp_path: Path):
    (tmp_path / "tokenizer.json").mkdir()
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a regular file"):
        load_tokenizer(tmp_path)


def test_a_corpus_file_that_is_not_utf8_is_named(tmp_path: Path):
    path = tmp_path / "heldout.txt"
    path.write_bytes(b"fine text\n\xff\xfe bad\n")
    with pytest.raises(ValueError, match=r"heldout\.txt: not UTF-8 text \(invalid start byte at byte 10\)"):
        list(iter_documents(path))


def test_a_directory_in_place_of_train_txt_is_not_called_missing(tmp_path: Path):
    (tmp_path / "train.txt").mkdir()
    with pytest.raises(ValueError, match=r"train\.txt: not a regular file"):
        cached_token_ids(tmp_path / "train.txt", tmp_path, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"train\.txt: not a regular file"):
        list(iter_documents(tmp_path / "train.txt"))


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.98, 0.999])
def test_a_cut_deb_is_a_corpus_error(tmp_path: Path, cut: float):
    """A download cut anywhere is refused: it was read as far as it went (files missing, no error) or failed
    with a traceback."""
    whole = _fake_deb(tmp_path / "whole.deb", {"library/a": "Alpha", "library/b": "Beta"}).read_bytes()
    deb = tmp_path / "cut.deb"
    deb.write_bytes(whole[: int(len(whole) * cut)])
    with pytest.raises(CorpusError, match=r"cut\.deb: (not a readable Debian package|no data\.tar\* member)"):
        read_deb(deb, lambda name: True)


def test_a_garbled_ar_header_is_a_corpus_error(tmp_path: Path):
    whole = bytearray(_fake_deb(tmp_path / "whole.deb", {"library/a": "Alpha"}).read_bytes())
    whole[8 + 48 : 8 + 58] = b"xxxxxxxxxx"  # the first member's size field
    deb = tmp_path / "garbled.deb"
    deb.write_bytes(bytes(whole))
    with pytest.raises(CorpusError, match="not a readable Debian package"):
        read_deb(deb, lambda name: True)


def test_the_corpus_command_reports_a_cut_deb_in_one_line(tmp_path: Path, capsys):
    whole = _fake_deb(tmp_path / "whole.deb", {"library/a": "Alpha"}).read_bytes()
    deb = tmp_path / "python3.11-doc_3.11.2-6_all.deb"
    deb.write_bytes(whole[:-3])
    assert corpus.main(["--deb", str(deb), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert "not a readable Debian package" in err and "Traceback" not in err


def test_the_tokenizer_command_refuses_a_vocabulary_without_every_byte(tmp_path: Path, capsys):
    """256 byte values plus BOS, EOS and PAD: 259 ids at least."""
    with pytest.raises(SystemExit) as exc:
        tokenizer.main(["--corpus", str(tmp_path), "--vocab-size", "258"])
    assert exc.value.code == 2
    assert "--vocab-size must be in 259..65536" in capsys.readouterr().err


def test_a_config_with_packed_experts_is_refused_before_any_tokenizing(tmp_path: Path):
    """A config whose quantization_config makes the routed experts MXFP4 trained every parameter but the
    experts (packed uint8 buffers get no gradient) and exported the random initial experts as trained, with
    rc 0. It is now refused, by ``init_model`` and by ``run_training`` before the corpus is read."""
    from nonstop.config import ModelConfig
    from nonstop.train.run import run_training
    from nonstop.train.trainer import TrainConfig, init_model
    from tests.tiny_configs import KIMI_K3, KIMI_K3_MXFP4

    cfg = ModelConfig.from_hf_dict(KIMI_K3_MXFP4)
    with pytest.raises(ValueError, match=r"routed experts as mxfp4 \(packed, not trainable\)"):
        init_model(cfg)
    with pytest.raises(ValueError, match="remove quantization_config"):  # no corpus here: refused before it
        run_training(tmp_path / "no-corpus", tmp_path / "no-tokenizer", cfg, TrainConfig(), tmp_path / "out")
    dense = init_model(ModelConfig.from_hf_dict(KIMI_K3))
    assert any("experts" in n for n, _ in dense.named_parameters())  # dense experts: trainable parameters


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--heldout-permille", "1000"], "--heldout-permille must be in 1..999, got 1000"),
        (["--heldout-permille", "0"], "--heldout-permille must be in 1..999, got 0"),
        (["--sample-bytes", "0"], "--sample-bytes must be >= 1, got 0"),
    ],
)
def test_the_corpus_command_refuses_a_split_with_an_empty_side(flags, message, tmp_path: Path, capsys):
    """A held-out share of 1000/1000 (or more) built a corpus with no training text, 0 one with no held-out
    text, and said nothing; each is now a usage error before anything is read."""
    with pytest.raises(SystemExit) as exc:
        corpus.main(["--deb", str(tmp_path / "none.deb"), "--out", str(tmp_path / "out"), *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
