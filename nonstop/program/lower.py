"""Lower a loaded ``CausalLM`` into its decode ``Program``.

Weights that one super-op streams in a single pass (e.g. KDA's [q | k | v | g | b | f_a]) are packed
into one contiguous tensor and the model's parameters are re-pointed to views of it, so the model
keeps working and no weight is stored twice.
"""

from __future__ import annotations

import torch
from torch import nn

from nonstop.config import ModelConfig
from nonstop.model.mla import split_kv_b
from nonstop.model.stack import CausalLM
from nonstop.program.cost import attach_costs
from nonstop.program.ir import BufferSpec, Program, SuperOp


def pack(params: list[nn.Parameter]) -> torch.Tensor:
    """Concatenate parameters along dim 0 into one tensor and make each parameter a view of it."""
    if len(params) == 1:
        return params[0].data
    packed = torch.cat([p.data for p in params], dim=0)
    start = 0
    for p in params:
        n = p.shape[0]
        p.data = packed[start : start + n]
        start += n
    return packed


class _Lowering:
    def __init__(self, model: CausalLM):
        self.model = model
        self.cfg: ModelConfig = model.cfg
        self.ops: list[SuperOp] = []
        self.buffers: dict[str, BufferSpec] = {}
        self.eps = self.cfg.rms_norm_eps

    def buffer(self, name: str, *row_shape: int, dtype: str = "model") -> str:
        self.buffers.setdefault(name, BufferSpec(name, tuple(row_shape), dtype))
        return name

    def op(self, name, kind, layer, reads, writes, weights, **attrs) -> SuperOp:
        op = SuperOp(
            name, kind, layer, tuple(reads), tuple(writes), {k: v for k, v in weights.items() if v is not None}, attrs
        )
        self.ops.append(op)
        return op

    # ------------------------------------------------------------------ sublayer inputs / outputs
    def source(
        self,
        layer_idx: int,
        sublayer: str,
        norm: nn.Module,
        query: torch.Tensor | None,
        n_blocks: int,
        store: int | None,
    ) -> tuple[str, dict]:
        """The buffer a sublayer reads and the norm weights its first op applies (plain residual), or
        an attnres mix op that produces the normalised input (K3)."""
        if not self.cfg.uses_attn_res:
            return "h", {"norm": norm.weight}
        d = self.cfg.hidden_size
        self.buffer("x", d)
        self.op(
            f"L{layer_idx}.{sublayer}_mix",
            "attnres_mix_norm",
            layer_idx,
            ["blocks", "partial"],
            ["x"],
            {"query": query, "norm": norm.weight},
            n_blocks=n_blocks,
            store_block=store,
            eps=self.eps,
        )
        return "x", {}

    def target(self) -> str:
        return "partial" if self.cfg.uses_attn_res else "h"

    # ------------------------------------------------------------------ attention kinds
    def gqa(self, i, attn, src, norm_w):
        g = self.cfg.gqa
        H, Hkv, D = g.num_heads, g.num_kv_heads, g.head_dim
        w_qkv = pack([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
        b_qkv = pack([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]) if g.bias else None
        rot = attn.rotary  # its inv_freq lives on the host (model/rope.py): the kernels need it beside the weights
        q = self.buffer("gqa_q", H * D)
        self.op(
            f"L{i}.gqa_qkv_rope",
            "gqa_qkv_rope",
            i,
            [src],
            [q],
            {"w_qkv": w_qkv, "b_qkv": b_qkv, "inv_freq": rot.inv_freq.to(w_qkv.device), **norm_w},
            heads=H,
            kv_heads=Hkv,
            head_dim=D,
            rope_magnitude=rot.magnitude,
            interleaved=rot.rope.interleaved,
            cache_layer=i,
            eps=self.eps,
        )
        o = self.buffer("attn_out", H * D)
        self.op(f"L{i}.gqa_attn", "gqa_attn", i, [q], [o], {}, heads=H, kv_heads=Hkv, head_dim=D, cache_layer=i)
        return o, attn.o_proj

    def mla(self, i, attn, src, norm_w):
        m = self.cfg.mla
        N, P, R, V, L = m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        first = attn.q_proj if m.q_lora_rank is None else attn.q_a_proj
        parts = [first.weight, attn.kv_a_proj_with_mqa.weight] + ([attn.g_proj.weight] if m.output_gate else [])
        sizes = [p.shape[0] for p in parts]
        writes = [self.buffer("mla_q", sizes[0]), self.buffer("mla_kv", L + R)] + (
            [self.buffer("mla_gate", N * V)] if m.output_gate else []
        )
        self.op(
            f"L{i}.mla_in_proj",
            "mla_in_proj",
            i,
            [src],
            writes,
            {"w_in": pack(parts), **norm_w},
            in_sizes=sizes,
            eps=self.eps,
        )
        w_uk, w_uv = split_kv_b(attn.kv_b_proj.weight, m)
        rope = {}
        if attn.rotary is not None:
            rope = {"inv_freq": attn.rotary.inv_freq.to(first.weight.device)}  # Rotary keeps it on the host
        q_lat, q_pe = self.buffer("mla_q_lat", N * L, dtype="float32"), self.buffer("mla_q_pe", N * R)
        q_weights = (
            {"q_norm": attn.q_a_layernorm.weight, "q_b": attn.q_b_proj.weight} if m.q_lora_rank is not None else {}
        )
        self.op(
            f"L{i}.mla_q_up",
            "mla_q_up",
            i,
            ["mla_q", "mla_kv"],
            [q_lat, q_pe],
            {**q_weights, "kv_norm": attn.kv_a_layernorm.weight, "w_uk": w_uk, **rope},
            heads=N,
            nope=P,
            rope=R,
            kv_lora=L,
            lora_eps=m.lora_norm_eps,
            rope_magnitude=attn.rotary.magnitude if attn.rotary else 1.0,
            interleaved=attn.rotary.rope.interleaved if attn.rotary else False,
            cache_layer=i,
        )
        o = self.buffer("attn_out", N * V)
        reads = [q_lat, q_pe] + (["mla_gate"] if m.output_gate else [])
        self.op(
            f"L{i}.mla_attn",
            "mla_attn",
            i,
            reads,
            [o],
            {"w_uv": w_uv},
            heads=N,
            rope=R,
            kv_lora=L,
            v_dim=V,
            scale=m.softmax_scale,
            gated=m.output_gate,
            cache_layer=i,
        )
        return o, attn.o_proj

    def kda(self, i, attn, src, norm_w):
        k = self.cfg.kda
        C, H, D = k.proj_dim, k.num_heads, k.head_dim
        gate_in = attn.g_proj if k.full_rank_output_gate else attn.g_a_proj
        parts = [
            attn.q_proj.weight,
            attn.k_proj.weight,
            attn.v_proj.weight,
            gate_in.weight,
            attn.b_proj.weight,
            attn.f_a_proj.weight,
        ]
        sizes = [p.shape[0] for p in parts]
        conv = pack([attn.q_conv1d, attn.k_conv1d, attn.v_conv1d]).view(3 * C, k.conv_size)
        names = ["kda_q", "kda_k", "kda_v", "kda_og", "kda_beta", "kda_fa"]
        writes = [self.buffer(n, s) for n, s in zip(names, sizes)]
        self.op(
            f"L{i}.kda_in_proj",
            "kda_in_proj",
            i,
            [src],
            writes,
            {"w_in": pack(parts), "conv": conv, **norm_w},
            in_sizes=sizes,
            channels=C,
            conv_size=k.conv_size,
            cache_layer=i,
            eps=self.eps,
        )
        o = self.buffer("attn_out_kda", C)
        weights = {
            "f_b": attn.f_b_proj.weight,
            "A_log": attn.A_log,
            "dt_bias": attn.dt_bias,
            "o_norm": attn.o_norm.weight,
        }
        if not k.full_rank_output_gate:
            weights["g_b"] = attn.g_b_proj.weight
        self.op(
            f"L{i}.kda_core",
            "kda_core",
            i,
            writes,
            [o],
            weights,
            heads=H,
            head_dim=D,
            lower_bound=k.gate_lower_bound,
            eps=attn.o_norm.eps,
            cache_layer=i,
        )
        return o, attn.o_proj

    # ------------------------------------------------------------------ FFN kinds
    def ffn(self, i, layer, src, norm_w, accumulate=True):
        c = self.cfg
        tgt = self.target()
        act = dict(act=c.hidden_act, beta=c.situ_beta, linear_beta=c.situ_linear_beta)
        if layer.mlp_type == "dense":
            m = layer.mlp
            w = {
                "gate": m.gate_proj.weight,
                "up": m.up_proj.weight,
                "down": m.down_proj.weight,
                "gate_b": m.gate_proj.bias,
                "up_b": m.up_proj.bias,
                "down_b": m.down_proj.bias,
                **norm_w,
            }
            self.op(f"L{i}.mlp", "mlp", i, [src], [tgt], w, accumulate=accumulate, eps=self.eps, **act)
            return
        moe = layer.mlp
        mc = c.moe
        width = mc.latent_size or c.hidden_size
        self.buffer("moe_logits", mc.num_experts, dtype="float32")
        self.buffer("moe_in", width)
        self.buffer("moe_out", width, dtype="float32")
        front = {"router": moe.gate.weight, **norm_w}
        if mc.latent_size:
            front["latent_down"] = moe.routed_expert_down_proj.weight
        writes = ["moe_logits", "moe_in", "moe_out"]  # moe_out = 0: moe_experts accumulates into it (split-K atomics)
        if mc.num_shared_experts:
            se = moe.shared_experts
            front["shared_gate_up"] = pack([se.gate_proj.weight, se.up_proj.weight])
            writes.append(self.buffer("moe_shared_act", mc.shared_intermediate_size))
        self.op(
            f"L{i}.moe_front",
            "moe_front",
            i,
            [src],
            writes,
            front,
            shared_width=mc.shared_intermediate_size,
            eps=self.eps,
            **act,
        )
        experts = {n: t for n, t in moe.experts.named_parameters()} | {n: t for n, t in moe.experts.named_buffers()}
        self.op(
            f"L{i}.moe_experts",
            "moe_experts",
            i,
            ["moe_logits", "moe_in"],
            ["moe_out"],
            {"bias": moe.gate.e_score_correction_bias, **experts},
            moe=mc,
            experts=moe.experts,
            expert_format=mc.expert_format,
            accumulate=True,
            **act,
        )
        tail = {}
        if mc.latent_size:
            tail["latent_up"] = moe.routed_expert_up_proj.weight
            if mc.latent_norm:
                tail["latent_norm"] = moe.routed_expert_norm.weight
        if mc.num_shared_experts:
            tail["shared_down"] = moe.shared_experts.down_proj.weight
        reads = ["moe_out", "moe_in"] + (["moe_shared_act"] if mc.num_shared_experts else [])
        self.op(f"L{i}.moe_tail", "moe_tail", i, reads, [tgt], tail, accumulate=accumulate, eps=self.eps)

    # ------------------------------------------------------------------ the whole step
    def run(self) -> Program:
        c, model = self.cfg, self.model
        d = c.hidden_size
        self.buffer("ids", dtype="int64")
        if c.uses_attn_res:
            self.buffer("partial", d)
            self.buffer("blocks", -(-c.num_hidden_layers // c.attn_res_block_size), d)
        else:
            self.buffer("h", d)
        self.op("embed", "embed", None, ["ids"], [self.target()], {"embed": model.embed_tokens.weight})
        n_blocks = 0
        for i, layer in enumerate(model.layers):
            store = None
            if c.uses_attn_res and i % c.attn_res_block_size == 0:
                store = i // c.attn_res_block_size
            src, norm_w = self.source(
                i, "attn", layer.input_layernorm, layer.attn_query() if c.uses_attn_res else None, n_blocks, store
            )
            if store is not None:
                n_blocks += 1
            o, o_proj = {"gqa": self.gqa, "mla": self.mla, "kda": self.kda}[layer.attn_type](
                i, layer.self_attn, src, norm_w
            )
            self.op(
                f"L{i}.o_proj",
                "linear_residual",
                i,
                [o],
                [self.target()],
                {"w": o_proj.weight, "b": o_proj.bias},
                accumulate=store is None,
            )
            src, norm_w = self.source(
                i, "ffn", layer.post_attention_layernorm, layer.mlp_query() if c.uses_attn_res else None, n_blocks, None
            )
            self.ffn(i, layer, src, norm_w)
        if c.uses_attn_res:
            query = model.output_attn_res_norm.weight * model.output_attn_res_proj.weight[0]
            self.op(
                "final_mix",
                "attnres_mix_norm",
                None,
                ["blocks", "partial"],
                ["x"],
                {"query": query, "norm": model.norm.weight},
                n_blocks=n_blocks,
                store_block=None,
                eps=self.eps,
            )
            head_in, head_norm = "x", {}
        else:
            head_in, head_norm = "h", {"norm": model.norm.weight}
        self.buffer("logits", c.vocab_size, dtype="float32")
        self.op(
            "lm_head", "lm_head", None, [head_in], ["logits"], {"w": model.lm_head_weight, **head_norm}, eps=self.eps
        )
        program = Program(c, self.ops, self.buffers, model.embed_tokens.weight.dtype)
        attach_costs(program)
        return program


def lower(model: CausalLM) -> Program:
    """The decode Program of ``model`` (re-points packed parameters; the model stays valid)."""
    return _Lowering(model).run()
