"""``nonstop serve``: an OpenAI-compatible HTTP server with continuous batching."""

from __future__ import annotations

import os
import sys

from nonstop.commands.common import (
    add_checkpoint_file_args,
    add_model_args,
    add_spec_args,
    llm_from_args,
    positive_int,
    spec_from_args,
)
from nonstop.commands.layout_args import add_layout_args, llm_class


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model (default: the bundled k3-nano) over HTTP: POST /v1/completions and "
        "/v1/chat/completions "
        "(streaming with stream=true), GET /v1/models, /health and /metrics (Prometheus). Requests are batched "
        "continuously: "
        "they join and leave between decode steps, long prompts are prefilled in chunks between the decode steps of "
        "running "
        "streams, and when --max-waiting requests already wait for a slot new ones get HTTP 429 with Retry-After. "
        "Sampling fields a request leaves out take the checkpoint's generation_config.json defaults. Needs the "
        "'serve' extra (pip install 'nonstop[serve]': fastapi, uvicorn).",
    )
    add_model_args(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all interfaces)"
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="listen at once, without first running every step shape once (by default the server compiles "
        "them before it listens: the cpu executor's first use of a shape compiles it, which a first "
        "request would otherwise wait for)",
    )
    p.add_argument(
        "--served-model-name",
        action="append",
        default=None,
        help="name clients pass as 'model' (repeatable; default: the --model value)",
    )
    p.add_argument(
        "--max-batch", type=positive_int, default=16, help="sequences decoded together = cache slots (default 16)"
    )
    p.add_argument(
        "--max-waiting",
        type=positive_int,
        default=256,
        help="requests that may wait for a slot; beyond it requests get HTTP 429 (default 256)",
    )
    p.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="context length to allow, prompt + generated tokens (default: the model's)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=128,
        help="prompt tokens prefilled per engine step, so long prompts do not stall running streams (default 128)",
    )
    p.add_argument(
        "--no-batch-invariant",
        dest="batch_invariant",
        action="store_false",
        help="decode all sequences in one batched forward: faster, but a sequence's tokens may then depend on what "
        "else is running (default: every sequence in a forward of its own, bit-identical whatever the load)",
    )
    p.add_argument(
        "--max-prompts",
        type=positive_int,
        default=16,
        help="prompts allowed in one /v1/completions request (default 16)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("NONSTOP_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every /v1 route (default: $NONSTOP_API_KEY; unset: no key)",
    )
    p.add_argument(
        "--default-max-tokens",
        type=positive_int,
        default=None,
        help="max_tokens of requests that give none (default: the checkpoint's max_new_tokens; else 16 for "
        "completions and the rest of the context for chat)",
    )
    add_checkpoint_file_args(p)
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="server log level (default info)",
    )
    add_spec_args(p)
    add_layout_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ValueError(f"nonstop serve needs {exc.name}: pip install 'nonstop[serve]'") from None
    from nonstop.engine.warmup import warm_up
    from nonstop.server import build_context, serve
    from nonstop.server.launch import bind_socket
    from nonstop.weights.resolve import resolve_model

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key (or $NONSTOP_API_KEY) must not be empty")
    if args.api_key is not None and args.api_key != args.api_key.strip():
        raise ValueError(
            "--api-key (or $NONSTOP_API_KEY) must not start or end with a space: HTTP drops the spaces around a "
            "header value, so no client could send that key"
        )
    if args.api_key is not None and not (args.api_key.isascii() and args.api_key.isprintable()):
        raise ValueError(
            "--api-key (or $NONSTOP_API_KEY) must be printable ASCII: clients send it in an HTTP header, which "
            "carries no other characters"
        )
    if any(not name.strip() for name in args.served_model_name or []):
        raise ValueError("--served-model-name must not be empty")
    _check_lengths(args, resolve_model(args.model)[0].max_position_embeddings)
    sock = bind_socket(args.host, args.port)  # an address in use fails now, not after the model loads
    # under --tp / --ep llm_class starts or joins the ranks (nonstop.dist); only rank 0 goes on
    llm = llm_from_args(
        args,
        cls=llm_class(args, slots=args.max_batch),
        max_batch=args.max_batch,
        progress=True,
        prefill_chunk=args.prefill_chunk,
        batch_invariant=args.batch_invariant,
        speculative=spec_from_args(args),
    )
    ctx = build_context(
        llm,
        args.served_model_name or [str(args.model)],
        max_batch=args.max_batch,
        max_waiting=args.max_waiting,
        max_model_len=args.max_model_len,
        max_prompts=args.max_prompts,
        api_key=args.api_key,
        default_max_tokens=args.default_max_tokens,
    )
    if args.warmup:
        print("nonstop: warming up (each step shape once) before listening ...", file=sys.stderr, flush=True)
        seconds = warm_up(ctx.engine.core, llm.make_request)
        print(f"nonstop: warmed up in {seconds:.1f} s", file=sys.stderr, flush=True)
    print(
        f"nonstop: serving {', '.join(ctx.served_names)} ({llm.backend}, context {ctx.limits.max_len}, "
        f"{args.max_batch} slots) on http://{args.host}:{args.port}{' (API key required)' if args.api_key else ''}",
        file=sys.stderr,
    )
    serve(ctx, args.host, args.port, args.log_level, sock=sock)
    return 0


MIN_CONTEXT = 2  # a prompt of one token and one generated token


def _check_lengths(args, context: int) -> None:
    """--max-model-len within the model's ``context`` positions, --default-max-tokens within what a request may
    hold (a request would take the default and then be refused, every one)."""
    if args.max_model_len is not None and args.max_model_len > context:
        raise ValueError(
            f"--max-model-len {args.max_model_len} exceeds the model's {context} positions (max_position_embeddings)"
        )
    allowed = args.max_model_len or context
    if allowed < MIN_CONTEXT:
        where = "--max-model-len" if args.max_model_len else "the model's max_position_embeddings"
        raise ValueError(
            f"a context of {allowed} tokens ({where}) leaves no room for a prompt and one generated token: "
            f"give at least {MIN_CONTEXT}"
        )
    if args.default_max_tokens is not None and args.default_max_tokens >= allowed:
        raise ValueError(
            f"--default-max-tokens {args.default_max_tokens} leaves no room for a prompt in a context of {allowed} "
            "tokens"
        )
