"""``nonstop serve``: an OpenAI-compatible HTTP server with continuous batching."""

from __future__ import annotations

import sys

from nonstop.commands.common import add_model_args, add_spec_args, positive_int, spec_from_args
from nonstop.commands.layout_args import add_layout_args, llm_class


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model (default: the bundled k3-nano) over HTTP: POST /v1/completions and /v1/chat/completions "
        "(streaming with stream=true), GET /v1/models, /health and /metrics (Prometheus). Requests are batched continuously: "
        "they join and leave between decode steps, long prompts are prefilled in chunks between the decode steps of running "
        "streams, and when --max-waiting requests already wait for a slot new ones get HTTP 429. Needs the 'serve' extra (fastapi, uvicorn).",
    )
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all interfaces)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--served-model-name", action="append", default=None, help="name clients pass as 'model' (repeatable; default: the --model value)")
    p.add_argument("--max-batch", type=positive_int, default=16, help="sequences decoded together = cache slots (default 16)")
    p.add_argument("--max-waiting", type=positive_int, default=256, help="requests that may wait for a slot; beyond it requests get HTTP 429 (default 256)")
    p.add_argument("--max-model-len", type=positive_int, default=None, help="context length to allow, prompt + generated tokens (default: the model's)")
    p.add_argument("--prefill-chunk", type=positive_int, default=128, help="prompt tokens prefilled per engine step, so long prompts do not stall running streams (default 128)")
    p.add_argument("--no-batch-invariant", dest="batch_invariant", action="store_false", help="decode all sequences in one batched forward: faster, but a sequence's tokens may then depend on what else is running (default: every sequence in a forward of its own, bit-identical whatever the load)")
    p.add_argument("--max-prompts", type=positive_int, default=16, help="prompts allowed in one /v1/completions request (default 16)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="server log level (default info)")
    add_spec_args(p)
    add_layout_args(p)
    p.set_defaults(run=run)


def run(args) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ValueError(f"nonstop serve needs {exc.name}: pip install 'nonstop[serve]'") from None
    import torch

    from nonstop.server import build_context, serve

    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    LLM = llm_class(args)  # under --tp / --ep: starts or joins the ranks (nonstop.dist); only rank 0 goes on
    llm = LLM(args.model, dtype=args.dtype, device=args.device, backend=args.backend, max_batch=args.max_batch, progress=True, prefill_chunk=args.prefill_chunk, batch_invariant=args.batch_invariant, speculative=spec_from_args(args))
    ctx = build_context(llm, args.served_model_name or [str(args.model)], max_batch=args.max_batch, max_waiting=args.max_waiting, max_model_len=args.max_model_len, max_prompts=args.max_prompts)
    print(f"nonstop: serving {', '.join(ctx.served_names)} ({llm.backend}, context {ctx.limits.max_len}, {args.max_batch} slots) on http://{args.host}:{args.port}", file=sys.stderr)
    serve(ctx, args.host, args.port, args.log_level)
    return 0
