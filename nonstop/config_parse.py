"""Parse Hugging Face ``config.json`` dicts into the fields of a ``ModelConfig`` (and slice them back).

``hf_config_fields(raw)`` returns the keyword arguments ``ModelConfig(**fields)`` takes; ``config.py``
builds the dataclass, so this module needs only the sub-config types (``config_types.py``).

Defaults for optional fields follow the transformers config class of each family, so one JSON
file means the same model here and there. Shape-defining fields are required.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from nonstop.config_types import (
    SITU_BETA,
    SITU_LINEAR_BETA,
    ConfigError,
    GQAConfig,
    KDAConfig,
    MLAConfig,
    MoEConfig,
    RopeConfig,
)

_MODEL_TYPE_FAMILY = {
    "llama": "llama",
    "deepseek_v3": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "kimi_linear": "kimi_linear",
    "kimi_k3": "kimi_k3",
}

# kimi_linear spells several DeepSeek fields differently; transformers accepts both.
_KIMI_ALIASES = {
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "num_experts_per_token": ("num_experts_per_token", "num_experts_per_tok"),
    "num_shared_experts": ("num_shared_experts", "n_shared_experts"),
    "num_expert_group": ("num_expert_group", "n_group"),
    "moe_renormalize": ("moe_renormalize", "norm_topk_prob"),
    "max_position_embeddings": ("max_position_embeddings", "model_max_length"),
}
_DEEPSEEK_ALIASES = {
    "num_experts": ("n_routed_experts", "num_local_experts"),
    "num_experts_per_token": ("num_experts_per_tok",),
    "num_shared_experts": ("n_shared_experts",),
    "num_expert_group": ("n_group",),
    "moe_renormalize": ("norm_topk_prob",),
    "max_position_embeddings": ("max_position_embeddings",),
}

_MISSING = object()
MAX_LAYERS = 4096  # bounds on counts that size Python structures (a typo of 10**12 layers must not hang)
MAX_EXPERTS = 1 << 16
MAX_HEAD_DIM = 1 << 14  # a head's width: RoPE tables are built for it, KDA states are its square per head


class ConfigFields:
    """Typed access to one config dict; errors name the field (with its path for nested dicts)."""

    def __init__(self, raw: dict, where: str = "", aliases: dict | None = None):
        self.raw = raw
        self.where = where
        self.aliases = aliases or {}

    def _name(self, key: str) -> str:
        return f"{self.where}{key}"

    def _lookup(self, key: str):
        names = self.aliases.get(key, (key,))
        found = [(n, self.raw[n]) for n in names if n in self.raw]
        values = {repr(v) for _, v in found}
        if len(values) > 1:
            listing = ", ".join(f"{self._name(n)}={v!r}" for n, v in found)
            raise ConfigError(f"contradictory fields: {listing}")
        return found[0][1] if found else _MISSING

    def has(self, key: str) -> bool:
        return self._lookup(key) not in (_MISSING, None)

    def get(self, key: str, default=_MISSING, kind=None):
        value = self._lookup(key)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise ConfigError(f"missing required field {self._name(key)!r}")
            return default
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"field {self._name(key)!r} must be an integer, got {value!r}")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"field {self._name(key)!r} must be a number, got {value!r}")
            value = float(value)
            if not math.isfinite(value):  # Python's json reads NaN, Infinity and -Infinity
                raise ConfigError(f"field {self._name(key)!r} must be a finite number, got {value!r}")
        elif kind is bool:
            if not isinstance(value, bool):
                raise ConfigError(f"field {self._name(key)!r} must be true or false, got {value!r}")
        elif kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"field {self._name(key)!r} must be a string, got {value!r}")
        return value

    def positive(self, key: str, default=_MISSING, limit: int | None = None) -> int:
        value = self.get(key, default, int)
        if value <= 0:
            raise ConfigError(f"field {self._name(key)!r} must be positive, got {value}")
        if limit is not None:
            _at_most(self._name(key), value, limit)
        return value

    def at_least(self, key: str, low: float, default=_MISSING, kind=float, strict: bool = False):
        """A number >= ``low`` (> ``low`` when ``strict``); None stays None when it is the default."""
        value = self.get(key, default, kind)
        if value is not None and (value < low or (strict and value == low) or value != value):
            raise ConfigError(f"field {self._name(key)!r} must be {'>' if strict else '>='} {low}, got {value!r}")
        return value


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _at_most(name: str, value: int, limit: int) -> None:
    """Refuse field ``name`` above ``limit`` (``MAX_LAYERS``, ``MAX_EXPERTS``, ``MAX_HEAD_DIM``): a typo of 10**12
    must not build a Python structure or a RoPE table of that size."""
    _require(value <= limit, f"field {name!r} is {value}: more than any model has (limit {limit})")


# ----------------------------------------------------------------------------- rope


def _parse_rope(f: ConfigFields, dim: int, interleaved: bool, default_theta: float) -> RopeConfig:
    merged: dict = {}
    for key in ("rope_scaling", "rope_parameters"):  # the older and newer (transformers >= 4.56) spellings
        value = f.raw.get(key)
        if value is not None and not isinstance(value, dict):
            raise ConfigError(f"field {key!r} must be an object (or null), got {value!r}")
        clash = sorted(k for k, v in (value or {}).items() if k in merged and merged[k] != v)
        if clash:
            raise ConfigError(f"contradictory fields: 'rope_scaling' and 'rope_parameters' differ in {clash}")
        merged.update(value or {})
    theta = merged.get("rope_theta", f.raw.get("rope_theta", default_theta))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise ConfigError(f"field 'rope_theta' must be a positive finite number, got {theta!r}")
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if not isinstance(kind, str) or kind not in ("default", "linear", "llama3", "yarn"):
        raise ConfigError(f"unsupported rope type {kind!r} in field 'rope_scaling'/'rope_parameters'")
    rf = ConfigFields(merged, "rope_parameters.")
    if kind != "default" and merged.get("factor") is None:  # transformers refuses these too (a KeyError)
        raise ConfigError(f"missing required field 'rope_parameters.factor' (rope type {kind!r} scales by it)")
    factor = rf.at_least("factor", 0.0, 1.0, strict=True)
    original = rf.at_least("original_max_position_embeddings", 1, None, int)
    if kind == "llama3" and original is None:
        raise ConfigError("missing required field 'rope_parameters.original_max_position_embeddings'")
    if kind == "yarn" and original is None:  # as transformers: the context the config states is the original one
        original = f.positive("max_position_embeddings", 4096)
    return RopeConfig(
        dim=dim,
        theta=float(theta),
        kind=kind,
        interleaved=interleaved,
        factor=factor,
        original_max_position=original,
        low_freq_factor=rf.at_least("low_freq_factor", 0.0, 1.0, strict=True),
        high_freq_factor=rf.at_least("high_freq_factor", 0.0, 4.0, strict=True),
        beta_fast=rf.at_least("beta_fast", 0.0, 32.0, strict=True),
        beta_slow=rf.at_least("beta_slow", 0.0, 1.0, strict=True),
        mscale=rf.at_least("mscale", 0.0, None),
        mscale_all_dim=rf.at_least("mscale_all_dim", 0.0, None),
        attention_factor=rf.at_least("attention_factor", 0.0, None, strict=True),
        truncate=rf.get("truncate", True, bool),
    )


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN magnitude correction m = 0.1·mscale·ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


# ----------------------------------------------------------------------------- pieces


def is_token_id(value) -> bool:
    """An integer >= 0 (JSON ``true`` is an int to Python and is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def outside_vocabulary(ids_by_field: dict[str, list], vocab_size: int) -> str | None:
    """Why the first id (of ``{field: [id or None, ...]}``) at or past ``vocab_size`` is wrong; None when all
    fit. An eos id past the vocabulary is never sampled: generation would only stop at max_tokens."""
    for key, ids in ids_by_field.items():
        bad = [i for i in ids if i is not None and i >= vocab_size]
        if bad:
            return f"field {key!r} is {bad[0]}, outside the vocabulary (vocab_size {vocab_size})"
    return None


def _check_token_ids(fields: dict) -> None:
    """The bos and eos ids must be inside the vocabulary."""
    ids = {"bos_token_id": [fields["bos_token_id"]], "eos_token_id": fields["eos_token_ids"]}
    why = outside_vocabulary(ids, fields["vocab_size"])
    if why:
        raise ConfigError(why)


def _eos_ids(f: ConfigFields) -> tuple[int, ...]:
    eos = f.raw.get("eos_token_id")
    if eos is None:
        return ()
    ids = [eos] if isinstance(eos, int) else eos
    if isinstance(ids, list) and all(is_token_id(e) for e in ids):
        return tuple(ids)
    raise ConfigError(f"field 'eos_token_id' must be a token id (>= 0) or a list of them, got {eos!r}")


def _pad_id(f: ConfigFields) -> int | None:
    """``pad_token_id``, None when absent or negative: early Llama conversions write -1 for "no pad token", as
    transformers accepts; nothing here pads with it (it is kept for the checkpoint writer)."""
    pad = f.get("pad_token_id", None, int)
    return None if pad is None or pad < 0 else pad


def _mla(f: ConfigFields, family: str, rope: RopeConfig | None) -> MLAConfig:
    heads = f.positive("num_attention_heads")  # num_key_value_heads is meaningless for MLA: one shared latent
    nope = f.positive("qk_nope_head_dim", limit=MAX_HEAD_DIM)
    rope_dim = f.get("qk_rope_head_dim", 0, int)
    _require(rope_dim >= 0, "field 'qk_rope_head_dim' must be >= 0")
    _at_most(f._name("qk_rope_head_dim"), rope_dim, MAX_HEAD_DIM)
    q_lora = f.get("q_lora_rank", None, int)
    _require(q_lora is None or q_lora > 0, "field 'q_lora_rank' must be positive or null")
    scale = (nope + rope_dim) ** -0.5
    if rope is not None and rope.kind != "default" and rope.mscale_all_dim:  # as DeepSeek's reference and transformers
        m = yarn_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return MLAConfig(
        num_heads=heads,
        q_lora_rank=q_lora,
        kv_lora_rank=f.positive("kv_lora_rank"),
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=f.positive("v_head_dim", limit=MAX_HEAD_DIM),
        use_rope=rope is not None,
        output_gate=f.get("mla_use_output_gate", False, bool),
        softmax_scale=scale,
    )


def _moe(f: ConfigFields, family: str) -> MoEConfig | None:
    if not f.has("num_experts"):
        return None
    num_experts = f.positive("num_experts", limit=MAX_EXPERTS)
    top_k = f.positive("num_experts_per_token")
    _require(top_k <= num_experts, f"num_experts_per_token ({top_k}) exceeds num_experts ({num_experts})")
    kimi = family in ("kimi_linear", "kimi_k3")
    groups = f.get("num_expert_group", 1 if kimi else 8, int)
    topk_groups = f.get("topk_group", 1 if kimi else 4, int)
    _require(
        groups >= 1 and num_experts % groups == 0,
        f"num_experts ({num_experts}) must divide into num_expert_group ({groups}) groups",
    )
    _require(
        1 <= topk_groups <= groups, f"topk_group ({topk_groups}) must be between 1 and num_expert_group ({groups})"
    )
    if groups > 1:
        _require(num_experts // groups >= 2, "grouped top-k needs at least 2 experts per group")
        _require(
            top_k <= topk_groups * (num_experts // groups),
            f"num_experts_per_token ({top_k}) exceeds the experts of topk_group groups",
        )
    scoring = f.get("moe_router_activation_func", f.raw.get("scoring_func", "sigmoid"), str)
    _require(
        scoring in ("sigmoid", "softmax"),
        f"field 'moe_router_activation_func' must be sigmoid or softmax, got {scoring!r}",
    )
    latent = f.get("routed_expert_hidden_size", None, int)
    _require(latent is None or latent > 0, "field 'routed_expert_hidden_size' must be positive")
    return MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=f.positive("moe_intermediate_size"),
        num_shared_experts=f.at_least("num_shared_experts", 0, 1, int),
        scoring=scoring,
        num_groups=groups,
        topk_groups=topk_groups,
        renormalize=f.get("moe_renormalize", True, bool),
        routed_scaling_factor=f.at_least("routed_scaling_factor", 0.0, 2.446 if kimi else 2.5, strict=True),
        latent_size=latent,
        latent_norm=f.get("latent_moe_use_norm", False, bool) if latent else False,
    )


def _mlp_types(f: ConfigFields, n: int, moe: MoEConfig | None) -> tuple[str, ...]:
    if moe is None:
        return ("dense",) * n
    raw_types = f.raw.get("mlp_layer_types")
    kimi_layout = "linear_attn_config" in f.raw or "layer_types" in f.raw
    first_dense = f.at_least("first_k_dense_replace", 0, 1 if kimi_layout else 3, int)
    freq = f.get("moe_layer_freq", 1, int)
    _require(freq >= 1, "field 'moe_layer_freq' must be >= 1")
    derived = tuple("moe" if (i >= first_dense and i % freq == 0) else "dense" for i in range(n))
    if raw_types is None:
        return derived
    _require(isinstance(raw_types, list) and len(raw_types) == n, f"field 'mlp_layer_types' must list {n} entries")
    mapping = {"dense": "dense", "sparse": "moe"}
    bad = [t for t in raw_types if not isinstance(t, str) or t not in mapping]
    _require(not bad, f"field 'mlp_layer_types' has unknown entries {bad}")
    listed = tuple(mapping[t] for t in raw_types)
    if "first_k_dense_replace" in f.raw and listed != derived:
        raise ConfigError(
            "contradictory fields: 'mlp_layer_types' disagrees with 'first_k_dense_replace'/'moe_layer_freq'"
        )
    return listed


def _kimi_attn_types(f: ConfigFields, n: int) -> tuple[str, ...]:
    lac = f.raw.get("linear_attn_config") or {}
    if not isinstance(lac, dict):
        raise ConfigError(f"field 'linear_attn_config' must be an object, got {lac!r}")
    from_lists = None
    if "kda_layers" in lac or "full_attn_layers" in lac:
        kda = lac.get("kda_layers")
        full = lac.get("full_attn_layers")
        _require(
            isinstance(kda, list) and isinstance(full, list),
            "linear_attn_config needs both 'kda_layers' and 'full_attn_layers' lists",
        )
        types: list[str | None] = [None] * n
        for name, layers, kind in (("kda_layers", kda, "kda"), ("full_attn_layers", full, "mla")):
            for layer in layers:
                _require(
                    isinstance(layer, int) and not isinstance(layer, bool) and 1 <= layer <= n,
                    f"linear_attn_config.{name}: layer {layer!r} outside 1..{n} (1-based)",
                )
                _require(
                    types[layer - 1] is None,
                    f"linear_attn_config: layer {layer} listed twice (kda_layers and full_attn_layers)",
                )
                types[layer - 1] = kind
        missing = [i + 1 for i, t in enumerate(types) if t is None]
        _require(not missing, f"linear_attn_config: layers {missing} are in neither kda_layers nor full_attn_layers")
        from_lists = tuple(types)
    raw_types = f.raw.get("layer_types")
    from_types = None
    if raw_types is not None:
        _require(
            isinstance(raw_types, list) and len(raw_types) == n,
            f"field 'layer_types' must list {n} entries, got {raw_types!r}",
        )
        mapping = {"linear_attention": "kda", "full_attention": "mla"}
        bad = [t for t in raw_types if not isinstance(t, str) or t not in mapping]
        _require(not bad, f"field 'layer_types' has unknown entries {bad}")
        from_types = tuple(mapping[t] for t in raw_types)
    if from_lists and from_types and from_lists != from_types:
        raise ConfigError(
            "contradictory fields: 'layer_types' disagrees with 'linear_attn_config.kda_layers/full_attn_layers'"
        )
    result = from_lists or from_types
    if result is None:
        raise ConfigError("missing required field 'linear_attn_config.kda_layers' (or 'layer_types')")
    return result


def _kda(f: ConfigFields) -> KDAConfig:
    lac = f.raw.get("linear_attn_config") or {}
    if not isinstance(lac, dict):
        raise ConfigError(f"field 'linear_attn_config' must be an object, got {lac!r}")
    lf = ConfigFields(lac, "linear_attn_config.")

    def pick(inner: str, flat: str, default=_MISSING, limit: int | None = None):
        a = lac.get(inner)
        b = f.raw.get(flat)
        if a is not None and b is not None and a != b:
            raise ConfigError(f"contradictory fields: linear_attn_config.{inner}={a!r}, {flat}={b!r}")
        if a is not None:
            return lf.positive(inner, limit=limit)
        if b is not None:
            return f.positive(flat, limit=limit)
        if default is _MISSING:
            raise ConfigError(f"missing required field 'linear_attn_config.{inner}'")
        return default

    lower = lac.get("gate_lower_bound")
    if lower is not None:
        lower = lf.get("gate_lower_bound", kind=float)
        _require(lower < 0, "field 'linear_attn_config.gate_lower_bound' must be negative")
    return KDAConfig(
        num_heads=pick("num_heads", "linear_num_heads"),
        head_dim=pick("head_dim", "linear_head_dim", limit=MAX_HEAD_DIM),
        conv_size=pick("short_conv_kernel_size", "linear_conv_kernel_dim", 4),
        gate_lower_bound=lower,
        full_rank_output_gate=lf.get("use_full_rank_gate", False, bool),
    )


# ----------------------------------------------------------------------------- families


def _common(f: ConfigFields, family: str, n: int, attn_types, mlp_types, **extra) -> dict:
    return dict(
        family=family,
        vocab_size=f.positive("vocab_size"),
        hidden_size=f.positive("hidden_size"),
        num_hidden_layers=n,
        attn_types=tuple(attn_types),
        mlp_types=tuple(mlp_types),
        intermediate_size=f.positive("intermediate_size")
        if "dense" in mlp_types
        else f.get("intermediate_size", 0, int),
        rms_norm_eps=f.at_least("rms_norm_eps", 0.0, 1e-5 if family.startswith("kimi") else 1e-6, strict=True),
        tie_word_embeddings=f.get("tie_word_embeddings", False, bool),
        max_position_embeddings=f.positive("max_position_embeddings", 4096),
        bos_token_id=f.at_least("bos_token_id", 0, None, int),
        eos_token_ids=_eos_ids(f),
        pad_token_id=_pad_id(f),
        **extra,
    )


def _act(f: ConfigFields) -> dict:
    act = f.get("hidden_act", "silu", str)
    _require(act in ("silu", "situ"), f"field 'hidden_act' must be silu or situ, got {act!r}")
    return dict(
        hidden_act=act,
        situ_beta=f.at_least("activation_situ_beta", 0.0, SITU_BETA, strict=True),
        situ_linear_beta=f.at_least("activation_situ_linear_beta", 0.0, SITU_LINEAR_BETA, strict=True),
    )


def _parse_llama(raw: dict) -> dict:
    f = ConfigFields(raw)
    n = f.positive("num_hidden_layers", limit=MAX_LAYERS)
    heads = f.positive("num_attention_heads")
    kv_heads = f.get("num_key_value_heads", heads, int)
    _require(
        kv_heads > 0 and heads % kv_heads == 0,
        f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})",
    )
    hidden = f.positive("hidden_size")
    head_dim = f.get("head_dim", None, int)
    if head_dim is None:
        _require(
            hidden % heads == 0,
            f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}); give 'head_dim'",
        )
        head_dim = hidden // heads
    _require(head_dim > 0 and head_dim % 2 == 0, f"head_dim ({head_dim}) must be positive and even for RoPE")
    _at_most("head_dim", head_dim, MAX_HEAD_DIM)  # given, or hidden_size / num_attention_heads
    bias = f.get("attention_bias", False, bool)
    gqa = GQAConfig(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, bias=bias, out_bias=bias)
    rope = _parse_rope(f, head_dim, interleaved=False, default_theta=10000.0)
    return dict(
        **_common(f, "llama", n, ("gqa",) * n, ("dense",) * n),
        **_act(f),
        mlp_bias=f.get("mlp_bias", False, bool),
        rope=rope,
        gqa=gqa,
        hf=raw,
    )


