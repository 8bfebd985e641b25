"""Plain-torch twins of every super-op kind: the spec each Triton kernel must equal.

Each twin is ``fn(op, env)``: it reads ``env.buf[name]`` for ``op.reads``, writes ``op.writes``, and
updates the caches of ``env.cache`` for the rows of ``env.batch``. All math comes from
``nonstop/model/`` (one source for each equation); the twins only re-cut it into super-ops.
Chained through a Program they reproduce ``CausalLM.forward`` for the same rows.

Row layout: R = B·T rows, row r is token t = r % T of sequence b = r // T (slot ``batch.slots[b]``,
position ``batch.start[b] + t``).

Speculative verification (``batch.keep_states``): the KDA twins also keep the conv window and the
recurrent state after every token (``KDAState.keep_conv`` / ``keep_recurrent``); ``ModelCache.commit``
makes the accepted one current. Under ``row_exact()`` (``model/rows.py``) every row computes as it
would in a one-token step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.activations import glu
from nonstop.model.attention import gqa_attention
from nonstop.model.attnres import attn_res_mix
from nonstop.model.kda import conv_windows, kda_gate_lower_bound, kda_gate_softplus, kda_recurrent, short_conv
from nonstop.model.linear import linear
from nonstop.model.mla import absorb_query, latent_attention, unabsorb_output
from nonstop.model.moe import routed_experts, router_logits, select_experts
from nonstop.model.norms import gated_rms_norm, l2_norm, rms_norm
from nonstop.model.rope import apply_rope, rope_cos_sin
from nonstop.model.rows import rowwise
from nonstop.model.sampling import filter_logits, gumbel_max
from nonstop.program.ir import SuperOp


@dataclass
class StepEnv:
    buf: dict[str, torch.Tensor]
    cache: ModelCache
    batch: StepBatch

    @property
    def B(self) -> int:
        return self.batch.slots.shape[0]

    @property
    def T(self) -> int:
        return self.batch.T

    def seq(self, x: torch.Tensor) -> torch.Tensor:
        """[R, ...] -> [B, T, ...]"""
        return x.view(self.B, self.T, *x.shape[1:])


# ----------------------------------------------------------------------------- helpers


def op_input(op: SuperOp, env: StepEnv) -> torch.Tensor:
    """The op's input row vectors [R, d], RMS-normalised here when the op carries a norm weight."""
    x = env.buf[op.reads[0]]
    if "norm" in op.weights:
        x = rms_norm(x, op.weights["norm"], op.attrs["eps"])
    return x


def emit(op: SuperOp, env: StepEnv, y: torch.Tensor) -> None:
    """Write y into the op's residual target ``writes[0]``: ``+= y`` when accumulating, else ``= y``."""
    out = env.buf[op.writes[0]]
    if op.attrs.get("accumulate", False):
        out.copy_(out + y.to(out.dtype))
    else:
        out.copy_(y)


def split(y: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(y, sizes, dim=-1))


def _fresh(env: StepEnv) -> torch.Tensor:
    """[B] True where a sequence starts in this step (its recurrent state must start from zeros)."""
    return env.batch.start == 0


# ----------------------------------------------------------------------------- embedding, residuals, head


def embed(op, env):
    env.buf[op.writes[0]].copy_(F.embedding(env.buf["ids"], op.weights["embed"]))


def attnres_mix_norm(op, env):
    """x = RMSNorm(Mix(blocks[:n] + [partial])); then optionally blocks[store] = partial."""
    blocks, partial = env.buf["blocks"], env.buf["partial"]
    n = op.attrs["n_blocks"]
    mixed = attn_res_mix([blocks[:, j] for j in range(n)] + [partial], op.weights["query"], op.attrs["eps"])
    store = op.attrs.get("store_block")
    if store is not None:
        blocks[:, store] = partial
    env.buf[op.writes[0]].copy_(rms_norm(mixed, op.weights["norm"], op.attrs["eps"]))


def linear_residual(op, env):
    """target (+)= W a (+ b)."""
    emit(op, env, linear(env.buf[op.reads[0]], op.weights["w"], op.weights.get("b")))


