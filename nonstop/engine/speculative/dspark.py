"""A DSpark-style parallel block drafter, scaled down (the math; ``dspark_drafter.py`` runs it).

Inputs, for a sequence whose positions 0..p-1 the target has processed and whose last emitted token
x_p (the anchor, position p) it has not:
  context features   c_j = RMSNorm(W_c [h_{l1,j}; ...; h_{lm,j}])    j = p-W..p-1      [W, d]
                     (h_{l,j}: the target's residual stream entering layer l at position j; l = the
                     number of layers means the final residual)
  block              e = [E[x_p], m, ..., m]  (anchor embedding + k-1 learned mask embeddings)  [k, d]
Each of the ``num_layers`` layers (pre-norm, residual):
  a = RMSNorm(e);  q = W_q a;  [k|v] = W_{k|v} [c; a]   (context features are extra keys/values)
  e += W_o Attn(q, k, v)   RoPE at absolute positions (context j, slot i at p+i); slot i sees the
                           context and slots 0..i
  e += MLP(RMSNorm(e))     (SiLU-gated)
Base logits U_i = E_out RMSNorm(e_i) [k, V] (E, E_out: the target's embedding and LM head, shared and
frozen) predict the token at p+i+1. The low-rank Markov head adds a transition bias from the token
before it: logits_i = U_i + W1[x_{p+i}] W2 (W1 [V, r], W2 [r, V]); drafting goes left to right,
x_{p+i} being the anchor for i = 0 and the previous draft after.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nonstop.config_parse import ConfigFields
from nonstop.config_types import ConfigError
from nonstop.jsonfile import read_json_object
from nonstop.model.norms import RMSNorm
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import check_cast
from nonstop.weights.safetensors_file import SafetensorsFile, unreadable

DSPARK_MODEL_TYPE = "nonstop_dspark"


@dataclass
class DSparkConfig:
    """vocab_size / hidden_size: the target's (embedding and LM head are shared). taps: target layers
    read (the residual stream entering each; the layer count = the final residual). block_size: slots
    per pass (the most drafts per step). context_window: context positions attended."""

    vocab_size: int
    hidden_size: int
    taps: tuple[int, ...]
    block_size: int = 7
    num_layers: int = 1
    num_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 512
    context_window: int = 64
    markov_rank: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self):
        self.taps = tuple(int(t) for t in self.taps)
        if not self.taps:
            raise ValueError("a DSpark drafter reads at least one target layer (taps)")
        if self.block_size < 1 or self.head_dim % 2:
            raise ValueError(f"block_size must be >= 1 and head_dim even, got {self.block_size}, {self.head_dim}")

    def check_num_tokens(self, num_tokens: int) -> None:
        """ValueError when asked for more drafts per step than ``block_size``."""
        if num_tokens > self.block_size:
            raise ValueError(
                f"speculative num_tokens {num_tokens} (--num-draft-tokens) exceeds the DSpark drafter's block size "
                f"{self.block_size}, the most it drafts per step: give at most {self.block_size}"
            )

    def save(self, path: Path) -> None:
        d = asdict(self)
        d["taps"] = list(self.taps)
        Path(path).write_text(json.dumps({"model_type": "nonstop_dspark", **d}, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> DSparkConfig:
        """From config.json (other keys, such as the training report, are ignored). ConfigError naming the
        file and the field: unreadable or not JSON, a missing field, a wrong type or range, another model_type."""
        path = Path(path)
        why = unreadable(path)
        if why:
            raise ConfigError(f"{path}: cannot read ({why})")
        raw = read_json_object(path, ConfigError)
        try:
            return cls(**_config_fields(raw))
        except ValueError as exc:  # ConfigError, or __post_init__'s
            raise ConfigError(f"{path}: {exc}") from None


def _config_fields(raw: dict) -> dict:
    """DSparkConfig's keyword arguments from a config.json dict, typed: ints positive, floats positive and
    finite, taps a non-empty list of layer indices."""
    kind = raw.get("model_type", DSPARK_MODEL_TYPE)
    if kind != DSPARK_MODEL_TYPE:
        raise ConfigError(f"field 'model_type' is {kind!r}: not a nonstop DSpark drafter ({DSPARK_MODEL_TYPE!r})")
    f, out = ConfigFields(raw), {}
    for name, spec in DSparkConfig.__dataclass_fields__.items():
        default = () if spec.default is MISSING else (spec.default,)
        if name == "taps":
            taps = f.get("taps")
            if not isinstance(taps, list) or not taps or not all(_layer_index(t) for t in taps):
                raise ConfigError(
                    f"field 'taps' must be a non-empty list of layer indices (integers >= 0), got {taps!r}"
                )
            out[name] = tuple(taps)
        elif spec.type in ("float", float):
            out[name] = f.at_least(name, 0.0, *default, strict=True)
        else:
            out[name] = f.positive(name, *default)
    return out


def _layer_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE (half-split pairs): x [B, S, H, D], positions [B, S] -> x rotated by angle pos · θ^(-2i/D)."""
    D = x.shape[-1]
    inv = theta ** (-torch.arange(0, D, 2, device=x.device, dtype=torch.float32) / D)
    ang = positions[..., None].float() * inv  # [B, S, D/2]
    cos, sin = ang.cos()[:, :, None], ang.sin()[:, :, None]
    a, b = x[..., : D // 2].float(), x[..., D // 2 :].float()
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(x.dtype)


class DraftLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        d, H, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        self.cfg = cfg
        self.input_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.q_proj = nn.Linear(d, H * hd, bias=False)
        self.k_proj = nn.Linear(d, H * hd, bias=False)
        self.v_proj = nn.Linear(d, H * hd, bias=False)
        self.o_proj = nn.Linear(H * hd, d, bias=False)
        self.post_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.gate_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, d, bias=False)

    def context_kv(self, c: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (rotated) and values of context features c [B, W, d] at positions [B, W] -> [B, W, H, hd] each."""
        B, W, _ = c.shape
        H, hd = self.cfg.num_heads, self.cfg.head_dim
        k = rotate(self.k_proj(c).view(B, W, H, hd), positions, self.cfg.rope_theta)
        return k, self.v_proj(c).view(B, W, H, hd)

    def forward(
        self,
        e: torch.Tensor,
        ctx_k: torch.Tensor,
        ctx_v: torch.Tensor,
        ctx_valid: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """e [B, k, d] block; ctx_k / ctx_v [B, W, H, hd]; ctx_valid [B, W] bool; positions [B, k]."""
        B, k, _ = e.shape
        H, hd = self.cfg.num_heads, self.cfg.head_dim
        a = self.input_norm(e)
        q = rotate(self.q_proj(a).view(B, k, H, hd), positions, self.cfg.rope_theta)
        kb = rotate(self.k_proj(a).view(B, k, H, hd), positions, self.cfg.rope_theta)
        vb = self.v_proj(a).view(B, k, H, hd)
        keys = torch.cat([ctx_k, kb], dim=1).transpose(1, 2)  # [B, H, W+k, hd]
        values = torch.cat([ctx_v, vb], dim=1).transpose(1, 2)
        causal = torch.ones(k, k, dtype=torch.bool, device=e.device).tril()
        mask = torch.cat([ctx_valid[:, None, :].expand(B, k, -1), causal[None].expand(B, k, k)], dim=-1)  # [B, k, W+k]
        o = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask[:, None])
        e = e + self.o_proj(o.transpose(1, 2).reshape(B, k, H * hd))
        h = self.post_norm(e)
        return e + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DSparkModel(nn.Module):
    """The drafter's own weights (the target's embedding and LM head are passed in, never stored)."""

    def __init__(self, cfg: DSparkConfig):
        super().__init__()
        d = cfg.hidden_size
        self.cfg = cfg
        self.context_proj = nn.Linear(len(cfg.taps) * d, d, bias=False)
        self.context_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.markov_w1 = nn.Embedding(cfg.vocab_size, cfg.markov_rank)
        self.markov_w2 = nn.Linear(cfg.markov_rank, cfg.vocab_size, bias=False)

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., m·d] (the taps concatenated in ``cfg.taps`` order) -> c [..., d]."""
        return self.context_norm(self.context_proj(features))

    def block_hidden(
        self,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        ctx_valid: torch.Tensor,
        anchor_emb: torch.Tensor,
        anchor_pos: torch.Tensor,
        k: int,
    ) -> torch.Tensor:
        """ctx_kv: per layer (keys, values) [B, W, H, hd]; ctx_valid [B, W]; anchor_emb [B, d];
        anchor_pos [B] -> final hidden of the k slots [B, k, d] (before the final norm)."""
        B = anchor_emb.shape[0]
        e = torch.cat([anchor_emb[:, None], self.mask_embedding.to(anchor_emb.dtype).expand(B, k - 1, -1)], dim=1)
        positions = anchor_pos[:, None] + torch.arange(k, device=anchor_emb.device)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            e = layer(e, ck, cv, ctx_valid, positions)
        return e

    def base_logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """U = lm_head(RMSNorm(hidden)): [..., d] -> [..., V] fp32."""
        return F.linear(self.final_norm(hidden), lm_head.to(hidden.dtype)).float()

    def markov(self, prev: torch.Tensor) -> torch.Tensor:
        """Transition bias W1[prev] W2: prev ids [...] -> [..., V] fp32."""
        return self.markov_w2(self.markov_w1(prev)).float()

    def forward(
        self,
        features: torch.Tensor,
        ctx_valid: torch.Tensor,
        ctx_pos: torch.Tensor,
        anchor_ids: torch.Tensor,
        anchor_pos: torch.Tensor,
        prev_ids: torch.Tensor,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
    ) -> torch.Tensor:
        """Teacher-forced logits (training): features [B, W, m·d], ctx_valid / ctx_pos [B, W], anchor
        ids / positions [B], prev_ids [B, k] (the true token before each slot's target: the anchor,
        then the real continuation), embed / lm_head [V, d] -> logits [B, k, V] fp32."""
        c = self.context(features)
        kv = [layer.context_kv(c, ctx_pos) for layer in self.layers]
        hidden = self.block_hidden(kv, ctx_valid, embed[anchor_ids], anchor_pos, prev_ids.shape[1])
        return self.base_logits(hidden, lm_head) + self.markov(prev_ids)


