"""Gaps the k8 mutation audit found in the variant bookkeeping of tuned winners (``runtime/tuned.op_variant`` /
``TunedKind.covers``) and the cut a verification builds (``tune/cases.layers_for``). Expected values come from the
tiny configs' layer counts and attributes written out here, never from the code under test."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch

from nonstop.config import ModelConfig
from nonstop.model.build import meta_model
from nonstop.program.lower import lower
from nonstop.runtime.tuned import TunedKind, op_variant, shape_key
from tests.tiny_configs import TINY_CONFIGS


def _ops(name: str, kind: str, **cfg_changes):
    cfg = dataclasses.replace(ModelConfig.from_hf_dict(TINY_CONFIGS[name]), **cfg_changes)
    return [op for op in lower(meta_model(cfg)).ops if op.kind == kind]


def test_attnres_norms_differing_only_in_the_block_they_store_are_other_variants():
    """K3's attention-residual norm that starts a block (``store_block=1``) and one that only mixes
    (``store_block=None``) with the same ``n_blocks`` share a store key; a winner verified on one must not run
    on the other (they compute differently: one also writes the block)."""
    ops = _ops("kimi_k3", "attnres_mix_norm")
    mixing = next(op for op in ops if op.attrs["n_blocks"] == 1 and op.attrs["store_block"] is None)
    storing = next(op for op in ops if op.attrs["n_blocks"] == 1 and op.attrs["store_block"] == 1)
    assert shape_key(mixing, 1, 1, torch.float32) == shape_key(storing, 1, 1, torch.float32)
    assert op_variant(mixing) != op_variant(storing)

    key = shape_key(mixing, 1, 1, torch.float32)
    ran = []
    kind = TunedKind("attnres_mix_norm", lambda op, env: ran.append("builtin"), {}, Path("."))
    kind.entries = {key: {"variants": [op_variant(mixing)]}}
    kind.loaded[key] = lambda op, env: ran.append("stored")
    for op in (mixing, storing, storing):
        kind(op, SimpleNamespace(B=1, T=1, buf={op.reads[0]: torch.zeros(1)}))
    assert ran == ["stored", "builtin", "builtin"]
    assert kind.unverified == {key: [op_variant(storing)]}  # noted once


def test_a_model_of_eight_layers_is_verified_whole():
    """``SMALL_MODEL_LAYERS`` (8): a model of at most 8 layers is cut to none of them, 9 layers are cut."""
    from nonstop.tune.cases import layers_for

    def llama(n: int) -> ModelConfig:
        return ModelConfig.from_hf_dict({**TINY_CONFIGS["llama"], "num_hidden_layers": n})

    assert layers_for(llama(8), "mlp") == 8
    assert layers_for(llama(9), "mlp") == 1  # one variant, first met at layer 0


def test_the_routing_config_of_moe_experts_is_in_the_key():
    """Two DeepSeek-V3 expert blocks of one weight shape that route otherwise (another scaling factor, softmax
    instead of sigmoid scoring, no renormalisation) compute otherwise: a winner verified on one must not be
    looked up for the other."""
    op = _ops("deepseek_v3", "moe_experts")[0]
    moe = op.attrs["moe"]
    base = shape_key(op, 1, 1, torch.float32)
    for change in ({"routed_scaling_factor": 1.0}, {"scoring": "softmax"}, {"renormalize": False}, {"top_k": 2}):
        other = dataclasses.replace(op, attrs={**op.attrs, "moe": dataclasses.replace(moe, **change)})
        assert shape_key(other, 1, 1, torch.float32) != base, change


def test_a_variant_first_met_at_layer_eight_is_left_out_of_the_cut():
    # fails on base: layers_for returns 1 (the final norm has no layer), so the layer-4 variants are not verified
    """A 12-layer K3 with attention-residual blocks of 4 layers: its norms' variants start at layers 0, 4 and 8
    (a new block: one more ``n_blocks``, one that stores the block). Only those met among the first 8 layers
    (``SMALL_MODEL_LAYERS``) are verified: the cut is layers 0..4, 5 layers, not 9."""
    from nonstop.tune.cases import layers_for

    d = TINY_CONFIGS["kimi_k3"]
    text = d["text_config"]
    full = [4, 8, 12]  # 1-based, as the HF config writes them
    kda = [i for i in range(1, 13) if i not in full]
    linear = {**text["linear_attn_config"], "full_attn_layers": full, "kda_layers": kda}
    cfg = ModelConfig.from_hf_dict(
        {**d, "text_config": {**text, "num_hidden_layers": 12, "attn_res_block_size": 4, "linear_attn_config": linear}}
    )
    first = {}
    for op in (op for op in lower(meta_model(cfg)).ops if op.kind == "attnres_mix_norm" and op.layer is not None):
        first.setdefault((op.attrs["n_blocks"], op.attrs["store_block"]), op.layer)
    assert sorted(set(first.values())) == [0, 4, 8]  # the premise: block starts at layers 0, 4, 8
    assert layers_for(cfg, "attnres_mix_norm") == 5


def test_the_split_of_a_fused_projection_is_in_the_key():
    """MLA's fused input projection: the same weight split otherwise (``in_sizes``: where the query's low-rank
    part ends and the KV part starts) normalises other columns: another key."""
    op = _ops("deepseek_v3", "mla_in_proj")[0]
    a, b = op.attrs["in_sizes"]
    other = dataclasses.replace(op, attrs={**op.attrs, "in_sizes": [a + 1, b - 1]})
    assert shape_key(other, 1, 1, torch.float32) != shape_key(op, 1, 1, torch.float32)


def test_a_kind_first_met_past_layer_eight_is_cut_after_its_first_layer():
    """A 12-layer DeepSeek-V3 whose first 9 layers are dense: its routed experts start at layer 9 (0-based), so the
    verification's cut must hold 10 layers (none of the first 8 has the kind)."""
    from nonstop.tune.cases import layers_for

    d = TINY_CONFIGS["deepseek_v3"]
    cfg = ModelConfig.from_hf_dict({**d, "num_hidden_layers": 12, "first_k_dense_replace": 9})
    assert min(op.layer for op in lower(meta_model(cfg)).ops if op.kind == "moe_experts") == 9  # the premise
    assert layers_for(cfg, "moe_experts") == 10


