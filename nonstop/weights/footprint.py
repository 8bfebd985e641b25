"""What a model costs per decode token, computed from its layout (no weights needed):
parameters (total / active), weight bytes read per token at batch 1, cache bytes per token,
recurrent state per sequence."""

from __future__ import annotations

from dataclasses import dataclass

from nonstop.config import ModelConfig
from nonstop.weights.layout import checkpoint_layout

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Footprint:
    total_params: int
    active_params: int
    embedding_params: int
    weight_bytes: int  # whole checkpoint in this dtype (packed experts as stored)
    bytes_per_token: int  # weights read for one decoded token at batch 1
    cache_bytes_per_token: int  # attention caches (MLA latent / GQA KV) per token, all layers
    state_bytes_per_sequence: int  # KDA recurrent (fp32) + conv windows, all layers


def footprint(cfg: ModelConfig, dtype: str = "bfloat16") -> Footprint:
    """Counts for ``cfg`` with float weights stored in ``dtype`` (router, biases, A_log, dt_bias in fp32)."""
    elt = DTYPE_BYTES[dtype]
    total = active = embedding = weight_bytes = per_token = 0
    for spec in checkpoint_layout(cfg):
        n = spec.numel
        size = {"float": elt, "fp32": 4, "u8": 1}[spec.kind]
        nbytes = n * size
        params = 0 if spec.init == "mxfp4_scale" else (2 * n if spec.init == "mxfp4_packed" else n)
        weight_bytes += nbytes
        total += params
        if spec.param == "embed_tokens.weight":
            embedding += params
            per_token += cfg.hidden_size * size  # one row is gathered
            continue
        if ".experts." in spec.param:  # top_k of num_experts experts run per token
            params = params * cfg.moe.top_k // cfg.moe.num_experts
            nbytes = nbytes * cfg.moe.top_k // cfg.moe.num_experts
        active += params
        per_token += nbytes
    cache = 0
    state = 0
    for kind in cfg.attn_types:
        if kind == "mla":
            cache += cfg.mla.cache_dim * elt
        elif kind == "gqa":
            cache += 2 * cfg.gqa.num_kv_heads * cfg.gqa.head_dim * elt
        else:
            k = cfg.kda
            state += k.num_heads * k.head_dim * k.head_dim * 4 + 3 * k.proj_dim * (k.conv_size - 1) * elt
    return Footprint(total, active, embedding, weight_bytes, per_token, cache, state)


def layer_table(cfg: ModelConfig) -> list[tuple[str, str, int, str]]:
    """One row per (attention kind, FFN kind): (attention, ffn, count, layer indices as ranges)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(cfg.attn_types, cfg.mlp_types)):
        groups.setdefault(key, []).append(i)
    rows = []
    for (attn, ffn), layers in groups.items():
        spans, start = [], layers[0]
        for prev, cur in zip(layers, layers[1:] + [None]):
            if cur != prev + 1 if cur is not None else True:
                spans.append(f"{start}" if prev == start else f"{start}-{prev}")
                start = cur
        rows.append((attn, ffn, len(layers), ", ".join(spans)))
    return rows


def human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.3g}P{unit}"
