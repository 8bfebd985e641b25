"""The model side of a plan: per super-op traffic and work, from the engine's own Program costs.

The model is built on the meta device (shapes only, no weights) and lowered by ``program/lower.py``,
or for a parallel layout by ``dist/program.py`` (a rank's Program: its part of every weight plus the
collective super-ops). Each op's ``cost(rows, context, sequences)`` (``program/cost.py``) is linear in
its arguments, so a few evaluations give per-op coefficients (one decode step, one rank):

    bytes(op) = W_op + r·a_op + s·S_op + s·L·c_op          (weights, activations, state, cache)
    flops(op) = r·f_op + r·L·g_op

r = rows (sequences × tokens per sequence), s = sequences, L = cached tokens per sequence. A sequence's
cached keys are read once a step however many of its rows (verified drafts) attend to them; every row
computes over them. Weights are
re-priced in the serving precision (``Precision``): dense matrices at ``dense`` bytes/param (the embedding
and the LM head in bf16 beside a quantised format), routed experts at ``experts`` bytes/param (K3's MXFP4
as packed: 4.25 bits/param incl. its E8M0 scales). A tied LM head is streamed but held once, as the embedding.
Routed experts are kept apart (``ExpertShape``): which of them a step touches depends on the batch
and the layout, not on the op alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field

import torch

from nonstop.config import ModelConfig
from nonstop.config_parse import quantization_config

# bytes per parameter of each serving format (block scales included: fp8 128x128 blocks of fp32 scales,
# MXFP4 one E8M0 byte per 32 values, NVFP4 one fp8 byte per 16, int4 (compressed-tensors pack-quantized,
# Kimi K2 Thinking / K2.5 experts) one bf16 scale per 32)
FORMAT_BYTES = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp8": 1.0 + 4 / (128 * 128),
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "int4": 0.5 + 2 / 32,
}
# the tensor-core dtype each format computes in: int4 is W4A16 (dequantised to bf16 in the GEMM)
FORMAT_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4", "int4": "bf16"}
FORMAT_ALIASES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "bf16",
    "fp16": "bf16",
    "fp4": "mxfp4",
    "w4a16": "int4",
}
COLLECTIVE_KINDS = ("tp_all_reduce", "vocab_gather")  # super-ops that are only communication
# K3's latent projections: nonstop.dist replicates them on every tensor-parallel rank; vLLM / SGLang /
# the TPU megakernel split them (column-parallel down, row-parallel up), which ``sharding="production"``
# models by dividing their bytes by tp
PRODUCTION_SPLIT = ("latent_down", "latent_up")
EXPERT_KINDS = ("moe_experts", "moe_ep")
CONTEXT_PROBE = 1024


class PlanError(ValueError):
    """A request the planner cannot answer (shown as one line)."""


def serving_format(name: str) -> str:
    key = FORMAT_ALIASES.get(name.lower(), name.lower())
    if key not in FORMAT_BYTES:
        raise PlanError(f"unknown weight format {name!r}; choose one of: {', '.join(FORMAT_BYTES)}")
    return key


# the attention block's ops (projections, cores, o_proj): some checkpoints keep them wider than the rest
# (nvidia's NVFP4 DeepSeek-R1 and Kimi K3 leave self_attn in bf16); ``Precision.attention`` prices them
ATTENTION_KINDS = frozenset(
    {"gqa_qkv_rope", "gqa_attn", "mla_in_proj", "mla_q_up", "mla_attn", "kda_in_proj", "kda_core", "linear_residual"}
)

# the token embedding and the LM head: quantised releases keep them in bf16 (DeepSeek-V3 / Kimi K2's fp8
# checkpoints build both in the default dtype; compressed-tensors and modelopt exports list lm_head among the
# modules they leave unquantised, and no quantization_config the planner reads names them quantised), so
# beside a quantised dense format they are priced in bf16; beside fp32 or bf16 they are as wide as the rest
VOCAB_KINDS = frozenset({"embed", "embed_shard", "lm_head"})
UNQUANTISED = ("fp32", "bf16")


@dataclass(frozen=True)
class Precision:
    """Serving formats: dense (non-expert) matrices, routed experts, attention cache; ``attention``
    (None: as ``dense``) for the attention block's matrices when the checkpoint stores them apart."""

    dense: str = "bf16"
    experts: str = "bf16"
    cache: str = "bf16"
    attention: str | None = None

    @staticmethod
    def released(
        cfg: ModelConfig,
        dense: str | None = None,
        experts: str | None = None,
        cache: str | None = None,
        attention: str | None = None,
    ) -> Precision:
        """The checkpoint's own formats unless overridden: ``quantization_config`` of the config (K3:
        MXFP4 experts, bf16 rest; Kimi K2 Thinking / K2.5: int4 experts, bf16 rest; fp8 checkpoints such as
        Kimi K2 / DeepSeek-V3: fp8 but the embedding and the head (``of``), also when a preset omits the
        config: ``RELEASED_FP8``; a checkpoint directory's config is read as it is)."""
        quant = quantization_config(cfg.hf or {})
        quantised = quantised_experts(cfg)
        base_dense, base_experts = "bf16", quantised or "bf16"
        if (
            quant.get("quant_method") == "fp8"
            or quant.get("fmt") == "e4m3"
            or cfg.family in RELEASED_FP8
            and quantised is None
            and _is_preset(cfg)
        ):
            base_dense = base_experts = "fp8"
        return Precision(
            serving_format(dense or base_dense),
            serving_format(experts or base_experts),
            serving_format(cache or "bf16"),
            serving_format(attention) if attention else None,
        )

    def of(self, kind: str) -> str:
        """The format of a non-expert op's matrices: the embedding and the LM head stay bf16 beside a quantised
        ``dense`` format (``VOCAB_KINDS``), the attention block is in ``attention`` where given."""
        if kind in VOCAB_KINDS:
            return self.dense if self.dense in UNQUANTISED else "bf16"
        return self.attention if self.attention and kind in ATTENTION_KINDS else self.dense


