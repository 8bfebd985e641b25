"""Multi-rank decoding on one host: tokens/s of EP and TP x EP layouts vs the single-process run.

For each world size W (default 2 and 4) and layout (EP W; TP 2 x EP W), the ranks are started with
``nonstop.dist.spawn`` (gloo on CPU, NCCL with --device cuda: the script is the same) and, for each
MoE exchange mode (overlap on: ``--chunks`` pieces overlapped with the experts; off: one piece) and
batch size B (default 1 and 8), rank 0 drives an ``EngineCore``: B held-out prompts are prefilled, a
few warm-up decode steps run, then ``--steps`` decode steps are timed. ``--exchanges`` (default
auto) adds the MoE exchange modes to compare (static: fixed-capacity buffers; dynamic: split sizes
first). The peer is the single-process engine on the same checkpoint (reference executor; the faster of 1 torch
thread and torch's default thread count, per batch size), measured in the same run.

Reported per row: decode tokens/s (B tokens per step), speed relative to the peer, all-to-alls per
decode step (token exchanges: dispatch + combine launches; and split-size exchanges), bytes on the
wire per token per rank (measured: the average rank's bytes sent during the timed steps / tokens;
all-to-alls exactly, all-reduces as ring traffic) next to the cost model's prediction
(``nonstop.dist.program.rank_step``, where B divides over the attention groups), and whether the greedy
tokens equal the peer's. Also the single-device bandwidth floor: the active bytes per token at the dtype the
ranks load, at the copy bandwidth of their device measured in the same run (the host's memory on CPU, one GPU's
with --device cuda). Results JSON (machine, versions, load average, command) go to bench/results/.

    python bench/dist_decode.py [--model k3-nano] [--worlds 2,4] [--batches 1,8] [--steps 24] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from script_args import (
    choice_list,
    int_list,
    non_negative_int,
    out_file,
    positive_float,
    positive_int,
    results_path,
    run,
)

from nonstop.dist.exchange import REQUESTS as EXCHANGES

HELDOUT = Path(__file__).resolve().parent.parent / "nonstop" / "assets" / "heldout_sample.txt"


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens: the held-out paragraphs, taken again from the first when ``n`` is more
    than there are (a batch B is always B requests)."""
    paragraphs = [p for p in HELDOUT.read_text().split("\n") if len(p) > 200]
    return [tokenizer.encode(paragraphs[i % len(paragraphs)], add_special_tokens=False)[:length] for i in range(n)]


def drive(core, batch_prompts: list[list[int]], warmup: int, steps: int, device, on_window=None) -> dict:
    """Prefill the prompts, run ``warmup`` decode steps, time ``steps`` decode steps."""
    from nonstop.engine.requests import Request
    from nonstop.engine.sampling import SamplingParams

    params = SamplingParams(max_tokens=warmup + steps + 2, temperature=0, ignore_eos=True)
    reqs = [Request(str(i), None, p, params, frozenset()) for i, p in enumerate(batch_prompts)]
    for r in reqs:
        core.admit(r)
    while core.prefilling:
        core.step()
    for _ in range(warmup):
        core.step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if on_window:
        on_window("start")
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        core.step()
    sync()
    seconds = time.perf_counter() - t0
    if on_window:
        on_window("end")
    for r in list(core.active):
        core.abort(r)
    return {"tokens_per_s": len(reqs) * steps / seconds, "seconds": seconds, "tokens": [r.output_ids for r in reqs]}


# ----------------------------------------------------------------------------- one rank


