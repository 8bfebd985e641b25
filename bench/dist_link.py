"""The cost of one ``all_to_all_single`` over an expert group: latency and bandwidth of the data backend.

The MoE exchange's ``auto`` mode (``nonstop/dist/exchange.py``) trades one collective round (the dynamic
mode's split-size exchange) against the padding bytes of the static mode. This script measures the two
figures that trade needs, on this host, for world sizes W (default 2 and 4): every rank sends ``s`` bytes
(uint8) to every other rank with equal splits, ``--reps`` times back to back, for s from 0 to 1 MiB; the
median over ``--trials`` of the mean time per call is fitted (least squares) to

    t(s) = latency + (W - 1) · s / bandwidth          (bytes a rank sends per call: (W - 1) · s)

The peer figure is the copy bandwidth (``nonstop.hostinfo.copy_bandwidth``) of the device the ranks use: on a CPU
the host's memory copy, the floor of any loopback transfer between its ranks; with ``--device cuda`` one GPU's
device memory copy, which says nothing of the link between GPUs (labelled so in the output and the JSON).
Results JSON (machine, versions, load average, command) go to bench/results/.

    python bench/dist_link.py [--worlds 2,4] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from script_args import int_list, out_file, positive_int, results_path, run

SIZES = [0, 256, 4096, 65536, 262144, 1048576]  # bytes to each other rank
PEER = {  # what the copy bandwidth measured beside the ranks is, per device type
    "cpu": "host memory copy: the floor of any loopback transfer between ranks on this host",
    "cuda": "one GPU's device memory copy, not the link between GPUs (no peer figure of the link here)",
}


def measure_rank(out_dir: str, world: int, device: str, reps: int, trials: int) -> None:
    import torch
    import torch.distributed as dist

    from nonstop.dist import Layout
    from nonstop.dist.comm import init, shutdown

    comm = init(Layout.make(1, world), device, 120.0)
    dev = comm.device
    times = {}
    for size in SIZES:
        inp = torch.zeros(world * size, dtype=torch.uint8, device=dev)
        out = torch.empty_like(inp)
        per_trial = []
        for _ in range(trials + 1):  # the first trial warms the connections up
            dist.barrier(group=comm.ep)
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_to_all_single(out, inp, group=comm.ep)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            per_trial.append((time.perf_counter() - t0) / reps)
        times[size] = statistics.median(per_trial[1:])
    every = [None] * world
    dist.all_gather_object(every, times, group=comm.control)
    if comm.rank == 0:
        (Path(out_dir) / "result.json").write_text(json.dumps(every))
    shutdown()


def fit(world: int, times: dict[int, float]) -> dict:
    """Least squares of t = latency + (world - 1)·s / bandwidth over the sizes s."""
    xs = [(world - 1) * s for s in times]
    ys = list(times.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    bandwidth = round(1 / slope / 1e9, 3) if slope > 0 else None
    return {"latency_us": round((my - slope * mx) * 1e6, 1), "bandwidth_GBps": bandwidth}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--worlds", type=int_list(2), default="2,4", help="world sizes, comma-separated, each >= 2 (default 2,4)"
    )
    ap.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"], help="cpu (gloo) or cuda (NCCL, one GPU per rank)"
    )
    ap.add_argument("--reps", type=positive_int, default=50, help="calls per timed trial (default 50)")
    ap.add_argument(
        "--trials", type=positive_int, default=5, help="timed trials per size, after one warm-up trial (default 5)"
    )
    ap.add_argument(
        "--out", type=out_file, default=None, help="JSON path (default bench/results/dist_link_<device>.json)"
    )
    args = ap.parse_args()

    from nonstop.dist.launch import spawn
    from nonstop.hostinfo import command_line, copy_bandwidth, cuda_missing, environment

    missing = cuda_missing(args.device, max(args.worlds))
    if missing:
        ap.error(missing)

    load_before = os.getloadavg()
    rows = []
    for world in args.worlds:
        with tempfile.TemporaryDirectory() as tmp:
            spawn(measure_rank, world, (tmp, world, args.device, args.reps, args.trials), timeout=1800)
            every = json.loads((Path(tmp) / "result.json").read_text())
        slowest = {int(s): max(rank[s] for rank in every) for s in every[0]}  # a call ends when its slowest rank does
        per_call = {s: round(t * 1e6, 1) for s, t in slowest.items()}
        row = {"world": world, "us_per_call_by_bytes_per_peer": per_call, **fit(world, slowest)}
        rows.append(row)
        print(
            f"W={world}: latency {row['latency_us']} us, bandwidth {row['bandwidth_GBps']} GB/s "
            f"(us per call by bytes per peer: {per_call})",
            file=sys.stderr,
            flush=True,
        )
    copy = copy_bandwidth(args.device)
    result = {
        "benchmark": "dist_link",
        "command": command_line(),
        "device": args.device,
        "backend": "gloo" if args.device == "cpu" else "nccl",
        "reps": args.reps,
        "trials": args.trials,
        "rows": rows,
        "peer_copy_bandwidth": {**copy, "what": PEER[args.device]},
        "notes": "all_to_all_single with equal splits, uint8; time per call = median over trials of the mean "
        "over reps, the slowest rank's; us per call keyed by bytes sent to each other rank; "
        "fit t = latency + (W-1)·s/bandwidth",
        "machine": {
            **environment(args.device),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out) if args.out else results_path(f"dist_link_{args.device}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"copy bandwidth (peer: {PEER[args.device]}): {copy['copy_GBps']:.1f} GB/s")
    print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
