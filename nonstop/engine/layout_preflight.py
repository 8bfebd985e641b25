"""Preflight under a multi-rank layout (``--tp / --ep / --world``): the memory its ranks need, checked
before they load anything.

A rank holds its share of the weights (its heads, columns, vocabulary rows and experts) plus the parts
every rank keeps whole (norms, routers, the MLA latent projections), and the caches of its attention
group's slots (slot s belongs to group s mod DP). ``rank_bytes`` costs one rank from its weightless
(meta) model through the cost model's footprint view (``program/footprint.py``), exactly as
``program/preflight`` costs a single process, so the two preflights cannot disagree on a byte.

Where the memory is:

  CPU ranks   share the host's memory: ``check_host_memory`` adds up the ranks on this host, each with
              its process's own memory before it loads (``process_bytes``: Python, torch and nonstop,
              about 230 MB), and compares the sum with the host's free memory, in the process that starts
              them (before any starts) or, under torchrun, in local rank 0 before it joins the process
              group (no rank loads before every rank has joined).
  CUDA ranks  each have a GPU of their own: ``check_rank_memory`` compares one rank's part with its
              GPU's free memory, in the rank, before it loads.

Both raise ``PreflightError`` with the single process's one line (``preflight.refuse_if_short``); the
host's, counting the rank processes, says what they take too.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nonstop.config import ModelConfig
from nonstop.dist.layout import Layout
from nonstop.dist.model import build_rank_model, meta_rank_state
from nonstop.program.footprint import Footprint, footprint
from nonstop.program.lower import lower
from nonstop.program.preflight import (
    OVERRIDE_HINT,
    PreflightError,
    available_memory,
    footprint_bytes,
    memory_place,
    refuse_if_short,
    size_text,
)
from nonstop.weights.resolve import DTYPE_NAMES

# a rank's own memory before it loads, where /proc does not say (``process_bytes``): 227 MB of anonymous
# memory measured in a rank of k3-nano on gloo (nonstop's command imported, torch 2.13 CPU, group joined)
RANK_PROCESS_BYTES = 230_000_000


def rank_slots(layout: Layout, rank: int, slots: int) -> int:
    """Cache slots ``rank`` keeps of the engine's ``slots`` (its attention group's; at least one)."""
    return max(1, len(range(layout.dp_index(rank), slots, layout.dp)))


def rank_footprints(cfg: ModelConfig, layout: Layout, ranks, dtype: torch.dtype) -> dict[int, Footprint]:
    """{rank: the footprint of its part of the model} for ``ranks`` (ranks whose parts have the same shapes
    are lowered once)."""
    out, by_shapes = {}, {}
    for rank in ranks:
        state = meta_rank_state(cfg, layout, rank, dtype)
        key = tuple(sorted((name, tuple(t.shape)) for name, t in state.items()))
        if key not in by_shapes:
            model = build_rank_model(cfg, layout, rank, state)
            by_shapes[key] = footprint(model, lower(model))
        out[rank] = by_shapes[key]
    return out


def rank_bytes(cfg: ModelConfig, layout: Layout, ranks, dtype: torch.dtype, slots: int = 1) -> dict[int, tuple]:
    """{rank: (weight bytes, cache bytes)} of ``ranks`` for an engine of ``slots`` sequences."""
    return {
        rank: footprint_bytes(fp, cfg.max_position_embeddings, rank_slots(layout, rank, slots))
        for rank, fp in rank_footprints(cfg, layout, ranks, dtype).items()
    }


def process_bytes() -> int:
    """This process's own memory (anonymous: what it maps from files, torch's libraries, is shared with the
    ranks): in the process that starts the ranks, after the command's imports, what each rank - running
    the same command - holds before it loads. ``RANK_PROCESS_BYTES`` where /proc does not say."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return RANK_PROCESS_BYTES


def check_host_memory(
    name: str,
    cfg: ModelConfig,
    layout: Layout,
    ranks,
    dtype: torch.dtype,
    slots: int = 1,
    free: int | None = None,
    per_rank: int = 0,
) -> None:
    """PreflightError when the CPU ranks ``ranks`` of ``layout`` (those of this host), each holding
    ``per_rank`` bytes of its own before it loads (``process_bytes()``), need more than the host's free
    memory (``free``: that figure, for tests)."""
    ranks = list(ranks)
    free = available_memory(torch.device("cpu")) if free is None else free
    what = f"{name} on {len(ranks)} local rank{'s' if len(ranks) > 1 else ''} (tp {layout.tp} x ep {layout.ep})"
    processes = per_rank * len(ranks)
    if processes > free:  # said before costing each rank's part (a million ranks took minutes to cost)
        raise PreflightError(
            f"{what} needs more than {size_text(processes)} for the rank processes alone ({size_text(per_rank)} "
            f"each before loading, before any weight or cache); this machine has {size_text(free)} free "
            f"({OVERRIDE_HINT})"
        )
    parts = rank_bytes(cfg, layout, ranks, dtype, slots).values()
    weights, cache = sum(w for w, _ in parts), sum(c for _, c in parts)
    if processes and processes + weights + cache > free:
        raise PreflightError(
            f"{what} needs {size_text(processes + weights + cache)} at {DTYPE_NAMES.get(dtype, dtype)} "
            f"({size_text(processes)} for the rank processes themselves, {size_text(per_rank)} each before loading; "
            f"{size_text(weights)} of weights, {size_text(cache)} of cache for {slots} sequence(s)); this machine "
            f"has {size_text(free)} free ({OVERRIDE_HINT})"
        )
    refuse_if_short(what, weights, cache, dtype, slots, "this machine", free)


def check_rank_memory(
    name: str,
    cfg: ModelConfig,
    layout: Layout,
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
    slots: int = 1,
    free: int | None = None,
) -> None:
    """PreflightError when ``rank``'s part exceeds the free memory of its GPU ``device``. Nothing on a CPU:
    CPU ranks share the host, whose memory ``check_host_memory`` checks before they start."""
    if device.type == "cpu":
        return
    weights, cache = rank_bytes(cfg, layout, [rank], dtype, slots)[rank]
    free = available_memory(device) if free is None else free
    what = f"{name}'s rank {rank} (tp {layout.tp} x ep {layout.ep})"
    refuse_if_short(what, weights, cache, dtype, rank_slots(layout, rank, slots), memory_place(device), free)