def _parse_deepseek(raw: dict) -> dict:
    f = ConfigFields(raw, aliases=_DEEPSEEK_ALIASES)
    n = f.positive("num_hidden_layers", limit=MAX_LAYERS)
    rope_dim = f.get("qk_rope_head_dim", 0, int)
    _require(rope_dim > 0 and rope_dim % 2 == 0, f"field 'qk_rope_head_dim' must be positive and even, got {rope_dim}")
    _at_most("qk_rope_head_dim", rope_dim, MAX_HEAD_DIM)
    rope = _parse_rope(f, rope_dim, interleaved=f.get("rope_interleave", True, bool), default_theta=10000.0)
    moe = _moe(f, "deepseek_v3")
    return dict(
        **_common(f, "deepseek_v3", n, ("mla",) * n, _mlp_types(f, n, moe)),
        **_act(f),
        rope=rope,
        mla=_mla(f, "deepseek_v3", rope),
        moe=moe,
        hf=raw,
    )


def _parse_kimi(raw: dict, text: dict, family: str) -> dict:
    f = ConfigFields(text, "text_config." if family == "kimi_k3" else "", aliases=_KIMI_ALIASES)
    n = f.positive("num_hidden_layers", limit=MAX_LAYERS)
    attn_types = _kimi_attn_types(f, n)
    moe = _moe(f, family)
    rope = None
    if "mla" in attn_types and not f.get("mla_use_nope", True, bool):
        rope_dim = f.positive("qk_rope_head_dim", limit=MAX_HEAD_DIM)
        _require(rope_dim % 2 == 0, f"field 'qk_rope_head_dim' must be even (rotated in pairs), got {rope_dim}")
        rope = _parse_rope(f, rope_dim, interleaved=f.get("rope_interleave", True, bool), default_theta=10000.0)
    block = f.get("attn_res_block_size", None, int)
    _require(block is None or block > 0, "field 'attn_res_block_size' must be positive")
    common = _common(f, family, n, attn_types, _mlp_types(f, n, moe))
    if family == "kimi_k3":
        outer = ConfigFields(raw)
        if outer.has("bos_token_id"):
            common["bos_token_id"] = outer.at_least("bos_token_id", 0, kind=int)
        if outer.has("pad_token_id"):
            common["pad_token_id"] = _pad_id(outer)
        if "eos_token_id" in raw:
            common["eos_token_ids"] = _eos_ids(outer)
        if "tie_word_embeddings" in raw:
            common["tie_word_embeddings"] = outer.get("tie_word_embeddings", kind=bool)
    return dict(
        **common,
        **_act(f),
        attn_res_block_size=block,
        rope=rope,
        mla=_mla(f, family, rope) if "mla" in attn_types else None,
        kda=_kda(f) if "kda" in attn_types else None,
        moe=moe,
        weight_prefix="language_model.model." if family == "kimi_k3" else "model.",
        lm_head_name="language_model.lm_head.weight" if family == "kimi_k3" else "lm_head.weight",
        hf=raw,
    )


