"""``nonstop tune``: the super-operator agent (propose -> verify -> time -> keep), ``tune verify`` and ``--list``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nonstop.commands.common import add_threads_arg, non_negative_float, positive_float, positive_int

DESCRIPTION = """\
Tune one super-op kind of a model's decode Program. Each round a proposer writes candidate kernel files
(search: the current kernel's tile sizes, warps, stages and split factors; llm: any OpenAI-compatible
chat endpoint, nonstop's own server included), each candidate is verified in a sandboxed process against
the op's plain-torch twin (static rules, then fresh random inputs on held-out odd shapes, poisoned outputs,
guard bands, unchanged inputs, determinism), verified candidates are timed on a GPU (CUDA events, L2
flushed, against the built-in kernel and the op's bandwidth floor), and the best is kept in the tuning
store, which the superop executor uses on the same GPU model. Without a GPU candidates are verified under
TRITON_INTERPRET=1 and recorded untimed. Candidate format and per-kind contracts: docs/tune.md.

  nonstop tune -m k3-nano --op linear_residual --rows 1,2,4,8 --proposer search
  nonstop tune -m k3-nano --op kda_core --proposer llm --llm-base-url http://127.0.0.1:8000/v1 --llm-model k3-nano
  nonstop tune verify --op linear_residual --kernel my_kernel.py        (exit 0: accepted, 1: rejected)
  nonstop tune --list"""


def _rows(text: str) -> list[int]:
    try:
        rows = sorted({int(t) for t in text.replace(",", " ").split()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"rows must be integers separated by commas, got {text!r}") from None
    if not rows or rows[0] < 1 or rows[-1] > 16:
        raise argparse.ArgumentTypeError(f"rows must be in 1..16, got {text!r}")
    return rows


def _store_arg(text: str) -> Path:
    """A file path (``Path("")`` would silently be the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the tuning store path is empty; give a JSON file path")
    if text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"{text!r} names a directory; give a JSON file path")
    return Path(text)


def _common(p: argparse.ArgumentParser, model_default: str | None) -> None:
    p.add_argument(
        "--op",
        help="the super-op kind (e.g. linear_residual, mlp, kda_core, mla_attn, moe_experts; see `nonstop program`)",
    )
    p.add_argument(
        "--model",
        "-m",
        default=model_default,
        help="checkpoint directory, bundled model or preset whose shapes are used "
        "(weights are random: only the config is read); default: k3-nano, or the first preset that has the kind",
    )
    p.add_argument(
        "--rows",
        type=_rows,
        help="decode batch sizes B to tune / verify at (T tokens each), e.g. 1,2,4,8; "
        "default 1,2,4,8 on a GPU, 1,3 on a CPU",
    )
    p.add_argument(
        "--tokens",
        type=int,
        default=1,
        help="tokens per sequence in a step (T; > 1 is a speculative verification step), default 1",
    )
    p.add_argument("--dtype", default="auto", help="float32 | bfloat16 | float16 | auto (bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda when a GPU is visible)")
    p.add_argument(
        "--context",
        type=positive_int,
        default=1024,
        help="tokens cached per sequence in timed steps (attention traffic), default 1024",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        help="seconds one candidate's verification may take (default 300)",
    )
    add_threads_arg(p)  # this process: the twins, CPU timing (a sandboxed verification child uses one thread)


def add_proposer_args(p: argparse.ArgumentParser, rounds: int) -> None:
    """The proposer's flags (--proposer, --rounds, --candidates, --llm-*), here and in bench/tune.py."""
    p.add_argument(
        "--proposer",
        choices=["search", "llm"],
        default="search",
        help="search (tunables of the current kernel) or llm (an OpenAI-compatible endpoint)",
    )
    p.add_argument(
        "--rounds", type=positive_int, default=rounds, help=f"rounds of propose -> verify -> time (default {rounds})"
    )
    p.add_argument("--candidates", type=positive_int, default=4, help="candidates per round (default 4)")
    p.add_argument(
        "--llm-base-url",
        default=None,
        help="OpenAI-compatible base URL, e.g. https://api.openai.com/v1 or http://127.0.0.1:8000/v1 (nonstop serve)",
    )
    p.add_argument("--llm-model", default=None, help="model name the endpoint serves")
    p.add_argument(
        "--llm-api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default OPENAI_API_KEY; unset: no key sent)",
    )
    p.add_argument(
        "--llm-temperature",
        type=non_negative_float,
        default=0.7,
        help="sampling temperature of the proposer (default 0.7)",
    )
    p.add_argument("--llm-max-tokens", type=positive_int, default=8192, help="max tokens per reply (default 8192)")
    p.add_argument(
        "--llm-timeout-s",
        type=positive_float,
        default=600.0,
        help="seconds one whole reply may take (default 600); no reply to the first request in time ends the run",
    )


def llm_proposer(args):
    """The ``llm`` proposer of the --llm-* flags (``add_proposer_args``), here and in bench/tune.py."""
    from nonstop.tune.llm import LLMProposer

    return LLMProposer(
        args.llm_base_url,
        args.llm_model,
        args.llm_api_key_env,
        args.llm_temperature,
        args.llm_max_tokens,
        args.llm_timeout_s,
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="propose, verify and keep faster super-op kernels (search or any OpenAI-compatible LLM)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p, None)
    p.add_argument(
        "--store",
        type=_store_arg,
        default=None,
        help="tuning store JSON (default $NONSTOP_TUNING_STORE, else tuning.json in the cache root: "
        "$NONSTOP_CACHE_DIR, else $XDG_CACHE_HOME/nonstop, default ~/.cache/nonstop)",
    )
    p.add_argument("--list", action="store_true", help="list the tuning store's entries and exit")
    add_proposer_args(p, rounds=3)
    p.add_argument("--no-store", action="store_true", help="do not write the tuning store (report only)")
    p.set_defaults(run=run)
    tsub = p.add_subparsers(
        dest="tune_command",
        metavar="verify",
        help="verify one candidate kernel file (see `nonstop tune verify --help`)",
    )
    v = tsub.add_parser(
        "verify",
        help="verify one candidate kernel file (exit 0 accepted, 1 rejected)",
        description="Verify one candidate kernel file for a super-op kind: static rules, then the sandboxed dynamic "
        "checks against the op's twin at the model's shapes and at held-out odd shapes (and timing on a GPU). "
        "Exit status 0 when accepted, 1 when rejected (the reasons are printed), 2 on bad arguments.",
    )
    _common(v, None)
    v.add_argument("--kernel", type=Path, help="the candidate file (a Python file defining launch(op, env))")
    v.add_argument("--builtin", action="store_true", help="verify the built-in kernel of the kind instead of a file")
    v.add_argument("--no-time", action="store_true", help="skip timing on a GPU")
    v.add_argument("--json", action="store_true", help="print the verdict as JSON")
    v.set_defaults(run=run_verify)


# ----------------------------------------------------------------------------- shared setup


def _device(args):
    import torch

    from nonstop.weights.resolve import check_device

    if args.device is None:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return check_device(args.device)


def _default_model(kind: str) -> str:
    """k3-nano if its Program has ``kind``, else the first preset whose Program has it."""
    from nonstop.config import preset_names
    from nonstop.tune.cases import layers_for
    from nonstop.weights.resolve import resolve_model

    for name in ["k3-nano"] + preset_names():
        try:
            layers_for(resolve_model(name)[0], kind)
            return name
        except ValueError:
            continue
    raise ValueError(f"no bundled model or preset has a {kind!r} op")


def _target(args):
    """The op, model shapes and device to tune or verify at (``--threads`` applied first)."""
    from nonstop.kernels import KERNELS
    from nonstop.program.ir import MAX_STEP_ROWS
    from nonstop.threads import set_threads
    from nonstop.tune.target import make_target
    from nonstop.weights.resolve import parse_dtype, resolve_model

    set_threads(args.threads)

    kinds = sorted(k for k in KERNELS if k != "sample")
    if not args.op:
        raise ValueError(f"give --op KIND; kinds: {', '.join(kinds)}")
    if args.op not in kinds:
        raise ValueError(f"unknown op kind {args.op!r}; kinds: {', '.join(kinds)}")
    if args.tokens < 1 or args.tokens > 16:
        raise ValueError(f"--tokens must be in 1..16, got {args.tokens}")
    device = _device(args)
    if args.rows:  # given: every B is tuned or none (the store is keyed by B x T; a step runs at most 16 rows)
        over = [r for r in args.rows if r * args.tokens > MAX_STEP_ROWS]
        if over:
            fit = MAX_STEP_ROWS // args.tokens
            raise ValueError(
                f"--rows {','.join(map(str, over))} x --tokens {args.tokens} exceed{'s' if len(over) == 1 else ''} "
                f"a decode step's {MAX_STEP_ROWS} rows; with --tokens {args.tokens} give --rows up to {fit}"
            )
        rows = args.rows
    else:  # the defaults that fit
        rows = [r for r in ([1, 2, 4, 8] if device.type == "cuda" else [1, 3]) if r * args.tokens <= MAX_STEP_ROWS]
    model = args.model or _default_model(args.op)
    cfg, _ = resolve_model(model)
    return make_target(
        args.op, model, cfg, parse_dtype(args.dtype, str(device)), device, rows, args.tokens, args.context
    )


def _store_path(args) -> Path | None:
    from nonstop.runtime.tuned import store_path

    return args.store.expanduser() if args.store else store_path()


# ----------------------------------------------------------------------------- nonstop tune


def run(args) -> int:
    if args.list:
        return list_store(_store_path(args))
    if args.rounds < 1 or args.candidates < 1:
        raise ValueError("--rounds and --candidates must be at least 1")
    from nonstop.tune import store
    from nonstop.tune.loop import tune
    from nonstop.tune.search import SearchProposer

    target = _target(args)
    if args.proposer == "llm":
        proposer = llm_proposer(args)
    else:
        proposer = SearchProposer(args.op)
    path = None if args.no_store else _store_path(args)
    if path is not None:
        store.check_writable(path)  # before any work: a bad path or an unreadable store fails now, untouched
    print(
        f"tuning {target.describe()}: {len(target.shapes)} shape(s), {args.rounds} round(s) of "
        f"{args.candidates} candidate(s) from {proposer.name}"
        + (
            ""
            if target.device.type == "cuda"
            else "; no GPU: candidates are verified under TRITON_INTERPRET=1 and recorded untimed"
        ),
        flush=True,
    )
    report = tune(
        target, proposer, args.rounds, args.candidates, path, args.timeout, say=lambda m: print(m, flush=True)
    )
    print("\n".join(report.lines()))
    if report.outcomes and all(o.candidate.error for o in report.outcomes):
        # every request failed (an endpoint answering 500 to each, say): the run tried nothing, and says so
        print(
            f"nonstop: error: no candidate was produced in {len(report.outcomes)} attempt(s); the last: "
            f"{report.outcomes[-1].candidate.error}",
            file=sys.stderr,
        )
        return 1
    return 0


def list_store(path: Path | None) -> int:
    from nonstop.tune import store

    if path is None:
        print("the tuning store is off (NONSTOP_TUNING_STORE=off)")
        return 0
    entries = store.rows(path)
    if not entries:
        print(f"{path}: no entries")
        return 0
    print(f"{path}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
    for e in entries:
        print(f"  {_entry_line(e)}")
    return 0


def _entry_line(e: dict) -> str:
    """One entry of ``tune --list`` (its fields were checked when the store was read: ``tuned.entry_problem``;
    the optional ones may be missing)."""
    if e.get("timed"):
        speed = f"{e['time_ms'] * 1e3:.2f} us"
        if e.get("builtin_ms") is not None and e.get("floor_ms") is not None:
            speed += f" (built-in {e['builtin_ms'] * 1e3:.2f} us, floor {e['floor_ms'] * 1e3:.2f} us)"
    else:
        speed = "verified, untimed"
    origin = f"{e.get('proposer', '?')} round {e.get('round', '?')} ({e.get('candidate', '?')})"
    return f"{e['device']} | {e['kind']} | {e['shape']} | {speed} | {origin} | {e['kernel']} | {e.get('created', '?')}"


# ----------------------------------------------------------------------------- nonstop tune verify


def run_verify(args) -> int:
    from nonstop.tune.verify import builtin_source, verify

    if args.builtin == (args.kernel is not None):
        raise ValueError("give exactly one of --kernel FILE.py or --builtin")
    if args.kernel is not None and not args.kernel.is_file():
        raise FileNotFoundError(f"no candidate file {args.kernel}")
    target = _target(args)
    source = args.kernel.read_text(errors="replace") if args.kernel is not None else builtin_source(args.op)
    verdict = verify(
        source,
        target,
        trusted=args.builtin,
        time_it=not args.no_time,
        timeout_s=args.timeout,
        progress=None if args.json else (lambda m: print(f"{target.describe()}: {m}", file=sys.stderr, flush=True)),
    )
    if args.json:
        print(
            json.dumps(
                {
                    "accepted": verdict.accepted,
                    "reasons": verdict.reasons,
                    "timing": verdict.timing,
                    "record": verdict.record,
                    "not_verified_here": target.skipped,
                },
                indent=1,
                default=str,
            )
        )
    elif verdict.accepted:
        timing = "; ".join(
            f"{k}: {v['median_ms'] * 1e3:.2f} us (floor {v['floor_ms'] * 1e3:.2f} us)"
            for k, v in verdict.timing.items()
        )
        print(
            f"ACCEPTED: {len(verdict.record.get('cases', []))} cases, {verdict.record.get('calls')} calls"
            + (f"; {timing}" if timing else "; untimed (no GPU)")
        )
        for why in target.skipped:
            print(f"  not verified here: {why}")
    else:
        print(f"REJECTED ({verdict.stage or 'verify'}):")
        for r in verdict.reasons:
            print(f"  - {r}")
    return 0 if verdict.accepted else 1
