"""A tiny untied transformers Llama saved as a checkpoint: an oracle whose greedy tokens vary (the tied tiny
random Llama repeats its last prompt token, which hides cache and batching bugs)."""

from __future__ import annotations

from pathlib import Path

import torch


def untied_llama(out_dir: Path, vocab_size: int):
    """(transformers LlamaForCausalLM, checkpoint dir): 2 GQA layers (4 query heads, 2 KV heads of 8), hidden
    32, 64 positions, untied head, weights drawn N(0, 0.3²) so logits are far from uniform (greedy tokens
    vary and rarely tie; a misplaced target shows in a loss)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(std=0.3)
    out = Path(out_dir) / "llama"
    model.save_pretrained(out, safe_serialization=True)
    return model, out