def hf_config_fields(raw: dict) -> dict:
    """The ``ModelConfig`` keyword arguments of an HF config dict; ``ConfigError`` names a bad field."""
    if not isinstance(raw, dict):
        raise ConfigError("config must be a JSON object")
    model_type = raw.get("model_type")
    if model_type is None:
        raise ConfigError("missing required field 'model_type'")
    if not isinstance(model_type, str):
        raise ConfigError(f"field 'model_type' must be a string, got {model_type!r}")
    family = _MODEL_TYPE_FAMILY.get(model_type)
    if family is None:
        raise ConfigError(f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(_MODEL_TYPE_FAMILY))}")
    if family == "llama":
        fields = _parse_llama(raw)
    elif family == "deepseek_v3":
        fields = _parse_deepseek(raw)
    elif family == "kimi_k3":
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("missing required field 'text_config' (kimi_k3 keeps the language model config there)")
        fields = _parse_kimi(raw, text, "kimi_k3")
    else:
        fields = _parse_kimi(raw, raw, "kimi_linear")
    moe = fields.get("moe")
    fmt = _expert_format(raw, family, moe is not None)
    if moe is not None:
        fields["moe"] = dataclasses.replace(moe, expert_format=fmt)
    _check_token_ids(fields)
    return fields


# ----------------------------------------------------------------------------- quantization

