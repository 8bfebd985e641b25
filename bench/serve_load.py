"""Load test for ``nonstop serve``: N concurrent streaming clients for a fixed time.

Each client sends streaming requests back to back (different prompts) until the time is up; requests
still running at the deadline are cancelled (their tokens up to the deadline count for throughput,
their latencies do not). Reported: output tokens/s over the window, completed requests/s, TTFT
(send -> first token) and TPOT ((last - first token) / (tokens - 1), per request) percentiles,
and errors by kind (a line of progress on stderr every ~10 s of the load). Token counts come from the stream's
usage chunk (``include_usage``). With ``--serve`` the bandwidth floor of one stream is reported beside the TPOT:
the active weight bytes per token as the server stores them (its --dtype, --backend: cpu-bf16 / cpu-int8 count
16 / 8-bit weights, --device) at the copy bandwidth of its device measured in the same run; a server given by
--url, or one spread over ranks (--tp / --ep), has no floor here and the report says why. There is no peer
server here to measure against.

    python bench/serve_load.py --serve "--model k3-nano --max-batch 16" --clients 8 --duration 60
    python bench/serve_load.py --url http://127.0.0.1:8000 --clients 16 --duration 30

With ``--serve`` a server is started on a free port (its args as one string) and stopped after.
Results (JSON) go to bench/results/ with the machine, torch version, model and command.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from script_args import out_file, positive_float, positive_int, results_path, run, thread_count

from nonstop.hostinfo import command_line, copy_bandwidth, decode_floor, environment

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SOURCE = ROOT / "nonstop" / "assets" / "heldout_sample.txt"
PROGRESS_S = 10.0  # seconds between progress lines during the load


# ----------------------------------------------------------------------------- server


def served_setup(serve_args: str | None) -> argparse.Namespace | None:
    """``nonstop serve``'s own reading of the --serve arguments (its defaults, its one-line errors), with the
    model resolved (``cfg``) before anything starts; None for a server given by --url (nothing known of it)."""
    if serve_args is None:
        return None
    from nonstop.cli import build_parser
    from nonstop.weights.resolve import resolve_model

    setup = build_parser().parse_args(["serve", *shlex.split(serve_args)])
    setup.cfg, setup.model_dir = resolve_model(setup.model)
    return setup


def check_reachable(base: str) -> None:
    """A ValueError (one line) unless a server answers at ``base``."""
    try:
        httpx.get(base + "/health", timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ValueError(f"the server at {base} is not reachable ({exc}): is it running? (or use --serve)") from None


def start_server(serve_args: str, threads: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "nonstop.cli",
        "serve",
        *shlex.split(serve_args),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    print(f"starting nonstop serve {serve_args} on port {port} ...", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not come up in 300 s")


# ----------------------------------------------------------------------------- clients


def make_prompts(n: int, chars: int) -> list[str]:
    """n different prompts of about ``chars`` characters (slices of the held-out text, or a filler)."""
    text = (
        PROMPT_SOURCE.read_text() if PROMPT_SOURCE.exists() else "The quick brown fox jumps over the lazy dog. " * 200
    )
    step = max(1, (len(text) - chars) // max(n, 1))
    return [text[i * step : i * step + chars] for i in range(n)]


async def one_request(http: httpx.AsyncClient, url: str, body: dict, deadline: float, stats: dict) -> None:
    """Stream one request; record its tokens, TTFT and TPOT, or its error."""
    sent = time.perf_counter()
    first = last = None
    tokens = chunks = 0
    try:
        async with http.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                stats["errors"][f"http_{response.status_code}"] = (
                    stats["errors"].get(f"http_{response.status_code}", 0) + 1
                )
                return
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if now > deadline:
                    stats["cancelled"] += 1
                    break
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    stats["errors"]["stream_error"] = stats["errors"].get("stream_error", 0) + 1
                    return
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                    if last is not None and tokens > chunks:  # chunks of several tokens (a speculative server's
                        stats["timeline"] += [last] * (tokens - chunks)  # accepted blocks): the rest at the last
                elif chunk["choices"] and "role" not in (
                    chunk["choices"][0].get("delta") or {}
                ):  # a token, not chat's opening role chunk
                    first = first or now
                    last = now
                    chunks += 1
                    stats["timeline"].append(now)  # an entry per token: per content chunk, then the usage's rest
            else:
                stats["completed"] += 1
                if first is not None:
                    stats["ttft"].append(first - sent)
                if tokens > 1 and first is not None:
                    stats["tpot"].append((last - first) / (tokens - 1))
                stats["tokens"] += tokens
    except httpx.HTTPError as exc:
        stats["errors"][type(exc).__name__] = stats["errors"].get(type(exc).__name__, 0) + 1


async def client_loop(index: int, http: httpx.AsyncClient, url: str, body_for, deadline: float, stats: dict) -> None:
    k = 0
    while time.perf_counter() < deadline:
        await one_request(http, url, body_for(index, k), deadline, stats)
        k += 1


async def progress(start: float, deadline: float, stats: dict) -> None:
    """A line on stderr every ``PROGRESS_S`` seconds of the load: time, requests completed, tokens streamed, errors."""
    while time.perf_counter() + PROGRESS_S < deadline:
        await asyncio.sleep(PROGRESS_S)
        print(
            f"[{time.perf_counter() - start:4.0f} / {deadline - start:.0f} s] {stats['completed']} requests completed, "
            f"{len(stats['timeline'])} tokens streamed, {sum(stats['errors'].values())} errors",
            file=sys.stderr,
            flush=True,
        )


async def run_load(base: str, model: str, args) -> dict:
    prompts = make_prompts(args.clients * 4, args.prompt_chars)
    path = "/v1/chat/completions" if args.chat else "/v1/completions"

    def body_for(client: int, k: int) -> dict:
        prompt = prompts[(client * 4 + k) % len(prompts)]
        body = {
            "model": model,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": args.ignore_eos,
        }
        if args.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    stats = {"completed": 0, "cancelled": 0, "tokens": 0, "ttft": [], "tpot": [], "timeline": [], "errors": {}}
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(args.duration + 120), limits=limits) as http:
        start = time.perf_counter()
        deadline = start + args.duration
        reporter = asyncio.create_task(progress(start, deadline, stats))
        await asyncio.gather(*(client_loop(i, http, path, body_for, deadline, stats) for i in range(args.clients)))
        reporter.cancel()
        window = min(time.perf_counter(), deadline) - start
    streamed = sum(1 for t in stats["timeline"] if t <= start + window)
    return {"window_s": window, "streamed_tokens": streamed, **stats}


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None, "n": 0}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"p50": q[49], "p90": q[89], "p99": q[98], "mean": statistics.fmean(values), "n": len(values)}


# ----------------------------------------------------------------------------- report


def machine_info(threads: int | None, setup: argparse.Namespace | None) -> dict:
    """This machine (the server runs here when started with --serve), with the served device's GPU when it is
    one; ``threads``: the server's."""
    return environment(setup.device if setup else "cpu") | {"server_threads": threads}


