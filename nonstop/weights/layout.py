"""The checkpoint layout of a model: every parameter, its shape, and its Hugging Face tensor name(s).

This table is the single source of truth for names. The loader reads it (HF name -> parameter),
``nonstop synth`` writes it (random tensors under the same names and shapes), and
``model.build.meta_model`` builds a model without weights from it (``nonstop info``, ``nonstop program``).

Internal parameter paths are the HF names without the family prefix, with three normalisations:
the FFN module is always ``mlp`` (Kimi checkpoints say ``block_sparse_moe``), routed experts are stacked
(``mlp.experts.w1`` = [E, I, K] from E tensors ``experts.{e}.w1.weight``; DeepSeek names gate/up/down
``gate_proj/up_proj/down_proj``), and KDA ``A_log`` is flat [H].
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from nonstop.config import ModelConfig
from nonstop.weights import mxfp4


@dataclass(frozen=True)
class TensorSpec:
    """One model parameter.

    param:    internal path, e.g. ``layers.3.mlp.experts.w1``
    shape:    internal shape
    names:    HF tensor names: one, or one per expert (stacked along dim 0)
    hf_shape: shape of each HF tensor
    kind:     ``float`` (any float dtype, cast to the model dtype) | ``fp32`` (float, kept fp32) | ``u8``
    aliases:  other spellings of ``names`` found in the wild (tried in order when ``names`` are absent)
    init:     how synth fills it: normal | ones | zeros | bias | A_log | dt_bias | mxfp4_packed | mxfp4_scale
    zero_padded: the checkpoint may store this vector longer, zeros past its ``numel`` live values, in any
              shape with one dimension above 1 (K3's release pads A_log's 96 heads to 128): read as the
              live prefix (``loader.check_tensor`` checks the padding is zeros)
    """

    param: str
    shape: tuple[int, ...]
    names: tuple[str, ...]
    hf_shape: tuple[int, ...]
    kind: str = "float"
    aliases: tuple[tuple[str, ...], ...] = ()
    init: str = "normal"
    zero_padded: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype this tensor has in a model of ``model_dtype`` (``kind`` fp32 / u8 keep theirs)."""
        return {"float": model_dtype, "fp32": torch.float32, "u8": torch.uint8}[self.kind]


class _Builder:
    def __init__(self):
        self.specs: list[TensorSpec] = []

    def add(self, param, shape, name, kind="float", init="normal", aliases=(), hf_shape=None, zero_padded=False):
        shape = tuple(shape)
        aliases = tuple((a,) for a in aliases)
        self.specs.append(TensorSpec(param, shape, (name,), tuple(hf_shape or shape), kind, aliases, init, zero_padded))

    def add_stacked(self, param, count, shape, names, kind="float", init="normal", aliases=()):
        self.specs.append(TensorSpec(param, (count, *shape), tuple(names), tuple(shape), kind, tuple(aliases), init))


def _linear(b: _Builder, param: str, name: str, out_f: int, in_f: int, bias: bool = False, aliases=()):
    b.add(f"{param}.weight", (out_f, in_f), f"{name}.weight", aliases=[f"{a}.weight" for a in aliases])
    if bias:
        b.add(f"{param}.bias", (out_f,), f"{name}.bias", init="zeros", aliases=[f"{a}.bias" for a in aliases])


def _norm(b: _Builder, param: str, name: str, dim: int, aliases=()):
    b.add(f"{param}.weight", (dim,), f"{name}.weight", init="ones", aliases=[f"{a}.weight" for a in aliases])


def _gqa(b, cfg, p, n):
    g, d = cfg.gqa, cfg.hidden_size
    _linear(b, f"{p}.q_proj", f"{n}.q_proj", g.num_heads * g.head_dim, d, g.bias)
    _linear(b, f"{p}.k_proj", f"{n}.k_proj", g.num_kv_heads * g.head_dim, d, g.bias)
    _linear(b, f"{p}.v_proj", f"{n}.v_proj", g.num_kv_heads * g.head_dim, d, g.bias)
    _linear(b, f"{p}.o_proj", f"{n}.o_proj", d, g.num_heads * g.head_dim, g.out_bias)