def lm_head(op, env):
    env.buf[op.writes[0]].copy_(linear(op_input(op, env), op.weights["w"]).float())


def mlp(op, env):
    """target (+)= W_down act(W_gate x, W_up x) on the normalised input."""
    x = op_input(op, env)
    a = op.attrs
    h = glu(
        linear(x, op.weights["gate"], op.weights.get("gate_b")),
        linear(x, op.weights["up"], op.weights.get("up_b")),
        a["act"],
        a["beta"],
        a["linear_beta"],
    )
    emit(op, env, linear(h, op.weights["down"], op.weights.get("down_b")))


# ----------------------------------------------------------------------------- GQA


def gqa_qkv_rope(op, env):
    """q, k, v = W_qkv x; RoPE on q, k; append k, v to the cache; write q [R, H·D]."""
    a = op.attrs
    H, Hkv, D = a["heads"], a["kv_heads"], a["head_dim"]
    q, k, v = split(linear(op_input(op, env), op.weights["w_qkv"], op.weights.get("b_qkv")), [H * D, Hkv * D, Hkv * D])
    cos, sin = rope_cos_sin(env.batch.positions, op.weights["inv_freq"], a["rope_magnitude"])
    q = apply_rope(env.seq(q).view(env.B, env.T, H, D), cos[:, :, None], sin[:, :, None], a["interleaved"])
    k = apply_rope(env.seq(k).view(env.B, env.T, Hkv, D), cos[:, :, None], sin[:, :, None], a["interleaved"])
    env.cache.layers[a["cache_layer"]].write(env.batch, k=k, v=env.seq(v).view(env.B, env.T, Hkv, D))
    env.buf[op.writes[0]].copy_(q.reshape(-1, H * D))


def gqa_attn(op, env):
    a = op.attrs
    cache = env.cache.layers[a["cache_layer"]]
    k, v = cache.read(env.batch, "k"), cache.read(env.batch, "v")
    q = env.seq(env.buf[op.reads[0]]).view(env.B, env.T, a["heads"], a["head_dim"])
    o = gqa_attention(q, k, v, env.batch.attention_mask(k.shape[1]), a["head_dim"] ** -0.5)
    env.buf[op.writes[0]].copy_(o.reshape(-1, a["heads"] * a["head_dim"]))


# ----------------------------------------------------------------------------- MLA


def mla_in_proj(op, env):
    """One pass over [q_a | kv_a | g] (or [q | kv_a | g]): writes the q input, raw [c_kv | k_pe], gate logits."""
    sizes = op.attrs["in_sizes"]
    parts = split(linear(op_input(op, env), op.weights["w_in"]), sizes)
    for name, part in zip(op.writes, parts):
        env.buf[name].copy_(part)


def mla_q_up(op, env):
    """q = W_qb RMSNorm(c_q) (q-LoRA) or q as given; c_kv = RMSNorm(c_kv); RoPE on q_pe, k_pe if enabled;
    append [c_kv | k_pe] to the cache; absorb W_UK: write q_lat [R, N·Lkv] (fp32) and q_pe [R, N·R]."""
    a = op.attrs
    N, P, Rr, L = a["heads"], a["nope"], a["rope"], a["kv_lora"]
    q_in, kv = env.buf[op.reads[0]], env.buf[op.reads[1]]
    q = linear(rms_norm(q_in, op.weights["q_norm"], a["lora_eps"]), op.weights["q_b"]) if "q_b" in op.weights else q_in
    q = env.seq(q).view(env.B, env.T, N, P + Rr)
    q_nope, q_pe = q[..., :P], q[..., P:]
    latent = rms_norm(kv[:, :L], op.weights["kv_norm"], a["lora_eps"])
    k_pe = kv[:, L:]
    latent, k_pe = env.seq(latent), env.seq(k_pe)
    if "inv_freq" in op.weights:
        cos, sin = rope_cos_sin(env.batch.positions, op.weights["inv_freq"], a["rope_magnitude"])
        q_pe = apply_rope(q_pe, cos[:, :, None], sin[:, :, None], a["interleaved"])
        k_pe = apply_rope(k_pe, cos, sin, a["interleaved"])
    env.cache.layers[a["cache_layer"]].write(env.batch, latent=torch.cat([latent, k_pe], dim=-1))
    env.buf[op.writes[0]].copy_(absorb_query(q_nope, op.weights["w_uk"]).reshape(-1, N * L))
    env.buf[op.writes[1]].copy_(q_pe.reshape(-1, N * Rr))


