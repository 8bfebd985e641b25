"""Prompts near the end of the context: ``LLM.generate`` names which of several prompts does not fit, and
``nonstop generate`` cuts a default max_tokens (one --max-tokens did not give) to the room the context
leaves, as the server does, while an explicit --max-tokens that does not fit is still refused."""

from __future__ import annotations

import pytest

from nonstop import LLM, SamplingParams
from nonstop.cli import main
from tests.engine.tiny_models import synth_checkpoint

CONTEXT = 512  # tiny_llama.json's max_position_embeddings


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth_checkpoint("llama", tmp_path_factory.mktemp("room") / "m")


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_the_prompt_that_does_not_fit_is_named(tiny):
    llm = LLM(str(tiny), backend="reference")
    prompts = [[5] * 10, [5] * (CONTEXT - 5), [6] * 3]
    with pytest.raises(ValueError, match=r"^prompt 1: prompt \(507 tokens\) \+ max_tokens \(10\) exceeds"):
        llm.generate(prompt_token_ids=prompts, sampling=SamplingParams(max_tokens=10, temperature=0))


def test_a_default_max_tokens_is_cut_to_the_room_left(tiny, capsys):
    prompt = ",".join(["7"] * (CONTEXT - 5))
    argv = ["generate", "-m", str(tiny), "--backend", "reference", "--ids", "--ignore-eos", "--prompt-ids", prompt]
    code = _run(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "max_tokens 64 cut to 5" in captured.err
    ids_line = [line for line in captured.out.splitlines() if line.startswith("token ids:")]
    assert len(ids_line) == 1 and len(ids_line[0].split()) - 2 == 5  # "token ids:" then the 5 generated


def test_an_explicit_max_tokens_that_does_not_fit_is_refused(tiny, capsys):
    prompt = ",".join(["7"] * (CONTEXT - 5))
    code = _run(["generate", "-m", str(tiny), "--backend", "reference", "-n", "6", "--prompt-ids", prompt])
    captured = capsys.readouterr()
    assert code == 2 and "prompt (507 tokens) + max_tokens (6) exceeds the model's context of 512" in captured.err
    assert "cut to" not in captured.err