def quantised_experts(cfg: ModelConfig) -> str | None:
    """The serving format the checkpoint quantises its routed experts to (mxfp4, int4), or None."""
    fmt = cfg.moe.expert_format if cfg.moe else None
    return fmt if fmt in FORMAT_BYTES else None


# families whose released checkpoints are fp8 block-scaled even when the bundled preset omits the
# quantization_config (moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V3: weight_block_size 128x128);
# Kimi K2 parses as the deepseek_v3 family
RELEASED_FP8 = frozenset({"deepseek_v3"})


@functools.cache
def _preset_configs() -> tuple[str, ...]:
    """The config.json of every preset, as canonical JSON text."""
    from nonstop.config import preset_hf_dict, preset_names

    return tuple(json.dumps(preset_hf_dict(name), sort_keys=True) for name in preset_names())


def _is_preset(cfg: ModelConfig) -> bool:
    """Whether ``cfg`` is a preset's config (a release's shapes, also cut to fewer layers), not one read from a
    checkpoint directory or a file: ``RELEASED_FP8`` prices the release, never a directory's own weights."""
    return json.dumps(cfg.hf, sort_keys=True) in _preset_configs()


@dataclass(frozen=True)
class ExpertShape:
    """The routed experts of one MoE layer."""

    num_experts: int  # in the model
    local: int  # held by this rank (all of them on one device)
    top_k: int
    bytes_each: float  # one expert's weights in the serving format
    params_each: int


@dataclass(frozen=True)
class OpShape:
    """One super-op's per-step coefficients on its rank; see the module docstring."""

    name: str
    kind: str
    layer: int | None
    weight_bytes: float  # W_op, serving format (routed experts: only the router bias; see ``expert``)
    engine_replicated_bytes: float  # part of W_op ``nonstop.dist`` keeps whole that production stacks split
    held_bytes: float  # weights the rank keeps (W_op, plus the table of a gathered embedding; a tied head: its norm)
    act_bytes_per_row: float  # a_op
    state_bytes_per_seq: float  # S_op (KDA recurrent + conv state, read and written)
    cache_bytes_per_seq_ctx: float  # c_op (attention cache read per sequence and cached token)
    flops_per_row: float  # f_op
    flops_per_row_ctx: float  # g_op
    dtype: str  # tensor-core dtype of its weights ("bf16", "fp8", "fp4", "fp32")
    expert: ExpertShape | None = None


