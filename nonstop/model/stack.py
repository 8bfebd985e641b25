"""The hybrid decoder stack: one model class for every family, driven by ``ModelConfig``.

Layer i = attention sublayer (``attn_types[i]``: gqa | mla | kda) + FFN sublayer (``mlp_types[i]``:
dense | moe), each pre-normed. Two residual schemes:

* plain residual:  h ← h + Attn(RMSNorm(h));  h ← h + FFN(RMSNorm(h))
* block attention residuals (K3), with B = attn_res_block_size, blocks = [], partial = embedding:
      src = Mix(blocks + [partial], w_attn_i);   if i % B == 0: blocks.append(partial); partial = 0
      partial += Attn(RMSNorm(src));  src = Mix(blocks + [partial], w_mlp_i);  partial += FFN(RMSNorm(src))
  and the output is Mix(blocks + [partial], w_out).
Then logits = lm_head(RMSNorm(h)) (lm_head tied to the embedding when the config says so).
"""

from __future__ import annotations

import torch
from torch import nn

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.config import ModelConfig
from nonstop.model.attention import GQAAttention
from nonstop.model.attnres import attn_res_mix, attn_res_query
from nonstop.model.kda import KDAAttention
from nonstop.model.linear import Linear, linear
from nonstop.model.mla import MLAAttention
from nonstop.model.mlp import GatedMLP
from nonstop.model.moe import MoE
from nonstop.model.norms import RMSNorm
from nonstop.model.rope import Rotary


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, rotary: Rotary | None):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.attn_type = cfg.attn_types[index]
        self.mlp_type = cfg.mlp_types[index]
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        if self.attn_type == "gqa":
            self.self_attn = GQAAttention(cfg.gqa, d, rotary)
        elif self.attn_type == "mla":
            self.self_attn = MLAAttention(cfg.mla, d, rotary)
        else:
            self.self_attn = KDAAttention(cfg.kda, d, eps)
        act = (cfg.hidden_act, cfg.situ_beta, cfg.situ_linear_beta)
        if self.mlp_type == "dense":
            self.mlp = GatedMLP(d, cfg.intermediate_size, *act, bias=cfg.mlp_bias)
        else:
            self.mlp = MoE(cfg.moe, d, *act, eps)
        if cfg.uses_attn_res:
            self.self_attention_res_norm = RMSNorm(d, eps)
            self.self_attention_res_proj = Linear(d, 1)
            self.mlp_res_norm = RMSNorm(d, eps)
            self.mlp_res_proj = Linear(d, 1)

    def attention(self, h: torch.Tensor, batch: StepBatch, cache) -> torch.Tensor:
        return self.self_attn(self.input_layernorm(h), batch, cache)

    def ffn(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.post_attention_layernorm(h))

    def attn_query(self) -> torch.Tensor:
        return attn_res_query(self.self_attention_res_norm.weight, self.self_attention_res_proj.weight)

    def mlp_query(self) -> torch.Tensor:
        return attn_res_query(self.mlp_res_norm.weight, self.mlp_res_proj.weight)


class CausalLM(nn.Module):
    """Embedding, decoder layers, final norm, LM head — parameter names follow the HF checkpoints
    (without the family's prefix; experts stacked; see ``nonstop.weights.layout``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        rotary = Rotary(cfg.rope) if cfg.rope is not None else None
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size)
        if cfg.uses_attn_res:
            self.output_attn_res_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.output_attn_res_proj = Linear(cfg.hidden_size, 1)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def body(self, input_ids: torch.Tensor, batch: StepBatch, cache: ModelCache | None, capture: tuple[int, ...] = ()):
        """input_ids [B, T] -> final hidden (before the final norm) [B, T, d], and the residual stream
        entering each layer listed in ``capture`` (for AttnRes: the running partial sum; at a block
        boundary that is the completed block sum). ``capture`` may list L = num_hidden_layers: the
        residual after the last layer (plain: h; AttnRes: the last partial sum, before the output mix)."""
        h = self.embed_tokens(input_ids)
        captured: dict[int, torch.Tensor] = {}
        layer_cache = cache.layers if cache is not None else [None] * len(self.layers)
        if not self.cfg.uses_attn_res:
            for i, layer in enumerate(self.layers):
                if i in capture:
                    captured[i] = h
                h = h + layer.attention(h, batch, layer_cache[i])
                h = h + layer.ffn(h)
            if len(self.layers) in capture:
                captured[len(self.layers)] = h
            return h, captured
        eps, block = self.cfg.rms_norm_eps, self.cfg.attn_res_block_size
        blocks: list[torch.Tensor] = []
        partial = h
        for i, layer in enumerate(self.layers):
            if i in capture:
                captured[i] = partial
            src = attn_res_mix(blocks + [partial], layer.attn_query(), eps)
            if i % block == 0:
                blocks.append(partial)
                partial = None
            a = layer.attention(src, batch, layer_cache[i])
            partial = a if partial is None else partial + a
            src = attn_res_mix(blocks + [partial], layer.mlp_query(), eps)
            partial = partial + layer.ffn(src)
        if len(self.layers) in capture:
            captured[len(self.layers)] = partial
        query = attn_res_query(self.output_attn_res_norm.weight, self.output_attn_res_proj.weight)
        return attn_res_mix(blocks + [partial], query, eps), captured

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] (pre-norm) -> fp32 logits [..., V]."""
        return linear(self.norm(hidden), self.lm_head_weight).float()

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: ModelCache | None = None,
        batch: StepBatch | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """input_ids [B, T] -> fp32 logits [B, T, V] (or [B, V] with ``last_only``).

        Without ``cache`` the tokens are a whole sequence from position 0 (training, scoring); with it,
        ``batch`` (from ``cache.batch``) says which slots the rows extend, and the caches are updated
        (the caller then calls ``cache.advance(batch)``).
        """
        if batch is None:
            B, T = input_ids.shape
            if cache is not None:
                raise ValueError("a cached forward needs the StepBatch from cache.batch(slots, T)")
            zeros = torch.zeros(B, dtype=torch.long, device=input_ids.device)
            batch = StepBatch(slots=torch.arange(B, device=input_ids.device), start=zeros, T=T)
        hidden, _ = self.body(input_ids, batch, cache)
        if last_only:
            hidden = hidden[:, -1]
        return self.logits(hidden)

    def forward_hidden(
        self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...]
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """A cached step that also returns hidden states: (fp32 logits [B, T, V], {tap: [B, T, d]} with
        the residual stream entering layer ``tap``, as ``body``'s ``capture``)."""
        hidden, captured = self.body(input_ids, batch, cache, capture=tuple(taps))
        return self.logits(hidden), captured