def _mla(b, cfg, p, n):
    m, d = cfg.mla, cfg.hidden_size
    q_out = m.num_heads * m.qk_head_dim
    if m.q_lora_rank is None:
        _linear(b, f"{p}.q_proj", f"{n}.q_proj", q_out, d)
    else:
        _linear(b, f"{p}.q_a_proj", f"{n}.q_a_proj", m.q_lora_rank, d)
        _norm(b, f"{p}.q_a_layernorm", f"{n}.q_a_layernorm", m.q_lora_rank)
        _linear(b, f"{p}.q_b_proj", f"{n}.q_b_proj", q_out, m.q_lora_rank)
    _linear(b, f"{p}.kv_a_proj_with_mqa", f"{n}.kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, d)
    _norm(b, f"{p}.kv_a_layernorm", f"{n}.kv_a_layernorm", m.kv_lora_rank)
    _linear(b, f"{p}.kv_b_proj", f"{n}.kv_b_proj", m.num_heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
    _linear(b, f"{p}.o_proj", f"{n}.o_proj", d, m.num_heads * m.v_head_dim)
    if m.output_gate:
        _linear(b, f"{p}.g_proj", f"{n}.g_proj", m.num_heads * m.v_head_dim, d)


def _kda(b, cfg, p, n):
    k, d = cfg.kda, cfg.hidden_size
    C, D, H = k.proj_dim, k.head_dim, k.num_heads
    for x in "qkv":
        _linear(b, f"{p}.{x}_proj", f"{n}.{x}_proj", C, d)
    for x in "qkv":
        b.add(f"{p}.{x}_conv1d", (C, 1, k.conv_size), f"{n}.{x}_conv1d.weight")
    _linear(b, f"{p}.f_a_proj", f"{n}.f_a_proj", D, d)
    _linear(b, f"{p}.f_b_proj", f"{n}.f_b_proj", C, D)
    _linear(b, f"{p}.b_proj", f"{n}.b_proj", H, d)
    a_log_disk = (H,) if cfg.family == "kimi_k3" else (1, 1, H, 1)
    b.add(f"{p}.A_log", (H,), f"{n}.A_log", kind="fp32", init="A_log", hf_shape=a_log_disk, zero_padded=True)
    b.add(f"{p}.dt_bias", (C,), f"{n}.dt_bias", kind="fp32", init="dt_bias")
    if k.full_rank_output_gate:
        _linear(b, f"{p}.g_proj", f"{n}.g_proj", C, d)
    else:
        _linear(b, f"{p}.g_a_proj", f"{n}.g_a_proj", D, d)
        _linear(b, f"{p}.g_b_proj", f"{n}.g_b_proj", C, D)
    _norm(b, f"{p}.o_norm", f"{n}.o_norm", D)
    _linear(b, f"{p}.o_proj", f"{n}.o_proj", d, C)


def _dense_mlp(b, cfg, p, n, alias_n=None):
    d, inter = cfg.hidden_size, cfg.intermediate_size
    for proj, (o, i) in (("gate_proj", (inter, d)), ("up_proj", (inter, d)), ("down_proj", (d, inter))):
        aliases = [f"{alias_n}.{proj}"] if alias_n else []
        _linear(b, f"{p}.{proj}", f"{n}.{proj}", o, i, cfg.mlp_bias, aliases)


_EXPERT_NAMES = {
    "kimi": {"w1": "w1", "w3": "w3", "w2": "w2"},
    "deepseek": {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"},
}


def _moe(b, cfg, p, n, style):
    m, d = cfg.moe, cfg.hidden_size
    E, I = m.num_experts, m.intermediate_size
    width = m.latent_size or d
    b.add(f"{p}.gate.weight", (E, d), f"{n}.gate.weight", kind="fp32")
    b.add(f"{p}.gate.e_score_correction_bias", (E,), f"{n}.gate.e_score_correction_bias", kind="fp32", init="bias")
    if m.latent_size:
        _linear(b, f"{p}.routed_expert_down_proj", f"{n}.routed_expert_down_proj", width, d)
        if m.latent_norm:
            _norm(b, f"{p}.routed_expert_norm", f"{n}.routed_expert_norm", width)
        _linear(b, f"{p}.routed_expert_up_proj", f"{n}.routed_expert_up_proj", d, width)
    names = _EXPERT_NAMES[style]
    for w, (out_f, in_f) in (("w1", (I, width)), ("w3", (I, width)), ("w2", (width, I))):
        base = [f"{n}.experts.{e}.{names[w]}" for e in range(E)]
        if m.expert_format == "mxfp4":
            b.add_stacked(
                f"{p}.experts.{w}_packed",
                E,
                mxfp4.packed_shape(out_f, in_f),
                [f"{x}.weight_packed" for x in base],
                kind="u8",
                init="mxfp4_packed",
            )
            b.add_stacked(
                f"{p}.experts.{w}_scale",
                E,
                mxfp4.scale_shape(out_f, in_f),
                [f"{x}.weight_scale" for x in base],
                kind="u8",
                init="mxfp4_scale",
            )
        else:
            b.add_stacked(f"{p}.experts.{w}", E, (out_f, in_f), [f"{x}.weight" for x in base])
    if m.num_shared_experts:
        S = m.shared_intermediate_size
        for proj, (o, i) in (("gate_proj", (S, d)), ("up_proj", (S, d)), ("down_proj", (d, S))):
            _linear(b, f"{p}.shared_experts.{proj}", f"{n}.shared_experts.{proj}", o, i)


def checkpoint_layout(cfg: ModelConfig) -> list[TensorSpec]:
    """Every parameter of ``cfg`` with its HF name(s), in checkpoint order (a new list of the frozen specs,
    made once per config: K3's 93 layers x 896 experts take a fifth of a second, and the planner and the
    sharded loader ask again for every layout and rank)."""
    return list(_checkpoint_layout(cfg))


@functools.lru_cache(maxsize=8)
def _checkpoint_layout(cfg: ModelConfig) -> tuple[TensorSpec, ...]:
    b = _Builder()
    P = cfg.weight_prefix
    d = cfg.hidden_size
    kimi = cfg.family in ("kimi_linear", "kimi_k3")
    b.add("embed_tokens.weight", (cfg.vocab_size, d), f"{P}embed_tokens.weight")
    for i in range(cfg.num_hidden_layers):
        p, n = f"layers.{i}", f"{P}layers.{i}"
        _norm(b, f"{p}.input_layernorm", f"{n}.input_layernorm", d)
        _norm(b, f"{p}.post_attention_layernorm", f"{n}.post_attention_layernorm", d)
        if cfg.uses_attn_res:
            for part in ("self_attention_res", "mlp_res"):
                _norm(b, f"{p}.{part}_norm", f"{n}.{part}_norm", d)
                _linear(b, f"{p}.{part}_proj", f"{n}.{part}_proj", 1, d)
        {"gqa": _gqa, "mla": _mla, "kda": _kda}[cfg.attn_types[i]](b, cfg, f"{p}.self_attn", f"{n}.self_attn")
        if cfg.mlp_types[i] == "dense":
            # Real Kimi checkpoints name the dense layer `mlp.`; transformers saves it as `block_sparse_moe.`.
            _dense_mlp(b, cfg, f"{p}.mlp", f"{n}.mlp", alias_n=f"{n}.block_sparse_moe" if kimi else None)
        else:
            _moe(b, cfg, f"{p}.mlp", f"{n}.block_sparse_moe" if kimi else f"{n}.mlp", "kimi" if kimi else "deepseek")
    _norm(b, "norm", f"{P}norm", d)
    if cfg.uses_attn_res:
        _norm(b, "output_attn_res_norm", f"{P}output_attn_res_norm", d)
        _linear(b, "output_attn_res_proj", f"{P}output_attn_res_proj", 1, d)
    if not cfg.tie_word_embeddings:
        b.add("lm_head.weight", (cfg.vocab_size, d), cfg.lm_head_name)
    return tuple(b.specs)


def ignored_tensor(cfg: ModelConfig, name: str) -> bool:
    """Tensors a checkpoint may hold that plain decoding does not use: rotary caches, multi-token
    prediction layers past ``num_hidden_layers``, K3's vision tower / projector, and a tied model's copy
    of its embedding as LM head (only a copy: the loader's ``check_tied_head`` refuses one of another shape,
    from the headers, or other values, when it loads the weights)."""
    if name.endswith("rotary_emb.inv_freq") or name.startswith(
        ("vision_tower.", "mm_projector.", "multi_modal_projector.")
    ):
        return True
    if cfg.tie_word_embeddings and name == cfg.lm_head_name:
        return True  # some tied checkpoints still carry a copy of the embedding (checked by the loader)
    m = re.match(rf"^{re.escape(cfg.weight_prefix)}layers\.(\d+)\.", name)
    return bool(m) and int(m.group(1)) >= cfg.num_hidden_layers and _declared_extra_layers(cfg) > 0


def _declared_extra_layers(cfg: ModelConfig) -> int:
    text = cfg.hf.get("text_config", cfg.hf) if cfg.family == "kimi_k3" else cfg.hf
    return (
        int(text.get("num_nextn_predict_layers") or 0)
        + int(text.get("num_hidden_layers", cfg.num_hidden_layers))
        - cfg.num_hidden_layers
    )