@dataclass(frozen=True)
class Workload:
    """A model (or one rank's part of it) as the planner sees it, with the Program it came from."""

    name: str
    cfg: ModelConfig
    precision: Precision
    ops: tuple[OpShape, ...]
    hidden: int
    program: object = field(default=None, compare=False, repr=False)

    @property
    def moe_ops(self) -> list[OpShape]:
        return [o for o in self.ops if o.expert is not None]

    def total_weight_bytes(self) -> float:
        """All weights held (every local expert) in the serving formats."""
        return sum(o.held_bytes + (o.expert.bytes_each * o.expert.local if o.expert else 0) for o in self.ops)

    def active_weight_bytes(self) -> float:
        """Weights one token reads at batch 1 (top-k experts per MoE layer)."""
        return sum(o.weight_bytes + (o.expert.bytes_each * o.expert.top_k if o.expert else 0) for o in self.ops)

    def state_bytes_per_seq(self) -> float:
        """Resident state per sequence (KDA recurrent + conv windows; read and written each step: / 2)."""
        return sum(o.state_bytes_per_seq for o in self.ops) / 2

    def cache_bytes_per_token(self) -> float:
        """Attention cache per cached token (MLA latent / GQA K and V), all layers."""
        return sum(o.cache_bytes_per_seq_ctx for o in self.ops)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _matrix_params(op) -> int:
    return sum(t.numel() for n, t in op.weights.items() if t.dim() >= 2 and n not in ("embed", "conv"))


def _tensor_bytes(op, precision: Precision) -> dict[str, float]:
    """The serving bytes of each of a non-expert op's weights: matrices in ``precision.of(kind)``, vectors as
    stored; the router stays bf16 (fp32 logits from a bf16 matrix)."""
    per_param = FORMAT_BYTES[precision.of(op.kind)]
    out = {}
    for name, t in op.weights.items():
        matrix = t.dim() >= 2 and t.is_floating_point() and name not in ("conv", "router")
        if matrix:
            out[name] = t.numel() * per_param
        elif name == "router":  # loaded in fp32 for exact routing; served and streamed in bf16
            out[name] = t.numel() * FORMAT_BYTES["bf16"]
        else:
            out[name] = float(_nbytes(t))
    return out


def _weight_bytes(op, precision: Precision, held_before: set[int]) -> tuple[float, float, float]:
    """(streamed bytes, the PRODUCTION_SPLIT part, bytes held beyond ``held_before``) of a non-expert op's
    weights. ``held_before`` holds the ids of the tensors earlier ops hold and gains this op's: a tied LM head
    (``tie_word_embeddings``: the embedding's own tensor) is streamed in full but holds nothing more."""
    sizes = _tensor_bytes(op, precision)
    held = sum(nbytes for name, nbytes in sizes.items() if id(op.weights[name]) not in held_before)
    held_before.update(id(t) for t in op.weights.values())
    split = sum(nbytes for name, nbytes in sizes.items() if name in PRODUCTION_SPLIT)
    return sum(sizes.values()), split, held


def _expert_shape(op, precision: Precision) -> ExpertShape:
    mc = op.attrs["moe"]
    local = op.attrs.get("local_experts", mc.num_experts)
    tensors = {n: t for n, t in op.weights.items() if n != "bias"}
    params = sum(
        2 * t.numel() if n.endswith("_packed") else t.numel() for n, t in tensors.items() if not n.endswith("_scale")
    ) // max(local, 1)
    return ExpertShape(mc.num_experts, local, mc.top_k, params * FORMAT_BYTES[precision.experts], params)


