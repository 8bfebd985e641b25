"""Tiny random-weight checkpoints for engine and server tests: a K3-shaped hybrid (KDA + one gated
MLA layer, latent MoE, attention residuals) and a Llama-style GQA model, both with a byte tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent
TINY_MODELS = {"k3": CONFIG_DIR / "tiny_k3.json", "llama": CONFIG_DIR / "tiny_llama.json"}

# A chat template in the style of a tokenizer_config.json (jinja), for the chat-template path.
TEST_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def synth_checkpoint(name: str, out_dir: Path, seed: int = 0, chat_template: str | None = None) -> Path:
    """Write the tiny model ``name`` (k3 | llama) with fp32 random weights to ``out_dir``."""
    from nonstop.config import ModelConfig
    from nonstop.weights.synth import write_checkpoint

    cfg = ModelConfig.from_file(TINY_MODELS[name])
    write_checkpoint(cfg, out_dir, seed=seed, dtype=torch.float32)
    if chat_template is not None:
        (Path(out_dir) / "tokenizer_config.json").write_text(json.dumps({"chat_template": chat_template}))
    return Path(out_dir)
