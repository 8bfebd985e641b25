"""Write a trained ``CausalLM`` as an HF-layout checkpoint directory.

Files: ``config.json`` (the family format, ``cfg.to_hf_dict()``), ``model.safetensors`` (every tensor
under its HF name from ``checkpoint_layout``: stacked experts split per expert, float weights in
``dtype`` and ``fp32``-kind tensors -- router weight and bias, A_log, dt_bias -- in float32, exactly
what ``nonstop synth`` writes and ``load_model`` reads), ``generation_config.json`` and the
tokenizer files copied from ``tokenizer_dir``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.write import staged_checkpoint

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def hf_tensors(
    cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """{HF name: tensor} for a model state dict {internal param: tensor} of ``cfg``."""
    out: dict[str, torch.Tensor] = {}
    for spec in checkpoint_layout(cfg):
        if spec.param not in state:
            raise KeyError(f"state dict has no parameter {spec.param!r}")
        t = state[spec.param].detach().cpu()
        target = spec.torch_dtype(dtype)
        parts = t.unbind(0) if len(spec.names) > 1 else [t]
        for name, part in zip(spec.names, parts):
            out[name] = part.reshape(spec.hf_shape).to(target).contiguous()
    return out


def generation_config(cfg: ModelConfig, max_new_tokens: int = 64) -> dict:
    """Greedy decoding defaults plus the special ids (HF ``generation_config.json`` keys)."""
    gen: dict = {"bos_token_id": cfg.bos_token_id, "pad_token_id": cfg.pad_token_id}
    if cfg.eos_token_ids:
        gen["eos_token_id"] = cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else list(cfg.eos_token_ids)
    gen.update({"do_sample": False, "max_new_tokens": max_new_tokens})
    return {k: v for k, v in gen.items() if v is not None}


def save_checkpoint(
    model: torch.nn.Module,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype = torch.bfloat16,
    max_new_tokens: int = 64,
) -> Path:
    """Write ``model`` (a ``CausalLM``) to ``out_dir``, staged (``weights.write``: it replaces the weights
    of a checkpoint already there, sharded or not, only once every file is written); returns the directory."""
    from safetensors.torch import save_file

    cfg: ModelConfig = model.cfg
    out_dir = Path(out_dir)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = DTYPE_NAMES[dtype]
    with staged_checkpoint(out_dir) as stage:
        (stage / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        gen = generation_config(cfg, max_new_tokens)
        (stage / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        tensors = hf_tensors(cfg, model.state_dict(), dtype)
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                if (Path(tokenizer_dir) / name).exists():
                    shutil.copy(Path(tokenizer_dir) / name, stage / name)
    return out_dir