def mla_attn(op, env):
    """Attention of the absorbed queries over the latent cache, W_UV, and the sigmoid output gate."""
    a = op.attrs
    N, Rr, L = a["heads"], a["rope"], a["kv_lora"]
    cached = env.cache.layers[a["cache_layer"]].read(env.batch, "latent")
    q_lat = env.seq(env.buf[op.reads[0]]).view(env.B, env.T, N, L)
    q_pe = env.seq(env.buf[op.reads[1]]).view(env.B, env.T, N, Rr)
    mask = env.batch.attention_mask(cached.shape[1])
    o = unabsorb_output(
        latent_attention(q_lat, q_pe, cached[..., :L], cached[..., L:], mask, a["scale"]), op.weights["w_uv"]
    )
    o = o.reshape(-1, N * a["v_dim"])
    if a["gated"]:
        o = o * torch.sigmoid(env.buf[op.reads[2]].float())
    env.buf[op.writes[0]].copy_(o)


# ----------------------------------------------------------------------------- KDA


def kda_in_proj(op, env):
    """One pass over [q | k | v | g (or g_a) | b | f_a]; short conv + SiLU on q, k, v (updating the
    conv windows of each sequence); writes q, k, v, the output-gate input, beta logits and f_a."""
    a = op.attrs
    C = a["channels"]
    parts = split(linear(op_input(op, env), op.weights["w_in"]), a["in_sizes"])
    state = env.cache.layers[a["cache_layer"]]
    windows = state.conv[env.batch.slots]
    windows = torch.where(_fresh(env)[:, None, None, None], torch.zeros_like(windows), windows)
    conv_w = op.weights["conv"]  # [3C, K]
    new_windows, every_token = [], []
    for i in range(3):
        y, win = short_conv(env.seq(parts[i]), conv_w[i * C : (i + 1) * C], windows[:, i])
        env.buf[op.writes[i]].copy_(y.reshape(-1, C))
        new_windows.append(win)
        if env.batch.keep_states:
            every_token.append(conv_windows(env.seq(parts[i]), windows[:, i], a["conv_size"]))
    if env.batch.keep_states:
        state.keep_conv(env.batch.slots, torch.stack(every_token, dim=2))
    state.conv[env.batch.slots] = torch.stack(new_windows, dim=1).to(state.conv.dtype)
    for name, part in zip(op.writes[3:], parts[3:]):
        env.buf[name].copy_(part)


def kda_core(op, env):
    """Per head: decay gate from f_b f_a, L2-normalised q/k, the delta-rule state update over the row's
    T tokens, and the gated output RMSNorm. Writes o [R, H·D]; updates the recurrent state."""
    a = op.attrs
    H, D = a["heads"], a["head_dim"]
    q, k, v, og, b, fa = (env.buf[n] for n in op.reads)
    f = linear(fa, op.weights["f_b"]).view(-1, H, D)
    if a["lower_bound"] is None:
        g = kda_gate_softplus(f, op.weights["A_log"], op.weights["dt_bias"])
    else:
        g = kda_gate_lower_bound(f, op.weights["A_log"], op.weights["dt_bias"], a["lower_bound"])
    qn = l2_norm(q.float().view(-1, H, D)) * D**-0.5
    kn = l2_norm(k.float().view(-1, H, D))
    beta = rowwise(torch.sigmoid, b.float())
    state = env.cache.layers[a["cache_layer"]]
    s0 = state.recurrent[env.batch.slots]
    s0 = torch.where(_fresh(env)[:, None, None, None], torch.zeros_like(s0), s0)
    args = (env.seq(qn), env.seq(kn), env.seq(v.float().view(-1, H, D)), env.seq(g), env.seq(beta), s0)
    if env.batch.keep_states:
        o, s1, states = kda_recurrent(*args, return_states=True)
        state.keep_recurrent(env.batch.slots, states)
    else:
        o, s1 = kda_recurrent(*args)
    state.recurrent[env.batch.slots] = s1
    gate = linear(og, op.weights["g_b"]) if "g_b" in op.weights else og
    y = gated_rms_norm(o.reshape(-1, H, D), gate.float().view(-1, H, D), op.weights["o_norm"], a["eps"])
    env.buf[op.writes[0]].copy_(y.reshape(-1, H * D))