def save_drafter(
    model: DSparkModel, path: Path, dtype: torch.dtype = torch.bfloat16, extra_config: dict | None = None
) -> None:
    """config.json + model.safetensors (weights in ``dtype``) under ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.cfg.save(path / "config.json")
    if extra_config:
        d = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**d, **extra_config}, indent=2) + "\n")
    save_file(
        {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors")
    )


def load_drafter(path: Path, dtype: torch.dtype = torch.float32, device="cpu") -> DSparkModel:
    """The drafter ``save_drafter`` wrote under ``path``, read as the target's weights are: config.json as
    ``DSparkConfig.load`` checks it, model.safetensors through the checked reader (a truncated or corrupt
    file), every tensor present, expected, of its shape and a float dtype, finite before and after the cast
    to ``dtype``. Errors (ConfigError, CheckpointError) name the file and the field or tensor."""
    path = Path(path)
    model = DSparkModel(DSparkConfig.load(path / "config.json"))
    f = SafetensorsFile(path / "model.safetensors")
    want = model.state_dict()
    for names, what in (
        ([n for n in want if n not in f.entries], "missing"),
        ([n for n in f.entries if n not in want], "unexpected"),
    ):
        if names:
            more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
            raise CheckpointError(f"{f.path}: {what} tensor {names[0]!r}{more} (the drafter its config.json describes)")
    state = {}
    for name, param in want.items():
        stored, shape = f.meta(name)
        if shape != tuple(param.shape) or not stored.is_floating_point:
            raise CheckpointError(
                f"{f.path}: tensor {name!r} is {list(shape)} {stored}, expected {list(param.shape)} floating point"
            )
        source = f.tensor(name)
        state[name] = source.to(device=device, dtype=dtype, copy=True)
        check_cast(name, source, state[name], str(f.path))
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
