"""Shared pieces of the executor tests: tiny models, greedy generation through an executor, and
perplexity scored with decode steps (so that the program, not the reference prefill, does the work)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.model.build import random_model
from nonstop.runtime.superop import kernel_table, missing_kernels
from tests.tiny_configs import TINY_CONFIGS

# prompts of different lengths (the first is prefilled through the program: <= 16 rows; the last is
# longer than 16 rows and goes to the reference) and different output lengths, so the decode batch
# shrinks from 3 rows to 1 as requests finish: three static step shapes
PROMPTS = [[3, 4, 5, 6], [7, 8], list(range(10, 30))]
MAX_TOKENS = [6, 3, 8]
MAX_TOKENS_SHORT = [3, 2, 4]  # the same three shapes in 4 decode steps (the interpreter is slow)


def tiny_model(name: str, dtype=torch.float32, seed: int = 5):
    return random_model(ModelConfig.from_hf_dict(TINY_CONFIGS[name]), dtype, seed=seed)


def greedy_tokens(model, executor, prompts=PROMPTS, max_tokens=MAX_TOKENS, page_size: int = 4) -> list[list[int]]:
    """Greedy continuations of ``prompts`` decoded together (continuous batching) through ``executor``."""
    cfg = model.cfg
    core = EngineCore(
        cfg,
        executor,
        ByteTokenizer(cfg.vocab_size),
        len(prompts),
        model.embed_tokens.weight.dtype,
        model.embed_tokens.weight.device,
        page_size=page_size,
    )
    reqs = [
        Request(
            str(i),
            None,
            [t % cfg.vocab_size for t in p],
            SamplingParams(max_tokens=n, temperature=0, ignore_eos=True),
            frozenset(),
        )
        for i, (p, n) in enumerate(zip(prompts, max_tokens))
    ]
    for r in reqs:
        core.add(r)
    while core.running:
        core.step()
    return [r.output_ids for r in reqs]


def kernel_skip_reason(model) -> str | None:
    """Why the kernel path cannot run here: Triton is not installed (a skip). A kind of ``model``'s program
    without a kernel, or a kernel family module that fails to import, is a failure, never a skip."""
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError as exc:
        return f"Triton is not installed ({exc})"
    from nonstop.program.lower import lower

    missing = missing_kernels(lower(model), kernel_table())
    assert not missing, f"no Triton kernel for: {', '.join(missing)}"
    return None


def skip_unless_kernels(model):
    """``model``, once its kernel path can run here: the test is skipped when Triton is not installed, and
    fails when a kind has no kernel (``kernel_skip_reason``)."""
    reason = kernel_skip_reason(model)
    if reason:
        pytest.skip(reason)
    return model


@torch.inference_mode()
def decode_nll(executor, model, ids: torch.Tensor, chunk: int = 16) -> tuple[float, int]:
    """(Σ -log p(x_{t+1} | x_0..x_t), count) over ids [N] fed to ``executor`` in cached steps of at most
    ``chunk`` rows (one sequence; every step goes through the program when chunk <= max_rows)."""
    cfg = model.cfg
    cache = ModelCache(cfg, 1, capacity=ids.numel(), dtype=model.embed_tokens.weight.dtype, device=ids.device)
    total, count = 0.0, 0
    for start in range(0, ids.numel() - 1, chunk):
        piece = ids[start : min(start + chunk, ids.numel() - 1)]
        targets = ids[start + 1 : start + 1 + piece.numel()]
        batch = cache.batch([0], piece.numel())
        logits = executor.forward(piece[None], cache, batch)
        cache.advance(batch)
        total += float(F.cross_entropy(logits[0].float(), targets, reduction="sum").double())
        count += targets.numel()
    return total, count


def perplexity(total_nll: float, count: int) -> float:
    return math.exp(total_nll / count)
