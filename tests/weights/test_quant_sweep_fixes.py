"""Quantised checkpoints as the format notes define them, and every broken one refused with the tensor and
file (or config field) named: fp8 block scales (DeepSeek-V3 / Kimi K2 ``weight_scale_inv``, float only),
MXFP4 experts (Kimi K3: E8M0 scale bytes, groups of 32), ``quantization_config`` checked for every family.

Expected weights are dequantised here from the spec, element by element, never by nonstop's functions."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.config_types import ConfigError
from nonstop.dist import Layout
from nonstop.dist.load import load_rank_state
from nonstop.dist.shard import rank_shards
from nonstop.model.build import load_model
from nonstop.weights.errors import CheckpointError
from nonstop.weights.loader import load_state_dict
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import DEEPSEEK, KIMI_K3_MXFP4, LLAMA

FP8_NAME = "model.layers.0.self_attn.q_b_proj.weight"  # [3 heads x 16, 22]: odd against blocks of 16 x 8
FP8_SCALE = FP8_NAME.replace(".weight", ".weight_scale_inv")
FP8_BLOCK = [16, 8]
EXPERT_SCALE = "language_model.model.layers.1.block_sparse_moe.experts.{e}.w2.weight_scale"
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _rewrite(path, change):
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


def _edit_config(ckpt, change):
    cfg_path = ckpt / "config.json"
    raw = json.loads(cfg_path.read_text())
    change(raw)
    cfg_path.write_text(json.dumps(raw))
    return ModelConfig.from_file(ckpt)


def _fp8_checkpoint(tmp_path, raw=DEEPSEEK, name=FP8_NAME, scale_dtype=torch.float32, scale_fill=None):
    """A float32 checkpoint of ``raw`` whose ``name`` is fp8 e4m3 with ``FP8_BLOCK`` block scales (a
    different power-of-two-ish scale per block, or ``scale_fill``) of ``scale_dtype``; returns (cfg, dir)."""
    cfg0 = ModelConfig.from_hf_dict(raw)
    ckpt = write_checkpoint(cfg0, tmp_path / "fp8", seed=3, dtype=torch.float32)

    def to_fp8(t):
        w = t[name]
        rows, cols = -(-w.shape[0] // FP8_BLOCK[0]), -(-w.shape[1] // FP8_BLOCK[1])
        scale = torch.arange(1, rows * cols + 1, dtype=torch.float32).reshape(rows, cols) / 256
        if scale_fill is not None:
            scale.fill_(scale_fill)
        t[name] = (w * 64).to(torch.float8_e4m3fn)
        t[name.replace(".weight", ".weight_scale_inv")] = scale.to(scale_dtype)

    _rewrite(ckpt / "model.safetensors", to_fp8)
    cfg = _edit_config(
        ckpt, lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": FP8_BLOCK})
    )
    return cfg, ckpt


def _spec_fp8(ckpt, name=FP8_NAME):
    """w[i, j] = fp8[i, j] * scale_inv[i // 16, j // 8], one element at a time (the DeepSeek-V3 rule)."""
    t = load_file(str(ckpt / "model.safetensors"))
    w, s = t[name].float(), t[name.replace(".weight", ".weight_scale_inv")].float()
    out = torch.empty_like(w)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            out[i, j] = w[i, j] * s[i // FP8_BLOCK[0], j // FP8_BLOCK[1]]
    return out


def _all_loaders(cfg, ckpt):
    """Each way a checkpoint is read: the whole model, a rank's part (tp 1: the whole tensor), info's headers."""
    yield lambda: load_state_dict(cfg, ckpt, torch.float32)
    yield lambda: load_rank_state(cfg, Layout.make(1, 1), 0, ckpt, torch.float32)


def _refused_by_info(ckpt, message, capsys):
    """``nonstop info -m ckpt`` exits 2 with one ``nonstop: error:`` line holding ``message``."""
    with pytest.raises(SystemExit) as exit_:
        main(["info", "-m", str(ckpt)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("nonstop: error: ") and err.count("\n") == 1, err
    assert message in err, err


# ----------------------------------------------------------------------------- 1. fp8 scale dtypes


@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float16])
def test_fp8_scales_in_half_precision_dequantise_as_the_spec_says(tmp_path, scale_dtype):
    cfg, ckpt = _fp8_checkpoint(tmp_path, scale_dtype=scale_dtype)
    want = _spec_fp8(ckpt)
    for load in _all_loaders(cfg, ckpt):
        torch.testing.assert_close(load()["layers.0.self_attn.q_b_proj.weight"], want, rtol=0, atol=0)


@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.int32, torch.int8])
def test_integer_fp8_scales_are_refused_naming_scale_file_and_dtype(tmp_path, scale_dtype, capsys):
    cfg, ckpt = _fp8_checkpoint(tmp_path, scale_dtype=scale_dtype, scale_fill=114)
    pattern = f"'{FP8_SCALE}' in model.safetensors has dtype {scale_dtype}, expected one of torch.float32"
    for load in _all_loaders(cfg, ckpt):
        with pytest.raises(CheckpointError, match=pattern):
            load()
    _refused_by_info(ckpt, f"'{FP8_SCALE}' in model.safetensors has dtype {scale_dtype}", capsys)


