"""Checkpoints written here with the ``safetensors`` package and this file's own quantisation math (not
nonstop's writer), loaded by nonstop: fp8 e4m3 / e5m2 block-scaled weights whose blocks do not divide them
(128x128 on 200x72, [1, 1], [7, 5], [3, 300]), MXFP4 experts with a ragged last group, odd K and an odd
expert count, and a tensor stored in two indexed shards. The whole-model loader must give exactly the
dequantised values of reference/model-architecture.md (fp8: w = w_fp8 * scale_inv[i // b0, j // b1]) and
reference/kimi-k3.md (MXFP4: E2M1 nibble, low nibble first, times 2^(s - 127) per 32 values); a --tp 3 / --ep 2
rank's loader the hand-computed slices of them; a model on the quantised checkpoint the logits of the same
model on a plain fp32 copy of the dequantised weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.load import load_rank_state
from nonstop.model.build import load_model
from nonstop.weights.errors import CheckpointError
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.loader import load_state_dict
from tests.tiny_configs import KIMI_K3, LLAMA

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# hidden 72, intermediate 200: gate/up [200, 72], down [72, 200]; 6 query heads, 1 KV head (tp 3 replicates it)
LLAMA_200 = {
    **LLAMA,
    "hidden_size": 72,
    "intermediate_size": 200,
    "num_attention_heads": 6,
    "num_key_value_heads": 1,
    "head_dim": 12,
    "num_hidden_layers": 2,
    "tie_word_embeddings": False,
}
QUANTISED = {  # weight -> fp8 dtype written
    "model.layers.0.mlp.gate_proj.weight": torch.float8_e4m3fn,
    "model.layers.0.mlp.up_proj.weight": torch.float8_e4m3fn,
    "model.layers.0.mlp.down_proj.weight": torch.float8_e4m3fn,
    "model.layers.1.self_attn.o_proj.weight": torch.float8_e5m2,
    "model.layers.1.self_attn.q_proj.weight": torch.float8_e4m3fn,
}


def _write(d, raw: dict, tensors: dict, shards: int = 1):
    """config.json and the tensors, as model.safetensors or ``shards`` files with an index."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(raw))
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"))
        return d
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in names[s * per : (s + 1) * per]}, str(d / fn))
        weight_map.update({n: fn for n in names[s * per : (s + 1) * per]})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


def _blocks_of(scale: torch.Tensor, block, rows: int, cols: int) -> torch.Tensor:
    """scale [ceil(R/b0), ceil(C/b1)] spread to [R, C] by an explicit loop over the blocks."""
    out = torch.empty(rows, cols)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            out[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]] = scale[i, j]
    return out


def _fp8(w: torch.Tensor, block, fp8_dtype, scale_dtype):
    """(w_fp8, scale_inv, the dequantised weight): per block scale = amax / fp8 max (1 for an all-zero block)."""
    rows, cols = w.shape
    b0, b1 = min(block[0], rows), min(block[1], cols)
    nr, nc = -(-rows // block[0]), -(-cols // block[1])
    top = torch.finfo(fp8_dtype).max
    scale = torch.ones(nr, nc)
    for i in range(nr):
        for j in range(nc):
            amax = float(w[i * b0 : (i + 1) * b0, j * b1 : (j + 1) * b1].abs().max())
            scale[i, j] = amax / top if amax > 0 else 1.0
    scale = scale.to(scale_dtype)
    spread = _blocks_of(scale.float(), block, rows, cols)
    q = (w / spread).to(fp8_dtype)
    return q, scale, q.float() * spread


def _fp8_checkpoint(tmp_path, block, scale_dtype=torch.float32):
    """(cfg, dir, {param: expected fp32 value}) of LLAMA_200 with ``QUANTISED`` stored as fp8 in ``block``."""
    raw = {**LLAMA_200, "quantization_config": {"quant_method": "fp8", "weight_block_size": list(block)}}
    cfg = ModelConfig.from_hf_dict(raw)
    gen = torch.Generator().manual_seed(3)
    tensors, expect = {}, {}
    for spec in checkpoint_layout(cfg):
        (name,) = spec.names
        w = torch.randn(spec.hf_shape, generator=gen) * 0.1
        if name in QUANTISED:
            q, s, w = _fp8(w, block, QUANTISED[name], scale_dtype)
            tensors[name], tensors[name.replace(".weight", ".weight_scale_inv")] = q, s
        else:
            tensors[name] = w
        expect[spec.param] = w
    return cfg, _write(tmp_path / "fp8", raw, tensors, shards=2), expect


BLOCKS = [(128, 128), (1, 1), (7, 5), (3, 300), (256, 16)]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b[0]}x{b[1]}")
def test_fp8_weights_load_as_their_block_dequantised_values(tmp_path, block):
    """Catches a wrong block index in the whole-model loader's fp8 dequantisation (a block that does not
    divide the weight, a block larger than it, [1, 1] blocks, rows and columns swapped, e5m2 weights)."""
    cfg, d, expect = _fp8_checkpoint(tmp_path, block)
    got = load_state_dict(cfg, d, torch.float32)
    assert got.keys() == expect.keys()
    for k in expect:
        assert torch.equal(got[k], expect[k]), k


