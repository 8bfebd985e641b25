"""``nonstop train`` flag conflicts and the token cache's shape check, left unpinned by earlier audits."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.train.tokens import cached_token_ids
from nonstop.weights.resolve import ASSETS
from tests.tiny_configs import KIMI_K3

TOKENIZER = ASSETS / "k3-nano"


def test_preset_and_config_together_are_refused(tmp_path, capsys):
    """Catches --preset and --config both accepted (one of them then silently ignored): argparse refuses the
    pair before anything runs."""
    with pytest.raises(SystemExit) as exc:
        main(["train", "--out", str(tmp_path / "o"), "--preset", "k3-nano", "--config", str(tmp_path / "c.json")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--config" in err and "not allowed with" in err
    assert not (tmp_path / "o").exists()


def test_a_cache_file_of_the_right_dtype_but_not_a_stream_is_tokenized_again(corpus, tmp_path):
    """Catches the cache check that reads any uint16 array back: a 2-D uint16 array in the cache file is not a
    token stream, so the text is tokenized again and the 1-D stream comes back."""
    cache = tmp_path / "tokens"
    notes = []
    ids = cached_token_ids(corpus / "heldout.txt", TOKENIZER, cache, log=notes.append)
    (path,) = cache.glob("heldout-*.npy")
    np.save(path, np.zeros((3, 4), dtype=np.uint16))
    again = cached_token_ids(corpus / "heldout.txt", TOKENIZER, cache, log=notes.append)
    assert again.ndim == 1 and np.array_equal(again, ids)
    assert any("unreadable" in n for n in notes)


class _HugeVocabulary:
    """A tokenizer stand-in whose vocabulary has ids past what uint16 holds."""

    def token_to_id(self, token: str) -> int:
        return 1

    def get_vocab_size(self) -> int:
        return 65_537


def test_a_vocabulary_past_uint16_is_refused_not_wrapped(tmp_path):
    """Catches a loosened vocabulary check: ids of a 65,537-token vocabulary would wrap around in the uint16
    stream (65,536 -> 0), silently training on wrong tokens; the encoder refuses such a tokenizer."""
    from nonstop.train.tokens import encode_documents

    text = tmp_path / "train.txt"
    text.write_text("hello\n<|eos|>\n", encoding="utf-8")
    with pytest.raises(ValueError, match="uint16"):
        encode_documents(text, _HugeVocabulary())


def test_a_seq_len_equal_to_the_models_positions_trains(corpus, tmp_path):
    """Catches the position check refusing --seq-len equal to max_position_embeddings (windows of exactly the
    model's positions fit): a 64-position model trains a step on windows of 64."""
    hf = copy.deepcopy(KIMI_K3)
    hf["text_config"].update(vocab_size=ModelConfig.preset("k3-nano").vocab_size, max_position_embeddings=64)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(hf))
    argv = ["train", "--corpus", str(corpus), "--tokenizer", str(TOKENIZER), "--config", str(config)]
    argv += ["--cache-dir", str(tmp_path / "tokens"), "--out", str(tmp_path / "out"), "--threads", "1"]
    argv += ["--batch-size", "1", "--seq-len", "64", "--max-steps", "1", "--no-samples"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "out" / "training_log.json").read_text())["train_config"]["seq_len"] == 64