def test_fp8_block_size_of_a_llama_checkpoint_is_read(tmp_path):
    cfg, ckpt = _fp8_checkpoint(tmp_path, raw=LLAMA, name="model.layers.1.mlp.down_proj.weight")
    want = _spec_fp8(ckpt, "model.layers.1.mlp.down_proj.weight")  # [40, 68]: 68 is no multiple of 8
    got = load_state_dict(cfg, ckpt, torch.float32)["layers.1.mlp.down_proj.weight"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)


# ----------------------------------------------------------------------------- 5. fp8 scales named


def test_an_overflowing_fp8_scale_is_named_with_its_largest_value(tmp_path):
    cfg, ckpt = _fp8_checkpoint(tmp_path, scale_fill=1e37)  # finite, but 448 * 1e37 overflows float32

    def largest_fp8(t):
        t[FP8_NAME][5, 9] = 448.0

    _rewrite(ckpt / "model.safetensors", largest_fp8)
    for load in _all_loaders(cfg, ckpt):
        with pytest.raises(CheckpointError, match=rf"'{FP8_SCALE}' in model.safetensors holds scales up to 1e\+37"):
            load()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_infinite_fp8_scale_is_named_on_every_path(tmp_path, bad):
    cfg, ckpt = _fp8_checkpoint(tmp_path)

    def poison(t):
        t[FP8_SCALE][1, 2] = bad

    _rewrite(ckpt / "model.safetensors", poison)
    for load in _all_loaders(cfg, ckpt):
        with pytest.raises(CheckpointError, match=rf"'{FP8_SCALE}' in model.safetensors holds 1 NaN or infinite"):
            load()


# ----------------------------------------------------------------------------- 2. MXFP4 scale bytes


def _mxfp4_checkpoint(tmp_path):
    cfg = ModelConfig.from_hf_dict(KIMI_K3_MXFP4)
    return cfg, write_checkpoint(cfg, tmp_path / "mx", seed=7, dtype=torch.float32)


@pytest.mark.parametrize("byte,count", [(255, 1), (254, 3), (241, 2)])
def test_mxfp4_scale_bytes_above_240_are_refused_with_value_and_count(tmp_path, byte, count):
    cfg, ckpt = _mxfp4_checkpoint(tmp_path)
    name = EXPERT_SCALE.format(e=4)

    def poison(t):
        t[name].view(-1)[[0, 7, 11][:count]] = torch.tensor([byte, 241, 241][:count], dtype=torch.uint8)

    _rewrite(ckpt / "model.safetensors", poison)
    pattern = f"'{name}' in model.safetensors holds {count} MXFP4 scale byte\\(s\\) above 240, the largest {byte}"
    for load in _all_loaders(cfg, ckpt):
        with pytest.raises(CheckpointError, match=pattern):
            load()
    layout = Layout.make(1, 3)
    for rank in range(layout.world):  # expert parallel: only the rank holding expert 4 reads its bytes
        holds = any(4 in (s.experts or ()) for s in rank_shards(cfg, layout, rank) if s.spec.param.endswith("w2_scale"))
        if holds:
            with pytest.raises(CheckpointError, match=pattern):
                load_rank_state(cfg, layout, rank, ckpt, torch.float32)
        else:
            load_rank_state(cfg, layout, rank, ckpt, torch.float32)