DEFAULT_FP8_BLOCK = (128, 128)  # DeepSeek-V3 / Kimi K2 weight_block_size
MXFP4_WEIGHTS = {"group_size": (32,), "num_bits": (4,), "type": ("float",), "scale_dtype": ("torch.uint8", "uint8")}


def _quantization_entry(raw: dict) -> tuple[str, object]:
    """(field path, value) of the ``quantization_config`` of an HF config dict: kimi_k3 keeps it in
    ``text_config`` (a top-level one is read when ``text_config`` has none); value None when there is none."""
    text = raw.get("text_config") if raw.get("model_type") == "kimi_k3" else None
    if isinstance(text, dict) and text.get("quantization_config") is not None:
        return "text_config.quantization_config", text["quantization_config"]
    return "quantization_config", raw.get("quantization_config")


def quantization_config(raw: dict) -> dict:
    """The ``quantization_config`` of an HF config dict, wherever its family keeps it ({} when none). The one
    place that finds it: the parser, the loader (fp8 blocks), the writers and the planner read it here."""
    quant = _quantization_entry(raw)[1]
    return quant if isinstance(quant, dict) else {}


def without_quantization(raw: dict) -> dict:
    """A copy of the HF config dict ``raw`` with its ``quantization_config`` removed (where its family keeps
    it): the config of weights written unquantised."""
    out = copy.deepcopy(raw)
    for d in (out, out.get("text_config")):
        if isinstance(d, dict):
            d.pop("quantization_config", None)
    return out