def test_an_entry_with_no_variants_field_covers_nothing():
    """An entry that does not list the variants it was verified on (a store written before they were listed, or
    by hand) covers none: the built-in kernel runs, and the variant is noted as unverified."""
    op = _ops("llama", "linear_residual")[0]
    key = shape_key(op, 1, 1, torch.float32)
    ran = []
    kind = TunedKind("linear_residual", lambda op, env: ran.append("builtin"), {key: {"kernel": "k.py"}}, Path("."))
    kind.loaded[key] = lambda op, env: ran.append("stored")
    kind(op, SimpleNamespace(B=1, T=1, buf={op.reads[0]: torch.zeros(1)}))
    assert ran == ["builtin"] and kind.used == {}
    assert kind.unverified == {key: [op_variant(op)]}


def test_a_kernel_checked_before_variants_were_listed_is_not_run():
    """Rules 3 stored kernels verified without the speculative step at every tuned T > 1, the long context and
    their own RoPE frequencies, and listed no variants: such an entry is refused (tune again)."""
    from nonstop.runtime.tuned import rules_problem

    assert rules_problem({"rules": 3, "variants": [""]}) is not None


def test_a_tuned_shape_lists_every_variant_sharing_its_key():
    """Tiny K3's linear_residual: a projection that starts a block (``accumulate=False``) and one that adds to it
    (``accumulate=True``) with the same weight shape share one key; the tuned shape lists both as covered."""
    from tests.tune.helpers import tiny_target

    target = tiny_target("linear_residual", "kimi_k3", (1,))
    want: dict[tuple, set] = {}
    for op in _ops("kimi_k3", "linear_residual"):
        want.setdefault(tuple(op.weights["w"].shape), set()).add(f"accumulate={op.attrs['accumulate']!r}")
    assert any(len(v) == 2 for v in want.values())  # the premise: some weight shape has both
    for s in target.shapes:
        shape = tuple(int(n) for n in s.key.split(" w=")[1].split()[0].split("x"))
        assert set(s.variants) == want[shape], s
