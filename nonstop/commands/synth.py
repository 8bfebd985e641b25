"""``nonstop synth``: write a random-weight checkpoint in a family's exact HF layout."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nonstop.commands.common import DTYPE_CHOICES, add_threads_arg, positive_float, positive_int, seed_int


def add_parser(sub) -> None:
    p = sub.add_parser(
        "synth",
        help="write a random-weight checkpoint",
        description=(
            "Write config.json, generation_config.json, a tokenizer and random weights with exactly the HF tensor "
            "names and shapes of the config, loadable by nonstop and by transformers' from_pretrained (llama, "
            "deepseek_v3, kimi_linear). The tokenizer is the preset's, else byte-level (token id = byte) when the "
            "vocabulary has 256 ids, else none: a smaller model takes token ids (generate --prompt-ids)."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="an HF config.json (or a directory holding one)")
    src.add_argument("--preset", help="a preset name (see `nonstop info --list`)")
    p.add_argument(
        "--out",
        required=True,
        help="output directory (made if missing); the weights (model.safetensors, model-NNNNN-of-NNNNN.safetensors, "
        "the index and the files it names), config.json, generation_config.json and tokenizer files of a checkpoint "
        "already there are replaced once the new ones are all written (removed where the new checkpoint has none), "
        "other files are left alone",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="float weight dtype on disk (default bfloat16)",
    )
    p.add_argument("--num-layers", type=positive_int, help="keep only the first N layers (a slice of a large model)")
    p.add_argument(
        "--shard-size",
        type=positive_float,
        default=4.0,
        help="max shard size in GB; more shards get model.safetensors.index.json (default 4)",
    )
    p.add_argument(
        "--no-preflight",
        dest="preflight",
        action="store_false",
        help="skip the check that the checkpoint fits in the free disk space",
    )
    add_threads_arg(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.commands.common import human
    from nonstop.config import ModelConfig
    from nonstop.program.footprint import model_footprint
    from nonstop.program.preflight import check_disk
    from nonstop.threads import set_threads
    from nonstop.weights.resolve import ASSETS, DTYPES
    from nonstop.weights.synth import BYTE_VOCAB, write_checkpoint
    from nonstop.weights.write import check_output_dir

    set_threads(args.threads)
    cfg = ModelConfig.from_file(args.config) if args.config else ModelConfig.preset(args.preset)
    if args.num_layers:
        cfg = cfg.with_num_layers(args.num_layers)
    check_output_dir(args.out)
    tokenizer_dir = ASSETS / args.preset if args.preset and (ASSETS / args.preset / "tokenizer.json").exists() else None
    size = model_footprint(cfg, DTYPES[args.dtype]).weight_bytes
    name = args.preset or args.config
    layers = f"{cfg.num_hidden_layers} layer{'' if cfg.num_hidden_layers == 1 else 's'}"
    if args.preflight:
        check_disk(f"{name} ({layers}) at {args.dtype}", size, Path(args.out))
    print(
        f"writing {cfg.family} checkpoint ({human(size, 'B')}, {layers}) to {args.out}",
        file=sys.stderr,
    )

    out, removed = Path(args.out), []
    write_checkpoint(
        cfg,
        out,
        seed=args.seed,
        dtype=DTYPES[args.dtype],
        max_shard_bytes=int(min(args.shard_size * 1e9, sys.maxsize)),  # 1e300 GB: one shard, not an overflow
        tokenizer_dir=tokenizer_dir,
        progress=progress_printer(sys.stderr),
        removed=removed,
    )
    if removed:
        print(f"removed from the old checkpoint (the new one has none): {', '.join(removed)}", file=sys.stderr)
    if not (out / "tokenizer.json").exists():
        print(
            f"no tokenizer: the vocabulary ({cfg.vocab_size}) is smaller than the {BYTE_VOCAB} ids a byte tokenizer "
            "needs; give token ids (nonstop generate --prompt-ids 1,2,3 --ids; prompt_token_ids in the API)",
            file=sys.stderr,
        )
    note_kept_files(out, "synth")
    print(f"done: {out}", file=sys.stderr)
    return 0


KEPT_TOKENIZER_FILES = ("tiktoken.model", "chat_template.jinja")  # the tokenizer loader reads them, synth never writes


def note_kept_files(out: Path, command: str) -> None:
    """A note on stderr naming the ``KEPT_TOKENIZER_FILES`` of an old model left in ``out``, which ``command``
    (synth, train) never writes and the loader may still read as the tokenizer or chat template."""
    kept = [name for name in KEPT_TOKENIZER_FILES if (out / name).exists()]
    if kept:
        print(
            f"note: {', '.join(kept)} left in {out} ({command} never writes it) and may still be read as the "
            "tokenizer or chat template: remove it if it belongs to an old model",
            file=sys.stderr,
        )


PROGRESS_EVERY_S = 10.0  # without a terminal: one progress line at most this often


def progress_printer(stream, clock=time.monotonic):
    """A ``progress(done, total)`` for ``write_checkpoint`` that prints to ``stream``: on a terminal one line
    redrawn every 5%, else (a log) a line every ``PROGRESS_EVERY_S`` seconds; the last count always."""
    tty = stream.isatty()
    last = clock()

    def report(done: int, total: int) -> None:
        nonlocal last
        if tty:
            if done == total or done % max(1, total // 20) == 0:
                print(f"\r  {done}/{total} tensors", end="\n" if done == total else "", file=stream, flush=True)
        elif done == total or clock() - last >= PROGRESS_EVERY_S:
            last = clock()
            print(f"  {done}/{total} tensors", file=stream, flush=True)

    return report
