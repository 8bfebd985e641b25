"""``DSparkDrafter``: runs a trained ``DSparkModel`` inside the engine.

Per request it keeps, for every drafter layer, the keys and values of the context features of the
last ``context_window`` positions the target has committed (computed once, when ``observe`` gets
them; rejected rows are never observed). ``propose`` runs one block pass (anchor = the last emitted
token at position n = tokens committed) and drafts left to right with the Markov head: greedily for a
greedy request (a deterministic draft), else by sampling each slot from the request's filtered
distribution of the draft logits (the probabilities go to the exact verifier).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from nonstop.engine.sampling import filter_logits
from nonstop.engine.speculative.drafter import Draft
from nonstop.engine.speculative.dspark import DSparkModel, load_drafter


@dataclass
class DraftContext:
    """keys / values: per drafter layer [n, H, hd] of the last positions; length: positions seen."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0


class DSparkDrafter:
    """``model`` drafting for ``target``; ``num_tokens``: the drafts per step the engine will ask for (a
    ValueError when the drafter's block size is smaller; None: not checked, ``propose`` drafts at most
    the block size)."""

    def __init__(self, model: DSparkModel, target, num_tokens: int | None = None):
        cfg = model.cfg
        if num_tokens is not None:
            cfg.check_num_tokens(num_tokens)
        if cfg.hidden_size != target.cfg.hidden_size or cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(
                f"DSpark drafter (hidden {cfg.hidden_size}, vocab {cfg.vocab_size}) does not fit the target (hidden "
                f"{target.cfg.hidden_size}, vocab {target.cfg.vocab_size})"
            )
        bad = [t for t in cfg.taps if not 0 <= t <= target.cfg.num_hidden_layers]
        if bad:
            raise ValueError(f"DSpark taps {bad} are outside the target's layers 0..{target.cfg.num_hidden_layers}")
        self.model = model
        self.taps = cfg.taps
        self.embed = target.embed_tokens.weight
        self.lm_head = target.lm_head_weight

    @classmethod
    def load(cls, path: Path, target, num_tokens: int | None = None) -> DSparkDrafter:
        w = target.embed_tokens.weight
        dtype = torch.float32 if w.device.type == "cpu" else w.dtype
        return cls(load_drafter(path, dtype=dtype, device=w.device), target, num_tokens)

    def start(self, req) -> None:
        req.draft_state = DraftContext()

    @torch.inference_mode()
    def observe(self, req, hidden: dict) -> None:
        """hidden {tap: [n, d]}: the target's residual streams of the next n committed positions."""
        ctx: DraftContext = req.draft_state
        p = next(iter(self.model.parameters()))
        feats = torch.cat([hidden[t] for t in self.taps], dim=-1).to(p.dtype)
        n = feats.shape[0]
        positions = torch.arange(ctx.length, ctx.length + n, device=feats.device)[None]
        c = self.model.context(feats[None])
        W = self.model.cfg.context_window
        for i, layer in enumerate(self.model.layers):
            k, v = layer.context_kv(c, positions)
            if len(ctx.keys) <= i:
                ctx.keys.append(k[0, -W:])
                ctx.values.append(v[0, -W:])
            else:
                ctx.keys[i] = torch.cat([ctx.keys[i], k[0]])[-W:]
                ctx.values[i] = torch.cat([ctx.values[i], v[0]])[-W:]
        ctx.length += n

    @torch.inference_mode()
    def propose(self, req, k: int) -> Draft:
        ctx: DraftContext = req.draft_state
        k = min(k, self.model.cfg.block_size)
        if k <= 0 or ctx.length == 0:
            return Draft.empty()
        anchor = req.output_ids[-1]
        kv = [(key[None], value[None]) for key, value in zip(ctx.keys, ctx.values)]
        valid = torch.ones(1, ctx.keys[0].shape[0], dtype=torch.bool, device=self.embed.device)
        dtype = next(iter(self.model.parameters())).dtype
        anchor_pos = torch.tensor([ctx.length], device=self.embed.device)
        hidden = self.model.block_hidden(kv, valid, self.embed[anchor][None].to(dtype), anchor_pos, k)
        base = self.model.base_logits(hidden, self.lm_head)[0]  # [k, V]
        params, tokens, probs = req.params, [], []
        prev = anchor
        for i in range(k):
            logits = base[i] + self.model.markov(torch.tensor(prev, device=base.device))
            if params.greedy:
                prev = int(logits.argmax())
            else:
                q = torch.softmax(filter_logits(logits, params.temperature, params.top_k, params.top_p), dim=-1).cpu()
                prev = int(torch.multinomial(q, 1, generator=req.generator))
                probs.append(q)
            tokens.append(prev)
        return Draft(tokens, torch.stack(probs) if probs else None)
