"""Differential checks of the ``cpu`` executor at odd shapes (hidden sizes off the 16 / 32-column row tiles,
vocabularies of 131 / 1009, odd expert and KDA head counts) for every weight format: each decode step's
logits against the reference run on the same packed weights (``pack_program`` sets the model's parameters to
the values the packed weights represent, so that oracle agrees to fp32 rounding), batched rows of different
prompt lengths, a page size of 3 (contexts cross many page boundaries), a slot reused after its request ends,
a one-token request joining mid-run, and the final caches. The int8 weights are checked against an
independent s·Q quantisation, and fp32 steps against transformers' full-sequence logits."""

from __future__ import annotations

import copy

import pytest
import torch

from nonstop.cache.state import KDAState, ModelCache
from nonstop.config import ModelConfig
from nonstop.model.build import load_model, random_model
from nonstop.runtime.cpu import CPUExecutor
from nonstop.runtime.cpu.kernels import load_kernels
from tests.tiny_configs import DEEPSEEK, KIMI_K3, KIMI_LINEAR_RELEASE, LLAMA, hf_model_from_dict

ODD = {
    "llama": {
        **LLAMA,
        "vocab_size": 1009,
        "hidden_size": 54,
        "intermediate_size": 97,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 14,
        "tie_word_embeddings": False,
    },
    "deepseek_v3": {
        **DEEPSEEK,
        "vocab_size": 1009,
        "hidden_size": 37,
        "n_routed_experts": 13,
        "num_experts_per_tok": 3,
        "n_group": 1,
        "topk_group": 1,
        "moe_intermediate_size": 23,
        "intermediate_size": 61,
    },
    "kimi_linear": {
        **KIMI_LINEAR_RELEASE,
        "hidden_size": 45,
        "vocab_size": 131,
        "num_experts": 9,
        "linear_attn_config": {**KIMI_LINEAR_RELEASE["linear_attn_config"], "num_heads": 5, "head_dim": 7},
    },
    "kimi_k3": {
        **KIMI_K3,
        "text_config": {
            **KIMI_K3["text_config"],
            "hidden_size": 45,
            "vocab_size": 1009,
            "num_experts": 9,
            "routed_expert_hidden_size": 19,
            "linear_attn_config": {**KIMI_K3["text_config"]["linear_attn_config"], "num_heads": 5, "head_dim": 7},
        },
    },
}
TIGHT = 2e-5  # fp32 rounding of a few hundred multiply-adds in a different order (observed <= 4.2e-7)


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _differential_run(raw: dict, fmt: str, steps: int = 12, int8_group: int | None = None) -> dict:
    cfg = ModelConfig.from_hf_dict(raw)
    model = random_model(cfg, torch.float32, seed=11)
    original = copy.deepcopy(model)
    kw = {} if int8_group is None else {"int8_group": int8_group}
    ex = CPUExecutor(model, weights=fmt, compile=False, progress=False, **kw)
    V = cfg.vocab_size
    caches = {n: ModelCache(cfg, 4, capacity=4, page_size=3) for n in ("cpu", "ref", "orig")}
    fns = {"cpu": ex.forward, "ref": model.forward, "orig": original.forward}
    out = {"decode_ref": 0.0, "decode_orig": 0.0, "prefill_ref": 0.0, "argmax_differs": 0}
    last: dict[int, int] = {}

    def prefill(slot, prompt):
        got = {}
        for n, c in caches.items():
            c.reset(slot)
            b = c.batch([slot], len(prompt))
            got[n] = fns[n](torch.tensor([prompt]), c, b)
            c.advance(b)
        out["prefill_ref"] = max(out["prefill_ref"], _max_abs(got["cpu"], got["ref"]))
        last[slot] = int(got["cpu"][0, -1].argmax())

    with torch.inference_mode():
        for slot, prompt in ((2, [5, 6, 7, 8, 9]), (0, [7, 8]), (3, list(range(10, 21)))):
            prefill(slot, [t % V for t in prompt])
        active = [2, 0, 3]
        for step in range(steps):
            if step == steps // 3:  # slot 0's request ends, a new one takes the slot
                active.remove(0)
                prefill(0, [(3 * t + 1) % V for t in range(7)])
                active.insert(1, 0)
            if step == 2 * steps // 3:  # a one-token request joins in slot 1: no prefill, decode steps only
                for c in caches.values():
                    c.reset(1)
                last[1] = 17 % V
                active.append(1)
            ids = torch.tensor([[last[s]] for s in active])
            got = {}
            for n, c in caches.items():
                b = c.batch(active, 1)
                got[n] = fns[n](ids, c, b, last_only=True)
                c.advance(b)
            out["decode_ref"] = max(out["decode_ref"], _max_abs(got["cpu"], got["ref"]))
            out["decode_orig"] = max(out["decode_orig"], _max_abs(got["cpu"], got["orig"]))
            out["argmax_differs"] += int((got["cpu"].argmax(-1) != got["ref"].argmax(-1)).sum())
            for i, s in enumerate(active):
                last[s] = int(got["cpu"][i].argmax())
    worst = 0.0
    for a, b in zip(caches["cpu"].layers, caches["ref"].layers):
        if isinstance(a, KDAState):
            worst = max(worst, _max_abs(a.recurrent, b.recurrent), _max_abs(a.conv, b.conv))
        else:
            worst = max(worst, *(_max_abs(a.tensors[k], b.tensors[k]) for k in a.tensors))
    out["cache_ref"] = worst
    out["lengths_equal"] = torch.equal(caches["cpu"].lengths, caches["ref"].lengths)
    out["stats"] = ex.stats
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("family", sorted(ODD))
def test_decode_steps_match_the_reference_on_the_packed_weights(family, fmt):
    r = _differential_run(ODD[family], fmt)
    assert r["stats"]["compiled_steps"] == 12 and r["stats"]["reference_reasons"] == {"prefill (T > 1)": 4}
    assert r["prefill_ref"] == 0.0  # prefill is the reference itself
    assert r["decode_ref"] < TIGHT, r["decode_ref"]
    assert r["cache_ref"] < TIGHT, r["cache_ref"]
    assert r["argmax_differs"] == 0 and r["lengths_equal"]
    if fmt == "float32":  # fp32 packing keeps the weights: the untouched model agrees as tightly
        assert r["decode_orig"] < TIGHT
    else:  # quantised: the packed weights differ from the loaded ones, so the logits must move
        assert r["decode_orig"] > 1e-4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("isa", [0, 1])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_every_vector_path_matches_the_reference(isa, fmt):
    if load_kernels(False) is not None:
        pytest.skip("C++ kernels unavailable")
    before = int(torch.ops.nonstop_cpu.isa_level())
    if torch.ops.nonstop_cpu.limit_isa(isa) != isa:
        torch.ops.nonstop_cpu.limit_isa(before)
        pytest.skip(f"vector path {isa} not supported here")
    try:
        r = _differential_run(ODD["llama"], fmt, steps=9)
    finally:
        torch.ops.nonstop_cpu.limit_isa(before)
    assert r["decode_ref"] < TIGHT and r["cache_ref"] < TIGHT and r["argmax_differs"] == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group", [16, 8])  # 16: whole kernel chunks; 8: not a chunk multiple (torch product)