def _spec_mxfp4(packed, scale, k):
    """w[n, j] = E2M1(nibble j of row n) * 2^(scale[n, j // 32] - 127), low nibble first (OCP MXFP4)."""
    out = torch.empty(packed.shape[0], k, dtype=torch.float64)
    for n in range(packed.shape[0]):
        for j in range(k):
            code = (int(packed[n, j // 2]) >> (4 * (j % 2))) & 0xF
            value = E2M1[code & 7] * (-1 if code & 8 else 1)
            out[n, j] = value * 2.0 ** (int(scale[n, j // 32]) - 127)
    return out


def test_the_highest_allowed_scale_byte_gives_the_same_logits_on_every_backend(tmp_path):
    """Scale 240 on a group of zero codes (a quantiser may give an all-zero group any scale) in every expert:
    every backend reads 0 there. One byte more and the GPU decoder reads 0 * inf = NaN: the loader's bound."""
    from nonstop.cache.state import ModelCache
    from nonstop.runtime.cpu import CPUExecutor
    from nonstop.runtime.superop import SuperOpExecutor

    cfg, ckpt = _mxfp4_checkpoint(tmp_path)
    packed_name = EXPERT_SCALE.format(e=0).replace("weight_scale", "weight_packed")
    files = {}

    def zero_group(t):
        for e in range(cfg.moe.num_experts):  # inputs 0..31 of every row of each expert's w2: codes 0, scale 240
            t[EXPERT_SCALE.format(e=e).replace("weight_scale", "weight_packed")][:, :16] = 0
            t[EXPERT_SCALE.format(e=e)][:, 0] = 240
        files.update(t)

    _rewrite(ckpt / "model.safetensors", zero_group)
    model = load_model(cfg, ckpt, torch.float32)
    want = _spec_mxfp4(files[packed_name], files[EXPERT_SCALE.format(e=0)], cfg.moe.intermediate_size)
    assert torch.isfinite(want).all() and want[:, :32].abs().max() == 0
    got = model.layers[1].mlp.experts.weight("w2", 0, torch.float32)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0)

    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])

    def logits(forward):
        cache = ModelCache(cfg, 1, capacity=8, page_size=4)
        batch = cache.batch([0], prompt.shape[1])
        return forward(prompt, cache, batch)

    want_logits = logits(model.forward)
    assert torch.isfinite(want_logits).all()
    executors = [CPUExecutor(model, compile=False, progress=False), SuperOpExecutor(model)]
    for ex in executors:
        torch.testing.assert_close(logits(ex.forward), want_logits, rtol=1e-4, atol=1e-4)

    model.layers[1].mlp.experts.w2_scale[:, :, 0] = 241  # past the bound: what the loader refuses
    assert torch.isfinite(logits(model.forward)).all()
    assert torch.isnan(logits(SuperOpExecutor(model).forward)).any()


# ----------------------------------------------------------------------------- 3, 6. quantization_config


def _with_quant(raw, quant):
    """``raw`` with ``quant`` as its quantization_config where its family keeps it (kimi_k3: text_config)."""
    raw = json.loads(json.dumps(raw))
    (raw["text_config"] if raw["model_type"] == "kimi_k3" else raw)["quantization_config"] = quant
    return raw


MXFP4_GROUP = {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group", "scale_dtype": "torch.uint8"}
MXFP4_RELEASE = {
    "quant_method": "compressed-tensors",
    "format": "mxfp4-pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": MXFP4_GROUP, "format": "mxfp4-pack-quantized"}},
    "quantization_status": "compressed",
}
INT4_RELEASE = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 32}}},
}


