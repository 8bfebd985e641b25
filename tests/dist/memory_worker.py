"""Peak resident memory of loading a model, measured inside the loading process (run by ``spawn``).

``load_peak(out_dir, warm_dir, big_dir, tp, ep)``: a world of 1 builds the single-process ``LLM`` (the
reference executor), a larger world joins the layout's process group and builds this rank's worker
(``build_worker``: sharded read + rank model + executor), then the rank's random weights
(``random_rank_state``). Each is built first from ``warm_dir`` (a small model: imports, thread pools,
allocator arenas) and then measured on ``big_dir``: the peak RSS is reset (``/proc/self/clear_refs`` 5:
VmHWM := VmRSS), and growth = VmHWM after - VmRSS before. Writes ``out_dir/rank<r>.json``
{"load": bytes, "random": bytes (ranks only)}.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import torch

TIMEOUT = 60.0


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_growth(build, *args, **kw) -> tuple[int, object]:
    """(bytes the peak RSS rose above the RSS before, what ``build(*args, **kw)`` returned)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    out = build(*args, **kw)
    return (_status_kb("VmHWM") - before) * 1024, out


def load_peak(out_dir: str, warm_dir: str, big_dir: str, tp: int, ep: int) -> None:
    from nonstop.weights.resolve import resolve_model

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    result = {}
    if world == 1:
        from nonstop.engine.llm import LLM

        for d in (warm_dir, big_dir):
            result["load"], llm = peak_growth(LLM, d, dtype="float32", backend="reference")
            del llm
    else:
        from nonstop.dist import Layout
        from nonstop.dist.comm import init, shutdown
        from nonstop.dist.load import random_rank_state
        from nonstop.engine.distributed import build_worker

        comm = init(Layout.make(tp, ep), "cpu", TIMEOUT)
        try:
            for d in (warm_dir, big_dir):
                cfg, model_dir = resolve_model(d)
                result["load"], worker = peak_growth(build_worker, comm, cfg, model_dir, torch.float32)
                del worker
                result["random"], state = peak_growth(random_rank_state, cfg, comm.layout, rank, torch.float32)
                del state
        finally:
            shutdown()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