def bench_rank(
    out_dir: str,
    model: str,
    tp: int,
    ep: int,
    batches: list[int],
    modes: list[tuple[int, bool, str]],
    warmup: int,
    steps: int,
    device: str,
    timeout: float,
) -> None:
    import torch.distributed as dist

    from nonstop.dist import Layout
    from nonstop.dist.comm import init, shutdown
    from nonstop.engine.core import EngineCore
    from nonstop.engine.distributed import ClusterExecutor, build_worker
    from nonstop.engine.tokenizer import Tokenizer
    from nonstop.weights.resolve import parse_dtype, resolve_model

    comm = init(Layout.make(tp, ep), device, timeout)
    cfg, model_dir = resolve_model(model)
    dtype = parse_dtype("auto", device)
    results, deltas = [], []
    last: dict = {}  # comm.stats at the end of the previous step
    for chunks, overlap, exchange in modes:
        worker = build_worker(comm, cfg, model_dir, dtype, "reference", 0, chunks, overlap, exchange=exchange)
        handle = worker.handle

        def counted(msg, handle=handle):  # per step: what this rank sent since the previous step ended
            out = handle(msg)  # (rank 0 broadcast the step just before: counted in this step)
            if msg.kind == "step":
                now = {k: tuple(v) for k, v in comm.stats.items()}
                deltas.append(
                    {k: (v[0] - last.get(k, (0, 0))[0], v[1] - last.get(k, (0, 0))[1]) for k, v in now.items()}
                )
                last.clear()
                last.update(now)
            return out

        worker.handle = counted
        for B in batches:
            if comm.rank == 0:
                executor = ClusterExecutor(worker, cfg)
                core = EngineCore(cfg, executor, Tokenizer.load(model_dir, cfg.vocab_size), B, dtype, comm.device)
                window = {}
                row = drive(
                    core,
                    prompts(core.tokenizer, B, 16),
                    warmup,
                    steps,
                    comm.device,
                    lambda edge, window=window: window.__setitem__(edge, len(deltas)),
                )
                executor.close()
                used = dict(worker.executor.stats["exchange_steps"])
                results.append(
                    {
                        "chunks": chunks,
                        "overlap": overlap,
                        "exchange": exchange,
                        "exchange_steps": used,
                        "batch": B,
                        "window": window,
                        **row,
                    }
                )
            else:
                while (msg := comm.broadcast_object()).kind != "stop":
                    worker.handle(msg)
    every = [None] * comm.layout.world
    dist.all_gather_object(every, deltas, group=comm.control)
    if comm.rank == 0:
        with open(Path(out_dir) / "result.json", "w") as fh:
            json.dump({"results": results, "deltas": every}, fh)
    shutdown()


def window_traffic(deltas: list[list[dict]], window: dict, tokens: int) -> dict:
    """Per decode step and per token, from every rank's per-step counts inside the timed window."""
    lo, hi = window["start"], window["end"]
    steps = hi - lo
    ranks = len(deltas)

    def total(rank: int, kind: str, field: int) -> float:
        return sum(d.get(kind, (0, 0))[field] for d in deltas[rank][lo:hi])

    kinds = {k for rank in deltas for d in rank[lo:hi] for k in d}
    sent = sum(total(r, k, 1) for r in range(ranks) for k in kinds) / ranks
    return {
        "token_all_to_alls_per_step": (total(0, "a2a_dispatch", 0) + total(0, "a2a_combine", 0)) / steps,
        "split_size_exchanges_per_step": total(0, "a2a_sizes", 0) / steps,
        "all_reduces_per_step": total(0, "all_reduce", 0) / steps,
        "wire_bytes_per_token_per_rank": sent / tokens,
        "wire_bytes_by_kind_per_token_per_rank": {
            k: round(sum(total(r, k, 1) for r in range(ranks)) / ranks / tokens, 1) for k in sorted(kinds)
        },
    }


# ----------------------------------------------------------------------------- the peer and the driver


