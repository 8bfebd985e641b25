"""Where a stored winner may run: only where what it was verified on holds. Holes found by the k4 probe:

* the store key (``runtime/tuned.shape_key``) of an op with weights holds no attribute, so a winner verified on one
  model runs on another model with the same weight shapes but another ``act`` / ``beta`` / ``eps`` / ``scale``;
* ``make_target`` cuts a model of more than 8 layers to its kind's first layer + 1, so the variants of deeper
  layers that share the store key (K3's ``linear_residual`` with ``accumulate=True``, ``attnres_mix_norm``'s
  larger ``n_blocks``) are never verified, yet the winner runs on them.

Candidates: ``wrong_kernels/mlp_silu_only.py`` (the built-in mlp launch with SwiGLU hard-coded) and
``STORE_ONLY`` (the row-loop linear_residual test kernel with ``ACCUMULATE=False`` hard-coded).
The oracle is the plain-torch ``ReferenceExecutor`` / the full model's own Program, never the code under test."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import meta_model, random_model
from nonstop.program.lower import lower
from nonstop.program.twin import narrow_twin
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from nonstop.tune import store
from nonstop.tune.cases import variants
from nonstop.tune.target import make_target
from tests.tiny_configs import TINY_CONFIGS
from tests.tune.helpers import tiny_target

HERE = Path(__file__).resolve().parent / "wrong_kernels"
ROWLOOP = (Path(__file__).resolve().parent / "kernels" / "linear_residual_rowloop.py").read_text()
STORE_ONLY = ROWLOOP.replace('ACCUMULATE=op.attrs.get("accumulate", False)', "ACCUMULATE=False")
assert STORE_ONLY != ROWLOOP
ENTRY = {"proposer": "llm:x", "round": 1, "candidate": "r1c1", "timed": False, "time_ms": None}


def _attrs(op) -> tuple:
    """An op's static attributes as ``cases.variants`` tells variants apart (written out here, not imported)."""
    plain = (int, float, bool, str, type(None), tuple, list)
    return tuple(sorted((k, repr(v)) for k, v in op.attrs.items() if isinstance(v, plain) and k != "cache_layer"))


def _logits(executor, cfg, tokens) -> torch.Tensor:
    cache = ModelCache(cfg, 1, capacity=16, dtype=torch.float32)
    out = []
    for tok in tokens:
        b = cache.batch([0], 1)
        out.append(executor.forward(torch.tensor([[tok]]), cache, b))
        cache.advance(b)
    return torch.cat(out, 1)


@pytest.mark.timeout(120)
def test_a_winner_keyed_on_one_model_does_not_run_with_another_activation(tmp_path, monkeypatch):
    # fails on base: the SwiGLU-only winner stored for tiny-llama runs on a SiTU model of its shapes (3e-2 off)
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    source = (HERE / "mlp_silu_only.py").read_text()
    for s in tiny_target("mlp", "llama", (1,)).shapes:  # the keys `nonstop tune` records for tiny-llama (act silu)
        store.record(path, "cpu", "mlp", s.key, source, dict(ENTRY))
    cfg = dataclasses.replace(
        ModelConfig.from_hf_dict(TINY_CONFIGS["llama"]), hidden_act="situ", situ_beta=0.05, situ_linear_beta=0.05
    )
    model = random_model(cfg, torch.float32, seed=7)
    got = _logits(SuperOpExecutor(model), cfg, [3, 9, 27])
    want = _logits(ReferenceExecutor(model), cfg, [3, 9, 27])
    assert (got - want).abs().max().item() < 1e-4


def test_every_variant_sharing_a_store_key_is_verified_in_a_deep_model():
    # fails on base: a 12-layer K3-shaped model's linear_residual target covers accumulate=False only
    cfg = narrow_twin(ModelConfig.preset("kimi-k3")).with_num_layers(12)
    full = lower(meta_model(cfg, torch.float32))
    target = make_target("linear_residual", "k3-12", cfg, torch.float32, "cpu", [1])
    cut = variants(lower(meta_model(target.cfg, torch.float32)), "linear_residual")
    verified = {_attrs(cut[v]) for s in target.shapes for v in (s.variant, *s.others)}
    in_model = {_attrs(op) for op in full.ops if op.kind == "linear_residual"}
    assert ("accumulate", "True") in {a for attrs in in_model for a in attrs}  # the model does accumulate
    assert in_model <= verified, f"never verified: {sorted(in_model - verified)}"


def test_store_only_linear_residual_is_not_accepted_for_a_deep_k3_model():
    # fails on base: verify() accepts a kernel that ignores accumulate for a 12-layer K3-shaped model
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    from nonstop.tune.verify import verify

    cfg = narrow_twin(ModelConfig.preset("kimi-k3")).with_num_layers(12)
    target = make_target("linear_residual", "k3-12", cfg, torch.float32, "cpu", [1])
    verdict = verify(STORE_ONLY, target, seed=2)
    assert not verdict.accepted