def fp8_block_size(raw: dict) -> tuple[int, int]:
    """The [rows, columns] block of one fp8 ``weight_scale_inv`` (validated by ``hf_config_fields``)."""
    return tuple(quantization_config(raw).get("weight_block_size") or DEFAULT_FP8_BLOCK)


def _expert_format(raw: dict, family: str, has_experts: bool) -> str:
    """Check the ``quantization_config`` of any family and return the format of the routed experts it gives:
    ``dense`` (none, or fp8 block weights, dequantised at load), ``mxfp4`` or ``int4``. ConfigError names
    the field: not an object, a bad ``weight_block_size``, an unsupported format, MXFP4 weight settings
    other than groups of 32 four-bit floats with uint8 scales, or experts' formats on a model without
    routed experts."""
    where, quant = _quantization_entry(raw)
    if quant is None:
        return "dense"
    if not isinstance(quant, dict):
        raise ConfigError(f"field {where!r} must be an object, got {quant!r}")
    block = quant.get("weight_block_size")
    if block is not None and not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    ):
        raise ConfigError(f"field '{where}.weight_block_size' must be two positive integers, got {block!r}")
    fmt = str(quant.get("format", quant.get("quant_method", "")))
    if "mxfp4" in fmt:
        _check_mxfp4_groups(quant, where)
        expert_format = "mxfp4"
    elif _int4_groups(quant):
        expert_format = "int4"  # compressed-tensors pack-quantized W4A16 (Kimi K2 Thinking, K2.5)
    elif quant.get("quant_method") == "fp8" or quant.get("fmt") == "e4m3":
        return "dense"  # fp8 block weights are dequantised at load
    else:
        raise ConfigError(f"unsupported {where} format {fmt!r}")
    if not has_experts:
        raise ConfigError(
            f"{where} format {fmt!r} quantises routed experts, but this {family} model has none: "
            "nonstop reads it only for MoE models"
        )
    return expert_format