@pytest.mark.parametrize("raw", [LLAMA, DEEPSEEK, KIMI_K3_MXFP4], ids=["llama", "deepseek_v3", "kimi_k3"])
@pytest.mark.parametrize(
    "quant,message",
    [
        ({"quant_method": "fp8", "weight_block_size": [0, 0]}, "weight_block_size' must be two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": "16"}, "weight_block_size' must be two positive integers"),
        ({"quant_method": "fp8", "weight_block_size": [128, True]}, "weight_block_size' must be two positive"),
        ([1, 2], "quantization_config' must be an object, got [1, 2]"),
        ({"quant_method": "gptq", "bits": 4}, "unsupported .*quantization_config format 'gptq'"),
    ],
)
def test_quantization_config_is_checked_for_every_family(raw, quant, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ModelConfig.from_hf_dict(_with_quant(raw, quant))


@pytest.mark.parametrize("quant", [MXFP4_RELEASE, INT4_RELEASE], ids=["mxfp4", "int4"])
def test_experts_formats_on_a_model_without_experts_are_refused(quant):
    with pytest.raises(ConfigError, match="quantization_config format .* quantises routed experts, but this llama"):
        ModelConfig.from_hf_dict(_with_quant(LLAMA, quant))


@pytest.mark.parametrize(
    "field,value",
    [("group_size", 16), ("group_size", 64), ("num_bits", 8), ("type", "int"), ("scale_dtype", "torch.bfloat16")],
)
def test_mxfp4_weight_settings_other_than_the_format_are_refused(field, value):
    quant = json.loads(json.dumps(MXFP4_RELEASE))
    quant["config_groups"]["group_0"]["weights"][field] = value
    name = f"text_config.quantization_config.config_groups.group_0.weights.{field}"
    with pytest.raises(ConfigError, match=f"field '{name}' is {value!r}"):
        ModelConfig.from_hf_dict(_with_quant(KIMI_K3_MXFP4, quant))


def test_mxfp4_release_config_is_read_in_text_config_or_at_the_top():
    assert ModelConfig.from_hf_dict(_with_quant(KIMI_K3_MXFP4, MXFP4_RELEASE)).moe.expert_format == "mxfp4"
    top = json.loads(json.dumps(KIMI_K3_MXFP4))
    top["quantization_config"] = top["text_config"].pop("quantization_config")
    assert ModelConfig.from_hf_dict(top).moe.expert_format == "mxfp4"


# ----------------------------------------------------------------------------- 4. info on int4 experts


def test_info_on_an_int4_checkpoint_says_int4_experts_are_not_run(tmp_path, capsys):
    cfg = ModelConfig.from_hf_dict(DEEPSEEK)
    ckpt = write_checkpoint(cfg, tmp_path / "int4", seed=2, dtype=torch.float32)

    def to_int4(t):  # Kimi K2 Thinking's names: weight_packed int32 (8 codes each), weight_scale, weight_shape
        for name in [n for n in t if ".experts." in n and n.endswith(".weight")]:
            n, k = t.pop(name).shape
            base = name.removesuffix(".weight")
            t[f"{base}.weight_packed"] = torch.zeros(n, -(-k // 8), dtype=torch.int32)
            t[f"{base}.weight_scale"] = torch.ones(n, -(-k // 32), dtype=torch.bfloat16)
            t[f"{base}.weight_shape"] = torch.tensor([n, k], dtype=torch.int32)

    _rewrite(ckpt / "model.safetensors", to_int4)
    _edit_config(ckpt, lambda c: c.update(quantization_config=INT4_RELEASE))
    _refused_by_info(ckpt, "int4 routed experts are not run by this engine", capsys)


# ----------------------------------------------------------------------------- 7. synth's config.json


def test_synth_keeps_only_the_quantization_config_of_what_it_writes(tmp_path):
    fp8 = ModelConfig.from_hf_dict(_with_quant(DEEPSEEK, {"quant_method": "fp8", "weight_block_size": [16, 8]}))
    out = write_checkpoint(fp8, tmp_path / "fp8", seed=1, dtype=torch.float32)
    assert "quantization_config" not in json.loads((out / "config.json").read_text())  # float weights, no scales
    assert not [n for n in load_file(str(out / "model.safetensors")) if n.endswith("_scale_inv")]
    mx = ModelConfig.from_hf_dict(_with_quant(KIMI_K3_MXFP4, MXFP4_RELEASE))
    out = write_checkpoint(mx, tmp_path / "mx", seed=1, dtype=torch.float32)
    written = json.loads((out / "config.json").read_text())["text_config"]["quantization_config"]
    assert written == MXFP4_RELEASE and ModelConfig.from_file(out).moe.expert_format == "mxfp4"