def single_process(model: str, batches: list[int], warmup: int, steps: int, device: str, threads: list[int]) -> dict:
    """{batch: the faster of the runs with each thread count} and {batch: {threads: tokens/s}}."""
    from nonstop.engine.llm import LLM

    llm = LLM(model, device=device, backend="reference")  # the ranks' executor: an eager forward, as the peer
    best, every = {}, {}
    default = torch.get_num_threads()
    for B in batches:
        for n in threads:
            torch.set_num_threads(n)
            run = drive(llm.new_core(B), prompts(llm.tokenizer, B, 16), warmup, steps, torch.device(device))
            every.setdefault(B, {})[n] = round(run["tokens_per_s"], 2)
            if B not in best or run["tokens_per_s"] > best[B]["tokens_per_s"]:
                best[B] = run
    torch.set_num_threads(default)
    return best, every


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default="k3-nano", help="a MoE checkpoint directory, bundled model or preset (default k3-nano)"
    )
    ap.add_argument(
        "--worlds", type=int_list(2), default="2,4", help="world sizes, comma-separated, each >= 2 (default 2,4)"
    )
    ap.add_argument("--batches", type=int_list(1), default="1,8", help="batch sizes B, comma-separated (default 1,8)")
    ap.add_argument("--steps", type=positive_int, default=24, help="timed decode steps per row (default 24)")
    ap.add_argument("--warmup", type=non_negative_int, default=4, help="decode steps before the timed ones (default 4)")
    ap.add_argument("--chunks", type=positive_int, default=2, help="pieces of the overlapped MoE exchange (default 2)")
    ap.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="cpu (gloo) or cuda (NCCL, one GPU per rank)"
    )
    ap.add_argument(
        "--exchanges",
        type=choice_list(EXCHANGES),
        default="auto",
        help=f"MoE exchange modes to compare, comma-separated from {', '.join(EXCHANGES)} (default auto)",
    )
    ap.add_argument("--timeout", type=positive_float, default=300.0, help="collective timeout, seconds (default 300)")
    ap.add_argument(
        "--out", type=out_file, default=None, help="JSON path (default bench/results/dist_decode_<device>_<model>.json)"
    )
    args = ap.parse_args()

    from nonstop.dist import Layout
    from nonstop.dist.launch import rank_threads, spawn
    from nonstop.dist.program import engine_exchange, rank_step
    from nonstop.hostinfo import command_line, copy_bandwidth, cuda_missing, decode_floor, environment
    from nonstop.program.footprint import model_footprint
    from nonstop.weights.resolve import parse_dtype, resolve_model

    missing = cuda_missing(args.device, max(args.worlds))
    if missing:
        ap.error(missing)

    load_before = os.getloadavg()
    batches = args.batches
    cfg, _ = resolve_model(args.model)  # before anything runs: a model that does not resolve is one line
    peer, peer_threads = single_process(
        args.model, batches, args.warmup, args.steps, args.device, sorted({1, torch.get_num_threads()})
    )
    print(
        "single process: " + ", ".join(f"batch {B}: {r['tokens_per_s']:.1f} tok/s" for B, r in peer.items()),
        file=sys.stderr,
        flush=True,
    )
    modes = [
        (chunks, overlap, exchange)
        for exchange in args.exchanges
        for chunks, overlap in ((args.chunks, True), (1, False))
    ]
    rows = []
    for world in args.worlds:
        layouts = [(1, world)] + ([(2, world)] if world > 2 and world % 2 == 0 else [])
        for tp, ep in layouts:
            layout = Layout.make(tp, ep)
            with tempfile.TemporaryDirectory() as tmp:
                spawn(
                    bench_rank,
                    world,
                    (tmp, args.model, tp, ep, batches, modes, args.warmup, args.steps, args.device, args.timeout),
                    timeout=3600,
                )
                got = json.loads((Path(tmp) / "result.json").read_text())
            for r in got["results"]:
                B = r["batch"]
                traffic = window_traffic(got["deltas"], r["window"], B * args.steps)
                predicted = None
                if B % layout.dp == 0:
                    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
                    rows_per_group = B // layout.dp
                    device_type = args.device.split(":")[0]
                    mode, _ = engine_exchange(
                        cfg, layout, rows_per_group, r["chunks"], dtype, device_type, r["exchange"]
                    )
                    step = rank_step(cfg, layout, rows_per_group, 24, dtype, chunks=r["chunks"], exchange=mode)
                    predicted = step.wire_bytes_per_token
                row = {
                    "world": world,
                    "tp": tp,
                    "ep": ep,
                    "dp": layout.dp,
                    "batch": B,
                    "overlap": r["overlap"],
                    "chunks": r["chunks"],
                    "exchange": r["exchange"],
                    "exchange_steps": r["exchange_steps"],
                    "tokens_per_s": round(r["tokens_per_s"], 2),
                    "single_process_tokens_per_s": round(peer[B]["tokens_per_s"], 2),
                    "relative_to_single_process": round(r["tokens_per_s"] / peer[B]["tokens_per_s"], 3),
                    **{k: (round(v, 2) if isinstance(v, float) else v) for k, v in traffic.items()},
                    "predicted_wire_bytes_per_token_per_rank": None if predicted is None else round(predicted, 1),
                    "greedy_identical_to_single_process": r["tokens"] == peer[B]["tokens"],
                }
                rows.append(row)
                overlapped = "overlap" if r["overlap"] else "no overlap"
                print(
                    f"W={world} tp{tp} ep{ep} batch {B} {r['exchange']} {overlapped}: "
                    f"{row['tokens_per_s']} tok/s ({row['relative_to_single_process']}x single), "
                    f"{row['token_all_to_alls_per_step']:.0f} token all-to-alls/step, "
                    f"{row['wire_bytes_per_token_per_rank'] / 1e3:.1f} KB/token/rank",
                    file=sys.stderr,
                    flush=True,
                )
    weights = parse_dtype("auto", args.device)  # what the ranks and the peer load
    dtype = str(weights).removeprefix("torch.")
    copy = copy_bandwidth(args.device)["copy_GBps"]  # this host's memory, or one GPU's (the ranks have finished)
    floor = {**decode_floor(model_footprint(cfg, weights).bytes_per_token, copy), "device": args.device}
    result = {
        "benchmark": "dist_decode",
        "command": command_line(),
        "model": args.model,
        "device": args.device,
        "backend": "reference",
        "dtype": dtype,
        "steps": args.steps,
        "warmup": args.warmup,
        "moe_layers": cfg.mlp_types.count("moe"),
        "rows": rows,
        "single_process": {B: round(r["tokens_per_s"], 2) for B, r in peer.items()},
        "single_process_by_threads": peer_threads,
        "bandwidth_floor_single_device": floor,
        "notes": "decode steps only (prefill and warm-up excluded); batch B = B tokens per step; ranks share the host: "
        f"{rank_threads(2)} / {rank_threads(4)} torch threads per rank at world 2 / 4; the single-process peer is the "
        "faster of 1 thread and all threads; wire bytes: all-to-alls exactly, all-reduce as ring traffic (2(n-1)/n "
        "of the buffer), "
        "averaged over ranks and divided by the tokens of the timed steps",
        "machine": {
            **environment(args.device),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out) if args.out else results_path(f"dist_decode_{args.device}_{Path(args.model).name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{'W':>2} {'tp':>2} {'ep':>2} {'B':>2} {'exchange':>8} {'overlap':>7} {'tok/s':>7} {'x single':>8} "
        f"{'a2a/step':>8} {'KB/tok/rank':>11} {'predicted':>9} same"
    )
    for r in rows:
        pred = (
            ""
            if r["predicted_wire_bytes_per_token_per_rank"] is None
            else f"{r['predicted_wire_bytes_per_token_per_rank'] / 1e3:.1f}"
        )
        print(
            f"{r['world']:>2} {r['tp']:>2} {r['ep']:>2} {r['batch']:>2} {r['exchange']:>8} {r['overlap']!s:>7} "
            f"{r['tokens_per_s']:>7.1f} {r['relative_to_single_process']:>8.2f} "
            f"{r['token_all_to_alls_per_step']:>8.0f} {r['wire_bytes_per_token_per_rank'] / 1e3:>11.1f} {pred:>9} "
            f"{r['greedy_identical_to_single_process']}"
        )
    print("single process: " + ", ".join(f"batch {B}: {v} tok/s" for B, v in result["single_process"].items()))
    print(
        f"bandwidth floor (one device, batch 1): {floor['floor_tokens_per_s']:.0f} tok/s "
        f"({floor['bytes_per_token'] / 1e6:.1f} MB/token of {dtype} weights at a measured {floor['copy_GBps']:.1f} "
        f"GB/s copy on {args.device})"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
