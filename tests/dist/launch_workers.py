"""What the launcher tests run as a command in every rank (``args.run`` of ``start_ranks``), no model: the
ranks of ``nonstop.dist.spawn`` sum a number over a gloo group, as the CLI's ranks do their steps, and fail
as the CLI's ranks fail (one ``nonstop: error:`` line, exit 3; a rank other than 0 that knows a stop is
coming ends quietly). Each rank writes its pid to ``<dir>/<rank>.pid`` once the group is up."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

SECONDS = 60  # how long the ranks keep summing when nothing stops them


def summing(args) -> int:
    """args.dir, args.timeout (seconds per collective), args.mode: "sum", "error" (every rank raises
    the same ValueError before the group forms), or "rank1_fails" (once the group is up rank 1 says why
    and exits 3 while rank 0 waits, outside any collective, for the launcher to stop it)."""
    import torch
    import torch.distributed as dist

    from nonstop.dist.launch import stopping

    rank = int(os.environ["RANK"])
    if args.mode == "error":
        raise ValueError("the same error in every rank")
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    Path(args.dir, f"{rank}.tmp").write_text(str(os.getpid()))
    os.replace(Path(args.dir, f"{rank}.tmp"), Path(args.dir, f"{rank}.pid"))
    if args.mode == "rank1_fails":
        if rank == 1:
            while not Path(args.dir, "0.pid").exists():  # rank 0 is up and about to wait
                time.sleep(0.01)
            print("nonstop: error: rank 1: failed on purpose", file=sys.stderr, flush=True)
            os._exit(3)
        time.sleep(SECONDS)
        return 0
    t = torch.ones(1)
    end = time.monotonic() + SECONDS
    try:
        while time.monotonic() < end:
            dist.all_reduce(t)
            time.sleep(0.05)
    except RuntimeError as exc:
        if stopping():  # a stop signal came: the others end as it spreads (rank 0 then says so)
            return 0
        print(f"nonstop: error: rank {rank}: the sum failed ({str(exc).splitlines()[0][:100]})", file=sys.stderr)
        sys.stderr.flush()
        os._exit(3)
    return 0
