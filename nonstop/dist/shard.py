"""What one rank holds of a model under a ``Layout``: its config and its slice of every parameter.

Tensor parallelism (T ranks of an attention group, tp rank t):
* KDA: heads [t·H/T, (t+1)·H/T) - rows of q/k/v/g projections, convs, f_b, b, A_log, dt_bias; the
  columns of o_proj (partial sums, reduced after). f_a, g_a and o_norm are small and replicated.
* MLA: heads of q_proj / q_b_proj, kv_b_proj, g_proj (rows) and o_proj (columns); q_a, kv_a and their
  norms are replicated (every rank computes the shared latent and caches it in full).
* GQA: query heads as above; key/value heads split the same way when T divides them, else (T a multiple
  of them) each rank holds the one key/value head its query heads read.
* dense MLP and shared experts: the intermediate dimension (gate/up rows, down columns), in contiguous
  parts whose sizes differ by at most one; biases of the reduced outputs stay on the group's first rank.
* embedding and LM head: the vocabulary, V padded up to T·ceil(V/T) rows (pad rows are zeros).
Expert parallelism: a rank holds the routed experts its ``ExpertPlacement`` slots name (stacked in local
order; a redundant replica is a second copy). Router, correction bias, K3's latent down/up projections
and latent norm, and all residual norms are replicated.

T must divide every head count (KDA heads, MLA heads, GQA query heads), and T and the GQA key/value heads
must divide one or the other; anything else is a ``LayoutError`` naming the config field.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout, LayoutError, split_range
from nonstop.weights.layout import TensorSpec, checkpoint_layout


@dataclass(frozen=True)
class ParamShard:
    """A rank's part of one parameter: the whole tensor (dim None), rows/columns [start, stop) of ``dim``
    with ``pad`` zero rows appended (vocabulary), or the stacked experts ``experts`` (logical ids)."""

    spec: TensorSpec
    dim: int | None = None
    start: int = 0
    stop: int = 0
    pad: int = 0
    experts: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.spec.shape)
        if self.experts is not None:
            shape[0] = len(self.experts)
        elif self.dim is not None:
            shape[self.dim] = self.stop - self.start + self.pad
        return tuple(shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ----------------------------------------------------------------------------- checks and sizes


def check_layout(cfg: ModelConfig, layout: Layout) -> None:
    """LayoutError naming the dimension when ``cfg`` cannot be split by ``layout``."""
    T = layout.tp
    if T == 1:
        return
    checks = []
    if cfg.kda is not None:
        checks.append(("linear_attn_config.num_heads (KDA heads)", cfg.kda.num_heads))
    if cfg.mla is not None:
        checks.append(("num_attention_heads (MLA heads)", cfg.mla.num_heads))
    if cfg.gqa is not None:
        checks.append(("num_attention_heads", cfg.gqa.num_heads))
    for field, n in checks:
        if n % T:
            raise LayoutError(
                f"--tp {T} must divide {field} = {n}: attention heads are split evenly over the ranks of an "
                "attention group"
            )
    if cfg.gqa is not None:
        kv = cfg.gqa.num_kv_heads
        if kv % T and T % kv:
            raise LayoutError(
                f"--tp {T} and num_key_value_heads = {kv}: one must divide the other (key/value heads are split, or "
                "replicated so each rank holds the one its query heads read)"
            )


def vocab_rows(cfg: ModelConfig, layout: Layout) -> int:
    """Vocabulary rows per rank: ceil(V / T) (the last rank's part is padded with zero rows)."""
    return -(-cfg.vocab_size // layout.tp)


def kv_heads(cfg: ModelConfig, layout: Layout, tp_rank: int) -> tuple[int, int]:
    """[first, stop) of the GQA key/value heads rank ``tp_rank`` holds."""
    kv, T = cfg.gqa.num_kv_heads, layout.tp
    if kv % T == 0:
        return tp_rank * kv // T, (tp_rank + 1) * kv // T
    head = tp_rank // (T // kv)
    return head, head + 1


def local_config(cfg: ModelConfig, layout: Layout, rank: int) -> ModelConfig:
    """The config of the model a rank builds: heads / T, its intermediate part, ceil(V / T) vocabulary rows.
    Routed experts keep their config (the rank's experts are a subset, chosen by the placement)."""
    check_layout(cfg, layout)
    T, t = layout.tp, layout.tp_rank(rank)
    if T == 1:
        return cfg
    changes: dict = {"vocab_size": vocab_rows(cfg, layout)}
    if "dense" in cfg.mlp_types:
        lo, hi = split_range(cfg.intermediate_size, T, t)
        changes["intermediate_size"] = hi - lo
    if cfg.kda is not None:
        changes["kda"] = dataclasses.replace(cfg.kda, num_heads=cfg.kda.num_heads // T)
    if cfg.mla is not None:
        changes["mla"] = dataclasses.replace(cfg.mla, num_heads=cfg.mla.num_heads // T)
    if cfg.gqa is not None:
        lo, hi = kv_heads(cfg, layout, t)
        changes["gqa"] = dataclasses.replace(cfg.gqa, num_heads=cfg.gqa.num_heads // T, num_kv_heads=hi - lo)
    return cfg.replace(**changes)


# ----------------------------------------------------------------------------- per-parameter rules

# (module kind, parameter name) -> (dim, unit): rows (dim 0) or columns (dim 1) of `unit` per head
_KDA = {
    "q_proj.weight": 0,
    "k_proj.weight": 0,
    "v_proj.weight": 0,
    "g_proj.weight": 0,
    "q_conv1d": 0,
    "k_conv1d": 0,
    "v_conv1d": 0,
    "f_b_proj.weight": 0,
    "g_b_proj.weight": 0,
    "dt_bias": 0,
    "b_proj.weight": 0,
    "A_log": 0,
    "o_proj.weight": 1,
}
_MLA = {"q_proj.weight": 0, "q_b_proj.weight": 0, "kv_b_proj.weight": 0, "g_proj.weight": 0, "o_proj.weight": 1}
_GQA = {
    "q_proj.weight": 0,
    "q_proj.bias": 0,
    "k_proj.weight": 0,
    "k_proj.bias": 0,
    "v_proj.weight": 0,
    "v_proj.bias": 0,
    "o_proj.weight": 1,
}
_INTER = {"gate_proj.weight": 0, "gate_proj.bias": 0, "up_proj.weight": 0, "up_proj.bias": 0, "down_proj.weight": 1}
_LEADER_ONLY = ("o_proj.bias", "down_proj.bias")  # added once to a reduced output

_LAYER = re.compile(r"^layers\.(\d+)\.(self_attn|mlp)\.(.+)$")


def _head_unit(cfg: ModelConfig, kind: str, name: str) -> int:
    """Rows/columns per head of a head-split parameter."""
    if kind == "kda":
        return 1 if name in ("b_proj.weight", "A_log") else cfg.kda.head_dim
    if kind == "mla":
        m = cfg.mla
        return {
            "kv_b_proj.weight": m.qk_nope_head_dim + m.v_head_dim,
            "g_proj.weight": m.v_head_dim,
            "o_proj.weight": m.v_head_dim,
        }.get(name, m.qk_head_dim)
    return cfg.gqa.head_dim


def param_shard(spec: TensorSpec, cfg: ModelConfig, layout: Layout, rank: int) -> ParamShard:
    """The part of ``spec`` that ``rank`` holds (see the module docstring)."""
    T, t = layout.tp, layout.tp_rank(rank)
    p = spec.param
    if p in ("embed_tokens.weight", "lm_head.weight"):
        if T == 1:
            return ParamShard(spec)
        rows = vocab_rows(cfg, layout)
        lo, hi = min(t * rows, cfg.vocab_size), min((t + 1) * rows, cfg.vocab_size)
        return ParamShard(spec, 0, lo, hi, pad=rows - (hi - lo))
    m = _LAYER.match(p)
    if m is None:
        return ParamShard(spec)
    layer, part, name = int(m.group(1)), m.group(2), m.group(3)
    if part == "mlp" and name.startswith("experts."):
        placement = layout.placement_for(layer, cfg.moe.num_experts)
        return ParamShard(spec, experts=placement.local(layout.ep_rank(rank)))
    if T == 1:
        return ParamShard(spec)
    if part == "self_attn":
        kind = cfg.attn_types[layer]
        table = {"kda": _KDA, "mla": _MLA, "gqa": _GQA}[kind]
        if name not in table:
            return ParamShard(spec)
        dim, unit = table[name], _head_unit(cfg, kind, name)
        if kind == "gqa" and name.startswith(("k_proj", "v_proj")):
            lo, hi = kv_heads(cfg, layout, t)
        else:
            heads = spec.shape[dim] // unit
            lo, hi = t * heads // T, (t + 1) * heads // T
        return ParamShard(spec, dim, lo * unit, hi * unit)
    shared = name.startswith("shared_experts.")
    key = name.removeprefix("shared_experts.")
    if (cfg.mlp_types[layer] == "dense" or shared) and key in _INTER:
        dim = _INTER[key]
        lo, hi = split_range(spec.shape[dim], T, t)
        return ParamShard(spec, dim, lo, hi)
    return ParamShard(spec)


def rank_shards(cfg: ModelConfig, layout: Layout, rank: int, specs: list[TensorSpec] | None = None) -> list[ParamShard]:
    """Every parameter's part on ``rank``, in checkpoint order (``specs``: ``checkpoint_layout(cfg)`` if
    already made)."""
    check_layout(cfg, layout)
    layout.check_rank(rank)
    return [param_shard(spec, cfg, layout, rank) for spec in (specs if specs is not None else checkpoint_layout(cfg))]


def leader_only(param: str) -> bool:
    """A bias of a reduced output: held in full but added only on the attention group's first rank."""
    return param.endswith(_LEADER_ONLY)
