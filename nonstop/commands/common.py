"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse


def add_model_args(p: argparse.ArgumentParser, backend: bool = True) -> None:
    p.add_argument("--model", "-m", default="k3-nano", help="checkpoint directory (HF config.json + safetensors), a bundled model (k3-nano, the default) or a preset name (random weights)")
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 | auto (fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    if backend:
        p.add_argument(
            "--backend",
            default="auto",
            choices=["auto", "reference", "superop", "megakernel", "cpu", "cpu-bf16", "cpu-int8"],
            help="executor: auto (cpu on a CPU, reference elsewhere), reference (plain torch, the oracle), superop "
            "(Triton super-operators), megakernel (one persistent kernel), cpu (the step compiled for CPUs; the "
            "first use of a step shape compiles, cached under ~/.cache/nonstop), cpu-bf16 / cpu-int8 (the same "
            "with 16-bit / 8-bit weight-only quantised weights)",
        )


def parse_token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"token ids must be integers separated by commas or spaces, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("give at least one token id")
    return ids


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_spec_args(p: argparse.ArgumentParser) -> None:
    """--speculative / --num-draft-tokens (see ``nonstop.engine.spec``)."""
    p.add_argument("--speculative", choices=["ngram", "dspark"], default=None, help="speculative decoding: draft tokens with prompt lookup (ngram) or the model's DSpark drafter (dspark) and verify them in one step; outputs stay those of plain decoding")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="tokens drafted per step with --speculative (default 4; 0..15)")


def spec_from_args(args) -> dict | None:
    """The ``LLM(speculative=...)`` dict for the parsed flags (None without --speculative)."""
    if args.speculative is None:
        return None
    return {"method": args.speculative, "num_tokens": args.num_draft_tokens}
