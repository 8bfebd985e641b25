"""The speculative-decoding draft: the engine's own DSpark drafter (``engine/speculative/dspark.py``), sized.

One DSpark step proposes K tokens in one parallel pass over K block slots: it streams the drafter's
weights once, the target's LM head once (logits of the K slots), and the Markov head's W2 [r, V].
The drafter of a bundled model is the one in its ``dspark/`` directory; for other models a drafter
shaped like the published K3 drafters (5 layers, the target's width, head dim 64, MLP 2·d, Markov rank
256, 5 taps; 16 key / value heads per 96 query heads, in its k / v projections and its cache, and a
2,048-position context window: Inferact / RadixArk / RedHatAI Kimi-K3 DSpark) stands in.
Besides its weights, a drafter holds and reads its own cache: each layer's keys and values of the last
``window`` context positions of every sequence.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.plan.workload import FORMAT_BYTES, cfg_json


@dataclass(frozen=True)
class DraftShape:
    params: int  # the drafter's own parameters (embedding / LM head shared with the target)
    weight_bytes: float  # its weights (bf16) + the target LM head + Markov W2, streamed once per step
    flops_per_slot: float
    kernels: int  # one kernel per weight pass (a drafter runs as ordinary kernels)
    context_bytes_per_token: float = 0.0  # its own cache: every layer's keys and values of a context position (bf16)
    window: int = 0  # context positions the drafter attends (and caches) per sequence

    def context_bytes(self, context: int) -> float:
        """A sequence's drafter cache at ``context`` tokens: min(context, window) · layers · 2 · H_kv · hd · 2 B
        (a tensor-parallel drafter splits it by heads). Read once a step, like its weights."""
        return min(context, self.window) * self.context_bytes_per_token


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


STAND_IN_LAYERS = 5  # the published K3 drafters' depth and taps (see the module docstring)
STAND_IN_TAPS = 5
STAND_IN_WINDOW = 2048  # RedHatAI/Kimi-K3-speculator.dspark's draft sliding window
STAND_IN_KV_GROUP = 6  # and its grouped keys: 96 query heads share 16 key / value heads (k / v weights, cache)


def _stand_in_taps(layers: int) -> tuple[int, ...]:
    """The stand-in drafter's taps: STAND_IN_TAPS target layers spread over the stack."""
    return tuple(sorted({max(1, round(layers * (i + 1) / STAND_IN_TAPS)) for i in range(STAND_IN_TAPS)}))


def _bundled_drafter(model_dir: Path | None):
    """The DSparkConfig of a bundled model's own drafter, or None."""
    if model_dir is None or not (model_dir / "dspark" / "config.json").exists():
        return None
    from nonstop.engine.speculative.dspark import DSparkConfig

    return DSparkConfig.load(model_dir / "dspark" / "config.json")


def draft_shape(cfg: ModelConfig, model_dir: Path | None, drafts: int) -> DraftShape:
    d = _bundled_drafter(model_dir)
    if d is not None:
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
        window, kv_heads = d.context_window, d.num_heads  # nonstop's DSpark layers keep a key / value per head
    else:
        heads = max(1, (cfg.hidden_size * 6 // 7) // 64)  # K3: 96 heads of 64 for d = 7168
        args = (cfg.vocab_size, cfg.hidden_size, STAND_IN_LAYERS, heads, 64, 2 * cfg.hidden_size, STAND_IN_TAPS, 256)
        window, kv_heads = STAND_IN_WINDOW, max(1, heads // STAND_IN_KV_GROUP)
    params, tensors = _drafter_params(*args, max(drafts, 1))
    vocab, hidden = args[0], args[1]
    layers, heads, head_dim = args[2], args[3], args[4]
    params -= layers * 2 * hidden * (heads - kv_heads) * head_dim  # k / v projections kv_heads wide, not heads
    markov_w2 = args[7] * vocab
    head = vocab * hidden
    weight_bytes = 2.0 * (params + head)  # bf16; W2 is part of params
    flops = 2.0 * (params - markov_w2 + head)
    context_kv = layers * 2 * kv_heads * head_dim * FORMAT_BYTES["bf16"]
    return DraftShape(params, weight_bytes, flops, tensors, context_kv, window)


def eager_draft_ops(cfg: ModelConfig, model_dir: Path | None, drafts: int, accepted: int) -> int:
    """The aten ops nonstop's eager DSpark drafter dispatches per step: ``observe`` of the ``accepted``
    committed positions (their context keys and values) and ``propose`` of ``drafts`` tokens (one block
    pass, the Markov head per slot), counted on a drafter of the same layers and taps beside a narrow
    twin of the target (the count does not depend on widths)."""
    d = _bundled_drafter(model_dir)
    layers = d.num_layers if d is not None else STAND_IN_LAYERS
    taps = d.taps if d is not None else _stand_in_taps(cfg.num_hidden_layers)
    return _count_draft_ops(cfg_json(cfg), layers, tuple(taps), drafts, accepted)


@functools.lru_cache(maxsize=8)
def _count_draft_ops(cfg_text: str, layers: int, taps: tuple[int, ...], drafts: int, accepted: int) -> int:
    from types import SimpleNamespace

    from nonstop.engine.speculative.dspark import DSparkConfig, DSparkModel
    from nonstop.engine.speculative.dspark_drafter import DSparkDrafter
    from nonstop.model.build import random_model
    from nonstop.plan.workload import shapes_from_json
    from nonstop.program.count import OpCounter
    from nonstop.program.twin import narrow_twin

    twin = narrow_twin(shapes_from_json(cfg_text))
    dcfg = DSparkConfig(
        vocab_size=twin.vocab_size,
        hidden_size=twin.hidden_size,
        taps=taps,
        block_size=max(drafts, 1),
        num_layers=layers,
        num_heads=2,
        head_dim=16,
        intermediate_size=96,
        markov_rank=8,
    )
    drafter = DSparkDrafter(DSparkModel(dcfg), random_model(twin, torch.float32))
    req = SimpleNamespace(output_ids=[1], params=SimpleNamespace(greedy=True), draft_state=None)
    drafter.start(req)

    def hidden(n: int) -> dict:
        return {t: torch.zeros(n, twin.hidden_size) for t in taps}

    drafter.observe(req, hidden(8))  # a prompt's context
    counter = OpCounter()
    with counter:
        drafter.observe(req, hidden(accepted))
        drafter.propose(req, drafts)
    return counter.total
