"""Write a trained ``CausalLM`` as an HF-layout checkpoint directory.

Files: ``config.json`` (the family format, ``cfg.to_hf_dict()``), ``model.safetensors`` (every tensor
under its HF name from ``checkpoint_layout``: stacked experts split per expert, float weights in
``dtype`` and ``fp32``-kind tensors -- router weight and bias, A_log, dt_bias -- in float32, exactly
what ``nonstop synth`` writes and ``load_model`` reads), ``generation_config.json`` and the
tokenizer files copied from ``tokenizer_dir``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.write import SIDE_FILES, staged_checkpoint, write_side_files


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


def save_checkpoint(
    model: torch.nn.Module,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    dtype: torch.dtype = torch.bfloat16,
    max_new_tokens: int = 64,
) -> Path:
    """Write ``model`` (a ``CausalLM``) to ``out_dir``, staged (``weights.write``: it replaces the weights
    and side files of a checkpoint already there, sharded or not, only once every file is written; an old
    tokenizer file ``tokenizer_dir`` has no new one for is removed); returns the directory."""
    from safetensors.torch import save_file

    cfg: ModelConfig = model.cfg
    out_dir = Path(out_dir)
    with staged_checkpoint(out_dir, replaces=SIDE_FILES) as stage:
        # a default that fits the context (the loader refuses max_new_tokens >= max_position_embeddings)
        room = max(1, min(max_new_tokens, cfg.max_position_embeddings - 1))
        greedy = {"do_sample": False, "max_new_tokens": room}
        write_side_files(stage, cfg, dtype, greedy, Path(tokenizer_dir) if tokenizer_dir is not None else None)
        tensors = hf_tensors(cfg, model.state_dict(), dtype)
        save_file(tensors, str(stage / "model.safetensors"), metadata={"format": "pt"})
    return out_dir
