"""Mixture of experts: router, routed experts (dense or MXFP4), shared experts, K3 latent MoE.

Router (DeepSeek-V3 "noaux_tc", used by DeepSeek-V3, Kimi K2, Kimi Linear, Kimi K3), per token x [d]:
  s = σ(W_r x) or softmax(W_r x)          fp32 logits
  choice = s + b                          correction bias b: selection only
  group limit (G groups): keep the topk_group groups with the largest sum of their top-2 choice scores
  T = top-k(choice);  p_j = s_j / Σ_T s (if renormalise) · routed_scaling_factor
  ties (σ rounds to exactly 1.0 in fp32 past ~17) go to the lower group / expert id, as in the kernels
Routed output Σ_{j∈T} p_j E_j(x), E_j a gated MLP; shared experts are one unweighted MLP.
Latent MoE (K3): z = W↓ x; u = Σ p_j E_j(z) (experts on the latent width ℓ); y = W↑ RMSNorm(u) + shared(x).
"""

from __future__ import annotations

import torch
from torch import nn

from nonstop.config import ConfigError, MoEConfig
from nonstop.model.linear import Linear
from nonstop.model.mlp import GatedMLP, gated_mlp
from nonstop.model.norms import RMSNorm
from nonstop.model.rows import by_rows, is_row_exact, rowwise
from nonstop.weights import mxfp4


def router_logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 router logits: x [N, d], weight [E, d] -> [N, E] (row by row in ``row_exact()`` mode)."""
    if is_row_exact() and x.shape[0] > 1:
        return by_rows(router_logits, x, weight)
    return x.float() @ weight.float().t()


def top_ids(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [..., k] of the k largest entries of x [..., n] along the last dim, largest first; equal
    values in index order (``torch.topk`` leaves the order of ties unspecified)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def select_experts(
    logits: torch.Tensor, bias: torch.Tensor | None, cfg: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, E] fp32, correction bias [E] -> (weights [N, k] fp32, expert ids [N, k])."""
    scores = rowwise(torch.sigmoid, logits) if cfg.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias.float()
    if cfg.num_groups > 1:
        N, E = choice.shape
        grouped = choice.view(N, cfg.num_groups, E // cfg.num_groups)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, top_ids(group_scores, cfg.topk_groups), True)
        choice = choice.masked_fill(~keep[:, :, None].expand_as(grouped).reshape(N, E), float("-inf"))
    ids = top_ids(choice, cfg.top_k)
    weights = scores.gather(1, ids)
    if cfg.renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, ids


def route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cfg: MoEConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, d], router weight [E, d], correction bias [E] -> (weights [N, k] fp32, expert ids [N, k])."""
    return select_experts(router_logits(x, weight), bias, cfg)


class RoutedExperts(nn.Module):
    """Stacked expert weights: w1 (gate) [E, I, K], w3 (up) [E, I, K], w2 (down) [E, K, I] with K the
    expert input width (hidden, or K3's latent). MXFP4 keeps ``{w}_packed`` / ``{w}_scale`` uint8 buffers."""

    def __init__(self, num_experts: int, in_dim: int, intermediate: int, fmt: str = "dense"):
        super().__init__()
        if fmt not in ("dense", "mxfp4"):
            raise ConfigError(
                f"{fmt} routed experts are not run by this engine (dense or MXFP4 only); "
                "nonstop plan prices them (e.g. Kimi K2 Thinking's int4 experts)"
            )
        self.fmt = fmt
        self.num_experts = num_experts
        self.shapes = {"w1": (intermediate, in_dim), "w3": (intermediate, in_dim), "w2": (in_dim, intermediate)}
        for name, (n, k) in self.shapes.items():
            if fmt == "dense":
                setattr(self, name, nn.Parameter(torch.empty(num_experts, n, k)))
            else:
                self.register_buffer(
                    f"{name}_packed", torch.empty(num_experts, *mxfp4.packed_shape(n, k), dtype=torch.uint8)
                )
                self.register_buffer(
                    f"{name}_scale", torch.empty(num_experts, *mxfp4.scale_shape(n, k), dtype=torch.uint8)
                )

    def weight(self, name: str, expert: int, dtype: torch.dtype) -> torch.Tensor:
        """One expert's [N, K] weight in ``dtype`` (dequantised if MXFP4)."""
        if self.fmt == "dense":
            return getattr(self, name)[expert]
        k = self.shapes[name][1]
        return mxfp4.dequantize(
            getattr(self, f"{name}_packed")[expert], getattr(self, f"{name}_scale")[expert], k, dtype
        )


def routed_experts(
    x: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    experts: RoutedExperts,
    act: str,
    beta: float,
    linear_beta: float,
) -> torch.Tensor:
    """Σ_j p_j E_j(x) for x [N, K], weights/ids [N, k] -> [N, K] in x.dtype (accumulated in fp32, experts in
    id order)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        rows, slot = torch.nonzero(ids == e, as_tuple=True)
        w1, w3, w2 = (experts.weight(n, e, x.dtype) for n in ("w1", "w3", "w2"))
        y = gated_mlp(x[rows], w1, w3, w2, act, beta, linear_beta)
        out.index_add_(0, rows, y.float() * weights[rows, slot, None])
    return out.to(x.dtype)


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(num_experts))


class MoE(nn.Module):
    """Routed + shared experts; with ``cfg.latent_size`` the routed experts run in the latent width."""

    def __init__(self, cfg: MoEConfig, hidden: int, act: str, beta: float, linear_beta: float, eps: float):
        super().__init__()
        self.cfg = cfg
        self.act, self.beta, self.linear_beta = act, beta, linear_beta
        self.gate = Router(cfg.num_experts, hidden)
        width = cfg.latent_size or hidden
        self.experts = RoutedExperts(cfg.num_experts, width, cfg.intermediate_size, cfg.expert_format)
        if cfg.latent_size:
            self.routed_expert_down_proj = Linear(hidden, cfg.latent_size)
            self.routed_expert_up_proj = Linear(cfg.latent_size, hidden)
            if cfg.latent_norm:
                self.routed_expert_norm = RMSNorm(cfg.latent_size, eps)
        if cfg.num_shared_experts:
            self.shared_experts = GatedMLP(hidden, cfg.shared_intermediate_size, act, beta, linear_beta)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., d] -> [..., d]."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        weights, ids = route(flat, self.gate.weight, self.gate.e_score_correction_bias, self.cfg)
        if self.cfg.latent_size:
            z = self.routed_expert_down_proj(flat)
            u = routed_experts(z, weights, ids, self.experts, self.act, self.beta, self.linear_beta)
            if self.cfg.latent_norm:
                u = self.routed_expert_norm(u)
            y = self.routed_expert_up_proj(u)
        else:
            y = routed_experts(flat, weights, ids, self.experts, self.act, self.beta, self.linear_beta)
        if self.cfg.num_shared_experts:
            y = y + self.shared_experts(flat)
        return y.view(shape)