def test_int8_groups_match_the_reference(group):
    raw = {**ODD["llama"], "hidden_size": 48, "intermediate_size": 80, "num_attention_heads": 4, "head_dim": 12}
    r = _differential_run(raw, "int8", steps=9, int8_group=group)
    assert r["decode_ref"] < TIGHT and r["cache_ref"] < TIGHT and r["argmax_differs"] == 0


def _independent_int8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(s·Q, s/2 per element) from the documented formula, written out here."""
    K = w.shape[-1]
    blocks = w.reshape(*w.shape[:-1], K // group, group)
    s = blocks.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    deq = torch.clamp(torch.round(blocks / s), -127, 127) * s
    return deq.reshape(w.shape), (s / 2).expand_as(blocks).reshape(w.shape)


@pytest.mark.parametrize("family", sorted(ODD))
def test_int8_packed_weights_are_the_independent_quantisation(family):
    cfg = ModelConfig.from_hf_dict(ODD[family])
    model = random_model(cfg, torch.float32, seed=3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    CPUExecutor(model, weights="int8", compile=False, progress=False, int8_group=16)
    changed = 0
    for name, p in model.named_parameters():
        w = before[name]
        if torch.equal(w, p):
            continue
        K = w.shape[-1]
        group = 16 if w.dim() == 2 and K % 16 == 0 and K > 16 else K  # routed experts: per channel
        deq, half_step = _independent_int8(w, group)
        assert torch.equal(p, deq), name
        assert bool(((w - p).abs() <= half_step * (1 + 1e-5) + 1e-9).all()), name
        changed += 1
    assert changed > 10


@pytest.mark.timeout(120)
@pytest.mark.parametrize("family", ["llama", "deepseek_v3", "kimi_linear"])
def test_fp32_decode_steps_match_transformers(family, tmp_path):
    raw = ODD[family]
    torch.manual_seed(7)
    hf = hf_model_from_dict(raw)
    hf.save_pretrained(tmp_path)
    cfg = ModelConfig.from_hf_dict(raw)
    ex = CPUExecutor(load_model(cfg, tmp_path), weights="float32", compile=False, progress=False)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, cfg.vocab_size, (20,), generator=g), torch.randint(3, cfg.vocab_size, (25,), generator=g)]
    plen = [4, 9]
    worst = 0.0
    with torch.inference_mode():
        full = [hf(s[None]).logits[0].float() for s in seqs]
        cache = ModelCache(cfg, 2, capacity=4, page_size=3)
        for slot in (1, 0):
            b = cache.batch([slot], plen[slot])
            worst = max(
                worst, _max_abs(ex.forward(seqs[slot][None, : plen[slot]], cache, b)[0], full[slot][: plen[slot]])
            )
            cache.advance(b)
        pos = list(plen)
        while pos[0] < 20:
            b = cache.batch([0, 1], 1)
            logits = ex.forward(torch.tensor([[seqs[s][pos[s]]] for s in (0, 1)]), cache, b, last_only=True)
            cache.advance(b)
            for s in (0, 1):
                worst = max(worst, _max_abs(logits[s], full[s][pos[s]]))
                pos[s] += 1
    assert ex.stats["compiled_steps"] == 16
    assert worst < 1e-5, worst


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["float32", "int8"])
@pytest.mark.parametrize("family", ["llama", "kimi_k3"])
def test_reused_slot_decodes_like_a_fresh_sequence(family, fmt):
    """A slot reused by a shorter request (its old pages / KDA state must not leak): each decode step's logits
    equal a cache-free forward of the slot's whole token sequence (no cache code in the oracle)."""
    cfg = ModelConfig.from_hf_dict(ODD[family])
    V = cfg.vocab_size
    model = random_model(cfg, torch.float32, seed=4)
    ex = CPUExecutor(model, weights=fmt, compile=False, progress=False)
    cache = ModelCache(cfg, 2, capacity=4, page_size=3)
    tokens: dict[int, list[int]] = {}
    worst = 0.0

    def prefill(slot, prompt):
        cache.reset(slot)
        b = cache.batch([slot], len(prompt))
        out = ex.forward(torch.tensor([prompt]), cache, b, last_only=True)
        cache.advance(b)
        tokens[slot] = [*prompt, int(out[0].argmax())]

    with torch.inference_mode():
        prefill(0, [(5 * t + 2) % V for t in range(13)])
        prefill(1, [9, 10, 11])
        for step in range(16):
            if step == 6:
                prefill(0, [4, 8])  # the old request in slot 0 reached 19 tokens; the new one has 2
            b = cache.batch([1, 0], 1)
            out = ex.forward(torch.tensor([[tokens[1][-1]], [tokens[0][-1]]]), cache, b, last_only=True)
            cache.advance(b)
            if step >= 6:
                worst = max(worst, _max_abs(out[1], model(torch.tensor([tokens[0]]))[0, -1]))
            tokens[1].append(int(out[0].argmax()))
            tokens[0].append(int(out[1].argmax()))
    assert ex.stats["compiled_steps"] == 16
    assert worst < TIGHT, worst