def test_fp8_bfloat16_scales_are_read_at_their_own_precision(tmp_path):
    """Catches bfloat16 ``weight_scale_inv`` blocks being misread (e.g. as float16 bits or rounded twice)."""
    cfg, d, expect = _fp8_checkpoint(tmp_path, (16, 8), torch.bfloat16)
    got = load_state_dict(cfg, d, torch.float32)
    for k in expect:
        assert torch.equal(got[k], expect[k]), k


def _split(n: int, parts: int, i: int) -> tuple[int, int]:
    """The i-th of ``parts`` contiguous parts of n, sizes differing by one, larger first (by hand)."""
    base, extra = divmod(n, parts)
    start = i * base + min(i, extra)
    return start, start + base + (i < extra)


@pytest.mark.parametrize("block", [(128, 128), (7, 5), (1, 1)], ids=lambda b: f"{b[0]}x{b[1]}")
def test_fp8_tp3_ranks_read_the_slices_of_the_dequantised_weights(tmp_path, block):
    """Catches the per-rank fp8 reader taking the wrong scale blocks when a rank's rows (gate/up 67/67/66)
    or columns (down, o_proj) start inside a block, or padding the vocabulary wrongly."""
    cfg, d, expect = _fp8_checkpoint(tmp_path, block)
    layout = Layout.make(tp=3)
    V = cfg.vocab_size
    rows = -(-V // 3)
    for r in range(3):
        st = load_rank_state(cfg, layout, r, d, torch.float32)
        lo, hi = _split(200, 3, r)
        assert torch.equal(st["layers.0.mlp.gate_proj.weight"], expect["layers.0.mlp.gate_proj.weight"][lo:hi])
        assert torch.equal(st["layers.0.mlp.up_proj.weight"], expect["layers.0.mlp.up_proj.weight"][lo:hi])
        assert torch.equal(st["layers.0.mlp.down_proj.weight"], expect["layers.0.mlp.down_proj.weight"][:, lo:hi])
        heads = slice(r * 2 * 12, (r + 1) * 2 * 12)  # 2 query heads of 12 a rank
        assert torch.equal(st["layers.1.self_attn.q_proj.weight"], expect["layers.1.self_attn.q_proj.weight"][heads])
        assert torch.equal(st["layers.1.self_attn.o_proj.weight"], expect["layers.1.self_attn.o_proj.weight"][:, heads])
        assert torch.equal(st["layers.1.self_attn.k_proj.weight"], expect["layers.1.self_attn.k_proj.weight"])
        emb = expect["embed_tokens.weight"][r * rows : min((r + 1) * rows, V)]
        want = torch.cat([emb, torch.zeros(rows - emb.shape[0], emb.shape[1])])
        assert torch.equal(st["embed_tokens.weight"], want)


def test_a_model_on_fp8_weights_gives_the_logits_of_a_plain_copy(tmp_path):
    """Catches the fp8 path feeding the model anything but the dequantised weights (compared with the same
    model loaded from a plain fp32 checkpoint of the values this file's math gives)."""
    cfg, d, expect = _fp8_checkpoint(tmp_path, (7, 5))
    plain_cfg = ModelConfig.from_hf_dict(LLAMA_200)
    tensors = {s.names[0]: expect[s.param].reshape(s.hf_shape).contiguous() for s in checkpoint_layout(plain_cfg)}
    plain = _write(tmp_path / "plain", LLAMA_200, tensors)
    ids = torch.tensor([[3, 17, 5, 99, 42, 7, 11]])
    with torch.no_grad():
        a = load_model(cfg, d)(ids)
        b = load_model(plain_cfg, plain)(ids)
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- MXFP4


def _mxfp4_values(packed: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:
    """Plain loops over reference/kimi-k3.md: element c of row n = E2M1(nibble c) * 2^(scale[n][c // 32] - 127),
    the low nibble of byte c // 2 holding the even element."""
    p, s = packed.tolist(), scale.tolist()
    out = []
    for n in range(len(p)):
        row = []
        for c in range(k):
            code = p[n][c // 2] & 0xF if c % 2 == 0 else p[n][c // 2] >> 4
            sign = -1.0 if code & 8 else 1.0
            row.append(sign * E2M1[code & 7] * 2.0 ** (s[n][c // 32] - 127))
        out.append(row)
    return torch.tensor(out)


def _k3(mxfp4: bool) -> dict:
    raw = copy.deepcopy(KIMI_K3)
    # routed experts [21, 70] / [70, 21]: a ragged last group of 6, odd K = 21; 5 experts (ep 2: 3 + 2)
    raw["text_config"].update({"moe_intermediate_size": 21, "routed_expert_hidden_size": 70, "num_experts": 5})
    if mxfp4:
        raw["text_config"]["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "mxfp4-pack-quantized",
        }
    return raw


def test_mxfp4_experts_load_as_written_and_run_as_their_decoded_values(tmp_path):
    """Catches packed MXFP4 bytes or E8M0 scales being reordered or altered on load (whole model and --ep 2
    ranks), and the model decoding them other than as the format says (a ragged group, odd K, 5 experts):
    its logits must be those of a plain model holding this file's loop-decoded expert weights."""
    raw, plain_raw = _k3(True), _k3(False)
    cfg, plain_cfg = ModelConfig.from_hf_dict(raw), ModelConfig.from_hf_dict(plain_raw)
    gen = torch.Generator().manual_seed(5)
    tensors, plain = {}, {}
    for spec in checkpoint_layout(cfg):
        for name in spec.names:
            if spec.init == "mxfp4_packed":
                tensors[name] = torch.randint(0, 256, spec.hf_shape, generator=gen, dtype=torch.uint8)
            elif spec.init == "mxfp4_scale":
                tensors[name] = torch.randint(118, 128, spec.hf_shape, generator=gen, dtype=torch.uint8)
            else:
                tensors[name] = plain[name] = torch.randn(spec.hf_shape, generator=gen) * 0.1
    for name in tensors:
        if name.endswith(".weight_packed"):
            base = name.removesuffix("_packed")
            k = 70 if ".w2." not in name else 21
            plain[base] = _mxfp4_values(tensors[name], tensors[base + "_scale"], k)
    d = _write(tmp_path / "mx", raw, tensors, shards=2)
    p = _write(tmp_path / "plain", plain_raw, plain)
    state = load_state_dict(cfg, d, torch.float32)
    w1 = "block_sparse_moe.experts.{}.w1.weight_packed"
    name = cfg.weight_prefix + "layers.1." + w1
    assert torch.equal(
        state["layers.1.mlp.experts.w1_packed"], torch.stack([tensors[name.format(e)] for e in range(5)])
    )
    for r, experts in enumerate(((0, 1, 2), (3, 4))):
        part = load_rank_state(cfg, Layout.make(ep=2), r, d, torch.float32)
        assert torch.equal(
            part["layers.1.mlp.experts.w1_packed"], torch.stack([tensors[name.format(e)] for e in experts])
        )
        scale = name.format("{}").replace("_packed", "_scale")
        want = torch.stack([tensors[scale.format(e)] for e in experts])
        assert torch.equal(part["layers.1.mlp.experts.w1_scale"], want)
    ids = torch.tensor([[3, 17, 5, 99, 42, 7, 11]])
    with torch.no_grad():
        a = load_model(cfg, d)(ids)
        b = load_model(plain_cfg, p)(ids)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_tensor_stored_in_two_indexed_shards_is_refused_naming_it_and_both_files(tmp_path):
    """Catches a tensor that two shards of an indexed checkpoint hold (with different values) being loaded
    from one of them silently: a broken or mixed download."""
    cfg, d, _ = _fp8_checkpoint(tmp_path, (16, 8))
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.0.mlp.gate_proj.weight"
    other = next(f for f in sorted(set(weight_map.values())) if f != weight_map[name])
    from safetensors.torch import load_file

    held = load_file(str(d / other))
    held[name] = torch.zeros(200, 72).to(torch.float8_e4m3fn)
    save_file(held, str(d / other))
    for load in (
        lambda: load_state_dict(cfg, d, torch.float32),
        lambda: load_rank_state(cfg, Layout.make(tp=3), 2, d, torch.float32),
    ):
        with pytest.raises(CheckpointError, match=rf"'{name}' appears in both") as err:
            load()
        assert weight_map[name] in str(err.value) and other in str(err.value)