# ----------------------------------------------------------------------------- MoE


def moe_front(op, env):
    """One pass over the FFN input: router logits (fp32), the experts' input (latent z = W↓ x, or x),
    and the shared experts' activation act(W_sg x, W_su x). Also zeroes moe_out, which moe_experts
    accumulates into (its kernel adds split-K partial sums atomically)."""
    a = op.attrs
    x = op_input(op, env)
    env.buf["moe_out"].zero_()
    env.buf["moe_logits"].copy_(router_logits(x, op.weights["router"]))
    env.buf["moe_in"].copy_(linear(x, op.weights["latent_down"]) if "latent_down" in op.weights else x)
    if "shared_gate_up" in op.weights:
        g, u = split(linear(x, op.weights["shared_gate_up"]), [a["shared_width"]] * 2)
        env.buf["moe_shared_act"].copy_(glu(g, u, a["act"], a["beta"], a["linear_beta"]))


def moe_experts(op, env):
    """Top-k selection from the logits (+ correction bias), then moe_out += Σ_k p_k E_k(moe_in) in fp32
    (moe_out was zeroed by moe_front)."""
    a = op.attrs
    weights, ids = select_experts(env.buf["moe_logits"], op.weights["bias"], a["moe"])
    x = env.buf["moe_in"]
    out = routed_experts(x, weights, ids, a["experts"], a["act"], a["beta"], a["linear_beta"])
    env.buf[op.writes[0]].add_(out)


def moe_tail(op, env):
    """target (+)= W↑ RMSNorm(u) (latent) or u, + W_sd shared_act."""
    a = op.attrs
    u = env.buf["moe_out"].to(env.buf["moe_in"].dtype)
    if "latent_up" in op.weights:
        if "latent_norm" in op.weights:
            u = rms_norm(u, op.weights["latent_norm"], a["eps"])
        u = linear(u, op.weights["latent_up"])
    if "shared_down" in op.weights:
        u = u + linear(env.buf["moe_shared_act"], op.weights["shared_down"])
    emit(op, env, u)


# ----------------------------------------------------------------------------- LM-head sampling (not lowered)


def sample(op, env):
    """next_ids[r] = argmax logits[r] when temperature[r] == 0, else the Gumbel-max draw
    argmax_{i in K} (x_i + g_i), x = logits[r] / temperature[r], K = the finite entries of
    ``filter_logits`` (top-k, then top-p on the renormalised top-k set) and g the Philox noise of
    (seed[r], offset[r]) (``model/philox.gumbel_noise``): an exact draw from the filtered distribution."""
    logits, temperature, top_k, top_p, seed, offset = (env.buf[n] for n in op.reads)
    out = env.buf[op.writes[0]]
    for r in range(logits.shape[0]):
        row = logits[r].float().cpu()
        t = float(temperature[r])
        if t == 0:
            out[r] = int(row.argmax())
            continue
        out[r] = gumbel_max(filter_logits(row, t, int(top_k[r]), float(top_p[r])), int(seed[r]), int(offset[r]))


REFERENCE = {
    "embed": embed,
    "attnres_mix_norm": attnres_mix_norm,
    "linear_residual": linear_residual,
    "lm_head": lm_head,
    "mlp": mlp,
    "gqa_qkv_rope": gqa_qkv_rope,
    "gqa_attn": gqa_attn,
    "mla_in_proj": mla_in_proj,
    "mla_q_up": mla_q_up,
    "mla_attn": mla_attn,
    "kda_in_proj": kda_in_proj,
    "kda_core": kda_core,
    "moe_front": moe_front,
    "moe_experts": moe_experts,
    "moe_tail": moe_tail,
    "sample": sample,
}
