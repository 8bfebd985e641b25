"""`nonstop perplexity` against transformers: a tiny random Llama written by transformers'
``save_pretrained`` is scored by the command (and by ``score_token_ids`` on the model it loads) and compared
with exp(mean NLL) from a plain loop over the same windows run on transformers' own model. Also the one-line
errors for files with fewer than two tokens."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from nonstop.cli import main
from nonstop.engine.perplexity import score_token_ids
from tests.engine.hf_llama import untied_llama
from tests.test_cli_outputs import _refused

TEXT = bytes(range(32, 127)) * 2  # 190 byte ids: 189 to score


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(transformers model, checkpoint dir): a tiny untied Llama of 260 ids (every byte value)."""
    pytest.importorskip("transformers")
    return untied_llama(tmp_path_factory.mktemp("hf"), 260)


def _reference_nll(model, ids: list[int], context: int) -> tuple[float, int]:
    """(Σ -log p, tokens) by the definition: windows x[k·C .. k·C + C], each id after the first predicted once."""
    ids_t = torch.tensor(ids)
    n, total = len(ids) - 1, 0.0
    with torch.no_grad():
        for s in range(0, n, context):
            w = ids_t[s : s + context + 1]
            logits = model(w[None, :-1]).logits[0].double()
            total += F.cross_entropy(logits, w[1:], reduction="sum").item()
    return total, n


def _run(path, text_file, capsys, *flags) -> tuple[int, float, float]:
    assert main(["perplexity", "-m", str(path), str(text_file), "--tokenizer", "bytes", *flags]) == 0
    out = capsys.readouterr().out
    tokens = int(re.search(r"tokens scored: (\d+)", out).group(1))
    mean = float(re.search(r"mean NLL: ([0-9.]+) nats/token", out).group(1))
    ppl = float(re.search(r"perplexity: ([0-9.]+)\n", out).group(1))
    return tokens, mean, ppl


@pytest.mark.parametrize(
    "context,batch",
    [(64, 4), (7, 3), (7, 4), (16, 2), (1, 5), (2, 1)],
    ids=["positions", "exact-fit", "batch-tail", "short-last", "one", "two"],
)
def test_the_command_prints_transformers_perplexity(hf, tmp_path, capsys, context, batch):
    """Catches windows that skip or repeat an id (the last window dropped, a window of one id, a wrong
    stride), a mean over the wrong count, a log-base or reduction slip: 189 ids in windows of 64 (64+64+61),
    7 (27 full, no tail: the rest is one id), 16 (11 full + 13), 1 and 2."""
    model, path = hf
    f = tmp_path / "t.txt"
    f.write_bytes(TEXT)
    total, n = _reference_nll(model, list(TEXT), context)
    tokens, mean, ppl = _run(path, f, capsys, "--context", str(context), "--batch-size", str(batch))
    assert tokens == n == 189
    assert mean == pytest.approx(total / n, abs=2e-4)
    assert ppl == pytest.approx(math.exp(total / n), rel=2e-4)


@pytest.mark.parametrize("context,batch", [(7, 3), (16, 4), (64, 2), (5, 100)])
def test_score_token_ids_equals_transformers_nll(hf, context, batch):
    """Catches a scorer whose total NLL differs from the windowed definition (to 1e-5, beyond what the printed
    4 decimals show) on the model the command loads from transformers' checkpoint."""
    from nonstop.engine.llm import LLM

    model, path = hf
    llm = LLM(str(path), tokenizer="bytes", backend="reference", max_batch=1)
    ids = list(TEXT)
    total, n = _reference_nll(model, ids, context)
    with torch.inference_mode():
        result = score_token_ids(llm.model, ids, context=context, batch_size=batch)
    assert result.tokens == n
    assert result.total_nll == pytest.approx(total, rel=1e-5)
    assert result.mean_nll == pytest.approx(total / n, rel=1e-5)
    assert result.perplexity == pytest.approx(math.exp(total / n), rel=1e-5)


@pytest.mark.parametrize("max_tokens", [1, 50, 188, 189, 500])
def test_max_tokens_scores_the_first_ids_only(hf, tmp_path, capsys, max_tokens):
    """Catches --max-tokens scoring one id too few or too many (the first id is context only), or scoring past
    the end of the file: the result is that of the file's first max_tokens + 1 ids."""
    model, path = hf
    f = tmp_path / "t.txt"
    f.write_bytes(TEXT)
    kept = list(TEXT)[: max_tokens + 1]
    total, n = _reference_nll(model, kept, 16)
    tokens, mean, _ = _run(path, f, capsys, "--context", "16", "--max-tokens", str(max_tokens))
    assert tokens == n == min(max_tokens, 189)
    assert mean == pytest.approx(total / n, abs=2e-4)


@pytest.mark.parametrize("raw", [b"", b"\xef\xbb\xbf", b"x"], ids=["empty", "bom-only", "one-byte"])
def test_a_file_of_fewer_than_two_tokens_is_one_line_error(hf, tmp_path, capsys, monkeypatch, raw):
    """Catches a file with nothing to score reaching torch (a traceback, an internal error, a nan or a
    division by zero printed as a perplexity) instead of one line naming the file and exit 2; and the
    refusal coming only after every weight loaded (minutes on a large checkpoint): it is made once the
    tokenizer is known, before ``load_model`` is called."""
    import nonstop.model.build

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the file was refused")

    monkeypatch.setattr(nonstop.model.build, "load_model", no_load)
    _, path = hf
    f = tmp_path / "t.txt"
    f.write_bytes(raw)
    err = _refused(["perplexity", "-m", str(path), str(f), "--tokenizer", "bytes"], capsys)
    assert "t.txt: " in err and "perplexity needs at least 2" in err and err.count("\n") == 1, err


def test_a_prefix_that_reaches_the_texts_end_is_the_whole_text():
    """Catches the prefix loop running once more at size == len(text): 8192 characters with --max-tokens 1
    try 4096, then the whole text, which is encoded whole and marked whole (all its ids), not cut to 1 id
    as a prefix that never reached the end."""
    from nonstop.engine.perplexity import MIN_PREFIX_CHARS, leading_token_ids

    text = "ab" * MIN_PREFIX_CHARS  # 2 x 4096 characters
    seen = []
    ids, whole = leading_token_ids(lambda t: seen.append(len(t)) or [ord(c) for c in t], text, 1)
    assert whole and ids == [ord(c) for c in text]
    assert seen == [MIN_PREFIX_CHARS, 2 * MIN_PREFIX_CHARS]


def test_a_mean_nll_past_the_float_range_is_an_infinite_perplexity():
    """A broken checkpoint (a mean NLL of 710+ nats per token) made ``math.exp`` raise OverflowError, which
    `nonstop perplexity` showed as an internal error after printing the mean NLL; its perplexity is inf."""
    from nonstop.engine.perplexity import PerplexityResult

    assert PerplexityResult(tokens=2, total_nll=2 * 710.0).perplexity == math.inf
    assert PerplexityResult(tokens=2, total_nll=2 * 709.0).perplexity == pytest.approx(math.exp(709.0))
