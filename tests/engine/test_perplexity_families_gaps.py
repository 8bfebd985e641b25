"""`nonstop perplexity` against transformers on every transformers-backed family (llama, deepseek_v3,
kimi_linear), each checkpoint written by ``save_pretrained`` with a real tokenizer.json whose post-processor
adds BOS (Llama style): the ids scored must be transformers' ``tokenizer(text)["input_ids"]`` (BOS included,
as context only) and the mean NLL transformers' own model's over the same windows. Also the one-line
refusals of a file that is not UTF-8 and of a path that is not a regular file (a character device)."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from nonstop.cli import main
from nonstop.weights.resolve import ASSETS
from tests.test_cli_outputs import _refused
from tests.tiny_configs import TINY_CONFIGS, hf_model_from_dict

FAMILIES = ["llama", "deepseek_v3", "kimi_linear"]
TEXT = (ASSETS / "heldout_sample.txt").read_text(encoding="utf-8")[:400]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{family: (checkpoint dir, transformers model, transformers tokenizer)}: a byte-level BPE of ~300 ids
    trained on the held-out sample, with "<s>" (id 0) added by its post-processor, beside each model."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([TEXT], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    root, out = tmp_path_factory.mktemp("fam"), {}
    for family in FAMILIES:
        raw = json.loads(json.dumps(TINY_CONFIGS[family]))
        raw.update(vocab_size=tok.get_vocab_size(), bos_token_id=0, eos_token_id=1, pad_token_id=1)
        torch.manual_seed(0)
        model = hf_model_from_dict(raw)
        with torch.no_grad():  # logits far from uniform, so a misplaced target shows in the loss
            for name, p in model.named_parameters():
                if "embed_tokens" in name or "lm_head" in name:
                    p.normal_(std=0.5)
        model.save_pretrained(root / family)
        fast.save_pretrained(root / family)
        out[family] = (root / family, model, transformers.AutoTokenizer.from_pretrained(root / family))
    return out


def _reference(model, ids: list[int], context: int) -> float:
    """Mean NLL by the windows' definition (x[kC .. kC+C], each id after the first predicted once)."""
    t, n, total = torch.tensor(ids), len(ids) - 1, 0.0
    with torch.no_grad():
        for s in range(0, n, context):
            w = t[s : s + context + 1]
            total += F.cross_entropy(model(w[None, :-1]).logits[0].double(), w[1:], reduction="sum").item()
    return total / n


def _run(path, f, capsys, *flags) -> tuple[int, int, float, float]:
    """(tokens in the file, tokens scored, mean NLL, perplexity) as the command prints them."""
    assert main(["perplexity", "-m", str(path), str(f), *flags]) == 0
    out = capsys.readouterr().out
    return (
        int(re.search(r"\((\d+) tokens", out).group(1)),
        int(re.search(r"tokens scored: (\d+)", out).group(1)),
        float(re.search(r"mean NLL: ([0-9.]+) nats", out).group(1)),
        float(re.search(r"perplexity: ([0-9.]+)\n", out).group(1)),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_scores_transformers_ids_with_transformers_nll(checkpoints, tmp_path, capsys, family):
    """Catches a family whose whole-window forward differs from transformers' (MLA, MoE routing, the KDA
    chunked form over windows of 16 batched 3 at a time), and ids that are not transformers' tokenizer's
    (BOS dropped or doubled): the file's token count, the count scored and the mean NLL all match."""
    path, model, tok = checkpoints[family]
    f = tmp_path / "t.txt"
    f.write_text(TEXT, encoding="utf-8")
    ids = tok(TEXT)["input_ids"]
    assert ids[0] == 0 and ids[1] != 0  # transformers adds BOS once
    tokens, scored, mean, ppl = _run(path, f, capsys, "--context", "16", "--batch-size", "3")
    expected = _reference(model, ids, 16)
    assert (tokens, scored) == (len(ids), len(ids) - 1)
    assert mean == pytest.approx(expected, abs=2e-4)
    assert ppl == pytest.approx(math.exp(expected), rel=2e-4)


def test_the_bos_is_context_only(checkpoints, tmp_path, capsys):
    """Catches BOS left out (a one-character file refused, or its character predicted from nothing) or
    scored: the file "T" is 2 ids, BOS T, and its NLL is transformers' -log p(T | BOS)."""
    path, model, tok = checkpoints["llama"]
    f = tmp_path / "t.txt"
    f.write_text("T", encoding="utf-8")
    ids = tok("T")["input_ids"]
    assert len(ids) == 2 and ids[0] == 0
    with torch.no_grad():
        expected = -torch.log_softmax(model(torch.tensor([ids[:1]])).logits[0, 0].double(), -1)[ids[1]].item()
    tokens, scored, mean, _ = _run(path, f, capsys)
    assert (tokens, scored) == (2, 1)
    assert mean == pytest.approx(expected, abs=2e-4)


def test_an_empty_file_is_its_bos_alone_and_refused(checkpoints, tmp_path, capsys):
    """Catches an empty file scored as BOS predicting nothing (a nan or a division by zero): it is one id."""
    f = tmp_path / "t.txt"
    f.write_bytes(b"")
    err = _refused(["perplexity", "-m", str(checkpoints["llama"][0]), str(f)], capsys)
    assert "t.txt: 1 token(s) under this tokenizer; perplexity needs at least 2" in err and err.count("\n") == 1


def test_special_token_text_in_the_file_is_read_as_transformers_reads_it(checkpoints, tmp_path, capsys):
    """Catches "<s>" written in the file tokenized differently from transformers' tokenizer(text) (which
    reads it as the special token): the same ids and the same NLL."""
    path, model, tok = checkpoints["llama"]
    text = "The <s> module</s>"
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    ids = tok(text)["input_ids"]
    assert ids.count(0) == 2
    tokens, scored, mean, _ = _run(path, f, capsys)
    assert (tokens, scored) == (len(ids), len(ids) - 1)
    assert mean == pytest.approx(_reference(model, ids, 512), abs=2e-4)


@pytest.mark.parametrize(
    "raw,where",
    [(b"caf\xe9 au lait", "byte 3"), ("hello".encode("utf-16"), "byte 0"), (b"ok\xed\xa0\x80", "byte 2")],
    ids=["latin-1", "utf-16", "encoded-surrogate"],
)
def test_a_file_that_is_not_utf8_is_one_line_naming_the_byte(checkpoints, tmp_path, capsys, raw, where):
    """Catches bytes that are not UTF-8 decoded with replacement characters (and scored), or an internal
    error: one line naming the file and the first bad byte, exit 2."""
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    err = _refused(["perplexity", "-m", str(checkpoints["llama"][0]), str(f)], capsys)
    assert "t.txt: not UTF-8 text (" in err and f"at {where})" in err and err.count("\n") == 1, err


def test_a_character_device_is_not_a_regular_file(checkpoints, capsys):
    """Catches a path that exists but is no regular file (here /dev/null) being read (as an empty text, or
    a FIFO blocking for ever): it is refused by name before anything loads."""
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    err = _refused(["perplexity", "-m", str(checkpoints["llama"][0]), "/dev/null"], capsys)
    assert "/dev/null: not a regular file" in err and err.count("\n") == 1, err
