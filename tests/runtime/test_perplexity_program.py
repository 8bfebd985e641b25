"""Perplexity through the program equals the reference's: the held-out sample is scored with cached
decode steps of at most 16 rows (so every step runs the superop program, not the reference prefill)
and compared with the reference model's whole-window score; within 0.5%. On the bundled k3-nano, and on
a tiny random K3 (byte tokens) so that the scoring path itself is exercised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nonstop.engine.perplexity import score_token_ids
from nonstop.runtime.superop import SuperOpExecutor
from tests.runtime.helpers import decode_nll, perplexity, skip_unless_kernels, tiny_model

ASSETS = Path(__file__).resolve().parents[2] / "nonstop" / "assets"
SAMPLE = ASSETS / "heldout_sample.txt"


def _compare(model, ids: torch.Tensor, use_kernels: bool, chunk: int) -> tuple[float, float, SuperOpExecutor]:
    ex = SuperOpExecutor(model, use_kernels=use_kernels)
    total, count = decode_nll(ex, model, ids, chunk=chunk)
    with torch.inference_mode():
        want = score_token_ids(model, ids, context=ids.numel())
    assert count == want.tokens
    assert ex.stats["reference_steps"] == 0 and ex.stats["program_steps"] == -(-count // chunk)
    return perplexity(total, count), want.perplexity, ex


def _byte_ids(n: int, vocab: int) -> torch.Tensor:
    data = SAMPLE.read_bytes()[: n + 1]
    return torch.tensor(list(data), dtype=torch.long) % vocab


@pytest.mark.parametrize("use_kernels", [False, True], ids=["twins", "kernels"])
def test_program_perplexity_on_a_tiny_k3(use_kernels):
    model = tiny_model("kimi_k3")
    if use_kernels:
        skip_unless_kernels(model)
    got, want, _ = _compare(
        model, _byte_ids(96 if not use_kernels else 24, model.cfg.vocab_size), use_kernels, chunk=16
    )
    assert abs(got / want - 1) < 0.005, (got, want)


@pytest.mark.parametrize("use_kernels,tokens", [(False, 320), (True, 32)], ids=["twins", "kernels"])
def test_program_perplexity_on_k3_nano(use_kernels, tokens):
    from nonstop.engine.llm import LLM

    llm = LLM("k3-nano", dtype="float32")
    if use_kernels:
        skip_unless_kernels(llm.model)
    ids = torch.tensor(llm.tokenizer.encode(SAMPLE.read_text(encoding="utf-8"))[: tokens + 1])
    got, want, _ = _compare(llm.model, ids, use_kernels, chunk=16)
    assert abs(got / want - 1) < 0.005, (got, want)
