"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse

from nonstop.program.ir import MAX_STEP_ROWS


def add_model_args(p: argparse.ArgumentParser, backend: bool = True) -> None:
    p.add_argument(
        "--model",
        "-m",
        default="k3-nano",
        help=(
            "checkpoint directory (HF config.json + safetensors), a bundled model (k3-nano, the default) or a preset "
            "name (random weights)"
        ),
    )
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 | auto (fp32 on CPU, bf16 on CUDA)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    if backend:
        p.add_argument(
            "--backend",
            default="reference",
            choices=["reference", "superop", "megakernel"],
            help=(
                "executor: reference (plain torch), superop (Triton super-operators), megakernel (one persistent "
                "kernel)"
            ),
        )


def parse_token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"token ids must be integers separated by commas or spaces, got {text!r}"
        ) from None
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
    """--speculative / --num-draft-tokens (see ``nonstop.engine.speculative``)."""
    p.add_argument(
        "--speculative",
        choices=["ngram", "dspark"],
        default=None,
        help=(
            "speculative decoding: draft tokens with prompt lookup (ngram) or the model's DSpark drafter (dspark) and "
            "verify them in one step; outputs stay those of plain decoding"
        ),
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=4,
        help=f"tokens drafted per step with --speculative (default 4; 0..{MAX_STEP_ROWS - 1})",
    )


def spec_from_args(args) -> dict | None:
    """The ``LLM(speculative=...)`` dict for the parsed flags (None without --speculative)."""
    if args.speculative is None:
        return None
    return {"method": args.speculative, "num_tokens": args.num_draft_tokens}


def human(n: float, unit: str = "") -> str:
    """``n`` with 3 significant digits and a K/M/G/T/P suffix (powers of 1000), e.g. 9.06M, 18.1MB."""
    for suffix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}" if suffix else f"{n:.0f}{unit}"
        n /= 1000
    return f"{n:.3g}P{unit}"