def _check_mxfp4_groups(quant: dict, where: str) -> None:
    """The weights of every ``config_groups`` entry of an MXFP4 config are what the loader reads (OCP MXFP4:
    groups of 32 E2M1 values, one E8M0 uint8 scale each); a field that is absent is taken as that."""
    groups = quant.get("config_groups")
    if groups is None:
        return
    if not isinstance(groups, dict):
        raise ConfigError(f"field '{where}.config_groups' must be an object, got {groups!r}")
    for key, group in groups.items():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            continue
        for field, allowed in MXFP4_WEIGHTS.items():
            if field in weights and weights[field] not in allowed:
                raise ConfigError(
                    f"field '{where}.config_groups.{key}.weights.{field}' is {weights[field]!r}: MXFP4 weights "
                    f"are read with {field} {' or '.join(repr(a) for a in allowed)}"
                )


# ----------------------------------------------------------------------------- writing


def _text_dict(raw: dict) -> dict:
    return raw["text_config"] if raw.get("model_type") == "kimi_k3" else raw


def to_hf_config(hf: dict, attn_types: tuple[str, ...]) -> dict:
    """The family-format config.json dict of a model parsed from ``hf`` and cut to ``len(attn_types)``
    layers (``attn_types[i]``: layer i's attention kind)."""
    raw = copy.deepcopy(hf)
    text = _text_dict(raw)
    n = len(attn_types)
    if text.get("num_hidden_layers") != n:
        text["num_hidden_layers"] = n
        for key in ("layer_types", "mlp_layer_types"):
            if isinstance(text.get(key), list):
                text[key] = text[key][:n]
        lac = text.get("linear_attn_config")
        if isinstance(lac, dict) and "kda_layers" in lac:
            lac["kda_layers"] = [i + 1 for i in range(n) if attn_types[i] == "kda"]
            lac["full_attn_layers"] = [i + 1 for i in range(n) if attn_types[i] == "mla"]
    return raw


def _int4_groups(quant: dict) -> bool:
    """True for a compressed-tensors config whose quantised weights are 4-bit integers (``pack-quantized``:
    Kimi K2 Thinking / K2.5 routed experts, symmetric int4 in groups of 32 with a bf16 scale each)."""
    if quant.get("quant_method") != "compressed-tensors":
        return False
    groups = quant.get("config_groups")
    groups = list(groups.values()) if isinstance(groups, dict) else []
    weights = [g.get("weights") if isinstance(g, dict) else None for g in groups]
    return bool(weights) and all(
        isinstance(w, dict) and w.get("type") == "int" and w.get("num_bits") == 4 for w in weights
    )
