"""The speculative-decoding draft: the engine's own DSpark drafter (``engine/spec/dspark.py``), sized.

One DSpark step proposes K tokens in one parallel pass over K block slots: it streams the drafter's
weights once, the target's LM head once (logits of the K slots), and the Markov head's W2 [r, V].
The drafter of a bundled model is the one in its ``dspark/`` directory; for other models a drafter
shaped like the published K3 drafters (5 layers, the target's width, head dim 64, MLP 2·d, Markov rank
256, 5 taps: Inferact / RadixArk / RedHatAI Kimi-K3 DSpark) stands in.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from nonstop.config import ModelConfig


@dataclass(frozen=True)
class DraftShape:
    params: int  # the drafter's own parameters (embedding / LM head shared with the target)
    weight_bytes: float  # its weights (bf16) + the target LM head + Markov W2, streamed once per step
    flops_per_slot: float
    kernels: int  # one kernel per weight pass (a drafter runs as ordinary kernels)


@functools.lru_cache(maxsize=8)
def _drafter_params(
    vocab: int, hidden: int, layers: int, heads: int, head_dim: int, inter: int, taps: int, rank: int, block: int
) -> tuple[int, int]:
    from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel

    cfg = DSparkConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        taps=tuple(range(1, taps + 1)),
        block_size=block,
        num_layers=layers,
        num_heads=heads,
        head_dim=head_dim,
        intermediate_size=inter,
        markov_rank=rank,
    )
    with torch.device("meta"):
        model = DSparkModel(cfg)
    params = list(model.parameters())
    return sum(p.numel() for p in params), len(params)


def draft_shape(cfg: ModelConfig, model_dir: Path | None, drafts: int) -> DraftShape:
    if model_dir is not None and (model_dir / "dspark" / "config.json").exists():
        from nonstop.engine.speculative.dspark import DSparkConfig

        d = DSparkConfig.load(model_dir / "dspark" / "config.json")
        args = (
            d.vocab_size,
            d.hidden_size,
            d.num_layers,
            d.num_heads,
            d.head_dim,
            d.intermediate_size,
            len(d.taps),
            d.markov_rank,
        )
    else:
        heads = max(1, (cfg.hidden_size * 6 // 7) // 64)  # K3: 96 heads of 64 for d = 7168
        args = (cfg.vocab_size, cfg.hidden_size, 5, heads, 64, 2 * cfg.hidden_size, 5, 256)
    params, tensors = _drafter_params(*args, max(drafts, 1))
    vocab, hidden = args[0], args[1]
    markov_w2 = args[7] * vocab
    head = vocab * hidden
    weight_bytes = 2.0 * (params + head)  # bf16; W2 is part of params
    flops = 2.0 * (params - markov_w2 + head)
    return DraftShape(params, weight_bytes, flops, tensors)