@pytest.mark.timeout(120)
def test_attention_that_reads_only_the_first_64_keys_is_rejected():
    # fails on base: CPU verification caches at most 40 + T tokens, so a 64-key cap passes (0.8 logit error at 90)
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    from nonstop.tune.verify import verify

    verdict = verify((HERE / "gqa_attn_first64.py").read_text(), tiny_target("gqa_attn", "llama", (1,)), seed=1)
    assert not verdict.accepted


@pytest.mark.timeout(180)
def test_kda_core_wrong_only_in_a_one_sequence_speculative_step_is_rejected():
    # fails on base: keep_states is verified only at the fixed hidden shape B=2 T=3, never at the tuned B=1 T=2
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    from nonstop.tune.verify import verify

    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_linear"])
    target = make_target("kda_core", "tiny-kimi-linear", cfg, torch.float32, "cpu", [1], tokens=2)
    verdict = verify((HERE / "kda_core_spec_b1.py").read_text(), target, seed=1)
    assert not verdict.accepted


def _one_variant_store(tmp_path, monkeypatch, cfg, variants: list[str]) -> None:
    """The always-STORE linear_residual as the winner at every key of ``cfg``, listed as verified on ``variants``."""
    from nonstop.runtime.tuned import program_shape_key

    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    program = lower(meta_model(cfg, torch.float32))
    keys = {program_shape_key(program, op, 1, 1) for op in program.ops if op.kind == "linear_residual"}
    for key in keys:
        entry = {**ENTRY, "variants": variants}
        store.record(path, "cpu", "linear_residual", key, STORE_ONLY, entry)


@pytest.mark.timeout(120)
def test_a_winner_runs_only_on_the_variants_its_entry_lists(tmp_path, monkeypatch):
    """The variants a deep model's cut did not hold (or any variant an entry does not list) run the built-in
    kernel: a winner right only without accumulation, listed so, leaves the logits exact."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    cfg = narrow_twin(ModelConfig.preset("kimi-k3")).with_num_layers(3)
    _one_variant_store(tmp_path, monkeypatch, cfg, ["accumulate=False"])
    model = random_model(cfg, torch.float32, seed=5)
    executor = SuperOpExecutor(model)
    got = _logits(executor, cfg, [3, 9])
    want = _logits(ReferenceExecutor(model), cfg, [3, 9])
    assert (got - want).abs().max().item() < 1e-4
    tuned = executor.stats["tuned"]["linear_residual"]
    assert sum(tuned["used"].values()) > 0  # it ran where it was verified
    assert [v for vs in tuned["unverified"].values() for v in vs] == ["accumulate=True"]


@pytest.mark.timeout(120)
def test_an_entry_without_its_variants_runs_nowhere(tmp_path, monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 on a CPU")
    cfg = narrow_twin(ModelConfig.preset("kimi-k3")).with_num_layers(2)
    _one_variant_store(tmp_path, monkeypatch, cfg, [])
    executor = SuperOpExecutor(random_model(cfg, torch.float32, seed=5))
    _logits(executor, cfg, [3])
    assert not sum(executor.stats["tuned"]["linear_residual"]["used"].values())


def test_the_key_holds_what_the_op_computes_with_but_not_its_variant():
    """Two ops of one shape: another eps or activation is another key; another ``accumulate`` is the same key
    (the entry's variant list decides)."""
    from nonstop.runtime.tuned import op_variant, shape_key

    op = next(op for op in lower(meta_model(ModelConfig.from_hf_dict(TINY_CONFIGS["llama"]))).ops if op.kind == "mlp")
    base = shape_key(op, 1, 1)
    for change in ({"eps": 1e-3}, {"act": "situ"}, {"beta": 2.0}):
        assert shape_key(dataclasses.replace(op, attrs={**op.attrs, **change}), 1, 1) != base, change
    flipped = dataclasses.replace(op, attrs={**op.attrs, "accumulate": not op.attrs["accumulate"]})
    assert shape_key(flipped, 1, 1) == base
    assert op_variant(flipped) != op_variant(op)


def test_verification_states_draw_their_own_rope_frequencies():
    """A kernel computing RoPE frequencies from a base it assumes, ignoring ``inv_freq``, must be wrong on the
    verification's states: their frequencies are not the model's."""
    from nonstop.model.rope import rope_inv_freq
    from nonstop.tune.cases import CaseSpec, build_state

    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])
    model_freq = rope_inv_freq(cfg.rope)[0]  # the config's frequencies
    states = [
        build_state(CaseSpec("hidden", cfg, torch.float32, 1, 1, False, 0), "gqa_qkv_rope", "cpu", seed, 9)
        for seed in (3, 4)
    ]
    freqs = [s.op.weights["inv_freq"] for s in states]
    assert not torch.allclose(freqs[0], model_freq) and not torch.allclose(freqs[0], freqs[1])
    ratio = freqs[0] / model_freq
    assert bool(((ratio >= 0.5) & (ratio < 2.0)).all())  # the same scale: a plausible rotation, not noise