def _coefficients(op, program, precision: Precision) -> dict:
    """Linear coefficients of ``op.cost`` (reads + writes, FLOPs) in rows, sequences and context."""
    if op.kind in EXPERT_KINDS:  # activations only; expert weights and FLOPs depend on the routing
        elt = {"model": program.dtype.itemsize, "float32": 4, "int64": 8}
        act = sum(program.buffers[b].row_numel * elt[program.buffers[b].dtype] for b in op.reads + op.writes)
        return {
            "act_bytes_per_row": act,
            "state_bytes_per_seq": 0.0,
            "cache_bytes_per_seq_ctx": 0.0,
            "flops_per_row": 0.0,
            "flops_per_row_ctx": 0.0,
        }

    def traffic(r, ctx, s):
        c = op.cost(r, ctx, s)
        return c.bytes_read + c.bytes_written - c.weight_bytes, c.flops

    base_b, base_f = traffic(1, 0, 0)
    two_b, two_f = traffic(2, 0, 0)
    seq_b, _ = traffic(1, 0, 1)
    _, ctx_f = traffic(1, CONTEXT_PROBE, 0)  # FLOPs: every row attends over the context
    ctx_b, _ = traffic(1, CONTEXT_PROBE, 1)  # bytes: each sequence's cached keys are read once
    cache_scale = FORMAT_BYTES[precision.cache] / 2 if op.kind in ("mla_attn", "gqa_attn") else 1.0
    return {
        "act_bytes_per_row": two_b - base_b,
        "state_bytes_per_seq": seq_b - base_b,
        "cache_bytes_per_seq_ctx": (ctx_b - seq_b) / CONTEXT_PROBE * cache_scale,
        "flops_per_row": two_f - base_f,
        "flops_per_row_ctx": (ctx_f - base_f) / CONTEXT_PROBE,
    }


@functools.lru_cache(maxsize=8)
def _program(cfg_text: str):
    from nonstop.model.build import meta_model
    from nonstop.program.lower import lower

    return lower(meta_model(shapes_from_json(cfg_text), torch.bfloat16))


def program_for(cfg: ModelConfig):
    """The bf16 decode Program of ``cfg``, lowered from a meta-device model (cached per config)."""
    return _program(cfg_json(cfg))


def cfg_json(cfg: ModelConfig) -> str:
    """``cfg`` as canonical config.json text: the planner's cache key for a model (``shapes_from_json`` reads it)."""
    return json.dumps(cfg.to_hf_dict(), sort_keys=True)


def shapes_from_json(cfg_text: str) -> ModelConfig:
    """The buildable config (``shapes_config``) of a config.json text (the planner's cache keys)."""
    return shapes_config(ModelConfig.from_hf_dict(json.loads(cfg_text)))


def shapes_config(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with routed experts the engine can build: int4 experts (which it does not run) become their
    dense twin, the same matrices and parameter count; ``Precision`` prices them as int4."""
    if cfg.moe and cfg.moe.expert_format == "int4":
        return cfg.replace(moe=dataclasses.replace(cfg.moe, expert_format="dense"))
    return cfg


def build_workload(cfg: ModelConfig, name: str, precision: Precision | None = None, program=None) -> Workload:
    """The workload of ``program`` (default: the single-device Program of ``cfg``)."""
    precision = precision or Precision.released(cfg)
    program = program if program is not None else program_for(cfg)
    cfg = shapes_config(cfg)
    ops, held_before = [], set()
    for op in program.ops:
        coeff = _coefficients(op, program, precision)
        if op.kind in EXPERT_KINDS:
            ex = _expert_shape(op, precision)
            bias = _nbytes(op.weights["bias"])
            ops.append(
                OpShape(
                    op.name,
                    op.kind,
                    op.layer,
                    bias,
                    0.0,
                    bias,
                    dtype=FORMAT_DTYPE[precision.experts],
                    expert=ex,
                    **coeff,
                )
            )
            continue
        weight, split, held = _weight_bytes(op, precision, held_before)
        if op.kind in ("embed", "embed_shard"):  # a gather: one row per token, already in act_bytes_per_row
            weight = 0.0
            coeff["act_bytes_per_row"] = cfg.hidden_size * FORMAT_BYTES["bf16"]
        dtype = FORMAT_DTYPE[precision.of(op.kind)]
        ops.append(OpShape(op.name, op.kind, op.layer, weight, split, held, dtype=dtype, **coeff))
    return Workload(name, cfg, precision, tuple(ops), cfg.hidden_size, program)