def stream_floor(setup: argparse.Namespace | None) -> dict:
    """The floor a stream's TPOT is held against: every active weight byte read once per token, in the format the
    server stores it, at the copy bandwidth of its device measured now (after the load); {"unknown": why} when
    this script cannot know it."""
    if setup is None:
        return {"unknown": "a server given by --url: its dtype, backend and device are not known here (use --serve)"}
    if max(setup.tp, setup.ep, setup.world or 1) > 1:
        return {"unknown": "a server spread over ranks (--tp / --ep): the floor per rank is not measured here"}
    from nonstop.runtime.executors import streamed_weight_bytes
    from nonstop.weights.resolve import parse_dtype

    dtype = parse_dtype(setup.dtype, setup.device)
    nbytes, what = streamed_weight_bytes(setup.cfg, dtype, setup.backend, setup.device)
    copy = copy_bandwidth(setup.device)["copy_GBps"]
    return {**decode_floor(nbytes, copy), "weights": what, "device": setup.device}


def model_info(setup: argparse.Namespace | None) -> dict | None:
    """The served checkpoint's config and size, when the server was started here."""
    if setup is None:
        return None
    import torch

    from nonstop.program.footprint import model_footprint

    fp = model_footprint(setup.cfg, torch.float32)
    return {
        "name": setup.model,
        "dir": str(setup.model_dir) if setup.model_dir else None,
        "family": setup.cfg.family,
        "active_params": fp.active_params,
        "total_params": fp.total_params,
        "hf_config": setup.cfg.to_hf_dict(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument(
        "--serve", help='start `nonstop serve` with these arguments (one string), e.g. "--model k3-nano --max-batch 16"'
    )
    ap.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="--threads for a server started with --serve (default: torch's choice)",
    )
    ap.add_argument("--model", default=None, help="model name to send (default: the server's first from /v1/models)")
    ap.add_argument("--clients", type=positive_int, default=8, help="concurrent streaming clients (default 8)")
    ap.add_argument("--duration", type=positive_float, default=30.0, help="seconds of load (default 30)")
    ap.add_argument("--max-tokens", type=positive_int, default=64, help="max_tokens per request (default 64)")
    ap.add_argument("--prompt-chars", type=positive_int, default=200, help="prompt length in characters (default 200)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    ap.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate max_tokens every time (default on)",
    )
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions instead of /v1/completions")
    ap.add_argument("--note", default=None, help="free text stored with the results (e.g. how the checkpoint was made)")
    ap.add_argument(
        "--out",
        type=out_file,
        default=None,
        help="JSON path (default bench/results/serve_load_<model>_<clients>c.json)",
    )
    args = ap.parse_args()
    setup = served_setup(args.serve)

    proc = None
    base = args.url
    if args.serve:
        proc, base = start_server(args.serve, args.threads)
    else:
        check_reachable(base)
    try:
        model = args.model or httpx.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        # warm-up: one short request so the first measured one does not pay one-time costs
        httpx.post(base + "/v1/completions", json={"model": model, "prompt": "warm up", "max_tokens": 2}, timeout=120)
        result = asyncio.run(run_load(base, model, args))
        server_metrics = httpx.get(base + "/metrics", timeout=10).text
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    window = result["window_s"]
    report = {
        "benchmark": "serve_load",
        "command": command_line(),
        "server": {"url": args.url, "serve_args": args.serve},
        "model": model,
        "checkpoint": model_info(setup),
        "floor": stream_floor(setup),
        "note": args.note,
        "load": {
            "clients": args.clients,
            "duration_s": args.duration,
            "max_tokens": args.max_tokens,
            "prompt_chars": args.prompt_chars,
            "temperature": args.temperature,
            "ignore_eos": args.ignore_eos,
            "endpoint": "chat" if args.chat else "completions",
        },
        "results": {
            "window_s": window,
            "output_tokens_per_s": result["streamed_tokens"] / window,
            "completed_requests": result["completed"],
            "completed_requests_per_s": result["completed"] / window,
            "completed_output_tokens": result["tokens"],
            "cancelled_at_deadline": result["cancelled"],
            "errors": result["errors"],
            "ttft_s": percentiles(result["ttft"]),
            "tpot_s": percentiles(result["tpot"]),
        },
        "server_active_sequences_after": next(
            (
                float(line.split()[-1])
                for line in server_metrics.splitlines()
                if line.startswith("nonstop_active_sequences ")
            ),
            None,
        ),
        "machine": machine_info(args.threads, setup),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out) if args.out else results_path(f"serve_load_{Path(model).name}_{args.clients}c.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    r = report["results"]

    def ms(p):
        return "n/a" if p["p50"] is None else f"{p['p50'] * 1e3:.0f} / {p['p90'] * 1e3:.0f} / {p['p99'] * 1e3:.0f} ms"

    print(
        f"{model}: {args.clients} clients x {window:.0f} s -> {r['output_tokens_per_s']:.1f} output tokens/s, "
        f"{r['completed_requests']} requests completed ({r['completed_requests_per_s']:.2f}/s), "
        f"errors {r['errors'] or 'none'}"
    )
    print(f"TTFT p50/p90/p99: {ms(r['ttft_s'])}   TPOT p50/p90/p99: {ms(r['tpot_s'])}")
    floor = report["floor"]
    if "unknown" in floor:
        print(f"bandwidth floor: unknown: {floor['unknown']}")
    else:
        print(
            f"bandwidth floor of one stream: {floor['floor_ms_per_token']:.3f} ms a token "
            f"({floor['bytes_per_token'] / 1e6:.1f} MB of {floor['weights']} weights at {floor['copy_GBps']:.1f} GB/s "
            f"copy bandwidth on {floor['device']})"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
