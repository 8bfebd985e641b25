"""Black-box gaps: absurd sizes in config.json must give one clear line and exit status 2, never an attempt to
allocate terabytes that ends as "internal error" (status 1).

Each command runs in a child process with its address space capped (RLIMIT_AS), so that on a host that
overcommits memory a regression fails the test instead of the machine."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tiny_configs import (
    DEEPSEEK,
    KIMI_K3,
    KIMI_LINEAR_LAYER_TYPES,
    KIMI_LINEAR_RELEASE,
    LLAMA,
)

ROOT = Path(__file__).resolve().parents[1]
HUGE = 10**12
CAP = 16 << 30  # bytes of address space the child may map


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def nonstop(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NONSTOP_THREADS": "1"}
    env.pop("NONSTOP_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "nonstop.cli", *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_cap,
    )


def _config(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("base", "field"),
    [
        (LLAMA, "head_dim"),
        (DEEPSEEK, "qk_rope_head_dim"),
        (KIMI_LINEAR_LAYER_TYPES, "linear_head_dim"),
    ],
    ids=["llama-head_dim", "deepseek-qk_rope_head_dim", "kimi_linear-linear_head_dim"],
)
def test_synth_refuses_an_absurd_head_dim_as_a_config_error(tmp_path, base, field):
    """DEFECT: a head dim of 10**12 passes config parsing (only num_hidden_layers / num_experts have upper
    limits), and costing the model builds its RoPE table (``rope_inv_freq``: an arange of head_dim / 2 on the
    CPU, even for the meta model) or a KDA tensor: synth / info / program / generate try to allocate 4 TB and
    end with 'internal error: RuntimeError ... can't allocate memory' (status 1). Expected: a ConfigError
    naming the field, status 2."""
    cfg = _config(tmp_path, {**base, field: HUGE})
    proc = nonstop("synth", "--config", str(cfg), "--out", str(tmp_path / "out"), "--no-preflight")
    assert "internal error" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("nonstop: error:") and field in proc.stderr


@pytest.mark.timeout(150)
@pytest.mark.parametrize("field", ["num_shared_experts", "linear_conv_kernel_dim"])
def test_program_of_an_absurd_config_never_allocates_it(tmp_path, field):
    """DEFECT: ``nonstop program`` counts the eager ops of a model too large to build on a "narrow twin",
    but the twin keeps ``num_shared_experts`` and ``linear_conv_kernel_dim`` as given, so 10**12 of either
    makes it draw random weights of petabytes and end as 'internal error' (status 1). Expected: a clear error
    (status 2) or the program printed from the meta model (status 0)."""
    base = KIMI_LINEAR_RELEASE if field == "num_shared_experts" else KIMI_LINEAR_LAYER_TYPES
    _config(tmp_path, {**base, field: HUGE})
    proc = nonstop("program", "-m", str(tmp_path))
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr


@pytest.mark.timeout(200)
def test_fp8_weight_block_size_absurd_is_refused_before_dequantising(tmp_path):
    """DEFECT: ``quantization_config.weight_block_size`` is checked only to be two positive integers, and
    ``_dequantize_fp8`` expands the scales with ``repeat_interleave(block)`` before slicing them to the weight's
    shape: a block of [10**12, 10**12] (one scale per weight, a valid [1, 1] scale tensor) makes generate
    allocate 4 TB and end as 'internal error' (status 1). Expected: status 2 naming weight_block_size, or the
    weight dequantised in its own size (status 0)."""
    from safetensors.torch import load_file, save_file

    ck = tmp_path / "ck"
    cfg = _config(tmp_path, {**LLAMA, "vocab_size": 256})
    made = nonstop(
        "synth",
        "--config",
        str(cfg),
        "--out",
        str(ck),
        "--dtype",
        "float32",
        "--no-preflight",
    )
    assert made.returncode == 0, made.stderr
    tensors = load_file(ck / "model.safetensors")
    name = "model.layers.0.mlp.gate_proj.weight"
    scale = tensors[name].abs().max() / 448
    tensors[name] = (tensors[name] / scale).to(torch.float8_e4m3fn)
    tensors[name.replace(".weight", ".weight_scale_inv")] = scale.reshape(1, 1).float()
    save_file(tensors, ck / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((ck / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [HUGE, HUGE],
    }
    (ck / "config.json").write_text(json.dumps(config))
    proc = nonstop(
        "generate",
        "-m",
        str(ck),
        "--backend",
        "reference",
        "-n",
        "2",
        "--no-preflight",
        "hi",
    )
    assert "internal error" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert "weight_block_size" in proc.stderr


def _with(base: dict, path: str, value) -> dict:
    """``base`` with the field at dotted ``path`` (e.g. "text_config.v_head_dim") set to ``value``."""
    import copy

    cfg = copy.deepcopy(base)
    *outer, last = path.split(".")
    inner = cfg
    for key in outer:
        inner = inner[key]
    inner[last] = value
    return cfg


@pytest.mark.parametrize(
    ("base", "path"),
    [
        (LLAMA, "head_dim"),
        (DEEPSEEK, "qk_nope_head_dim"),
        (DEEPSEEK, "v_head_dim"),
        (KIMI_K3, "text_config.qk_nope_head_dim"),
        (KIMI_K3, "text_config.v_head_dim"),
        (KIMI_K3, "text_config.linear_attn_config.head_dim"),
    ],
)
def test_every_head_width_has_a_limit(base, path):
    """A head width above the limit is a ConfigError naming the field (with its path in a K3 text_config);
    the limit itself is accepted. Every such width sizes a RoPE table or a KDA state per head."""
    from nonstop.config import ConfigError, ModelConfig
    from nonstop.config_parse import MAX_HEAD_DIM

    field = path.split(".")[-1]
    with pytest.raises(ConfigError, match=rf"{field}.* is {MAX_HEAD_DIM + 2}: more than any model has"):
        ModelConfig.from_hf_dict(_with(base, path, MAX_HEAD_DIM + 2))
    ModelConfig.from_hf_dict(_with(base, path, MAX_HEAD_DIM))


def test_a_head_width_derived_from_the_hidden_size_has_the_limit_too():
    """Without head_dim, llama's is hidden_size / num_attention_heads: 5 * 2**20 / 5 is refused as well."""
    from nonstop.config import ConfigError, ModelConfig

    cfg = {k: v for k, v in LLAMA.items() if k != "head_dim"}
    with pytest.raises(ConfigError, match=r"'head_dim' is 1048576: more than any model has"):
        ModelConfig.from_hf_dict({**cfg, "hidden_size": 5 << 20})
