"""A rank's peak memory while it loads is about its share of the model, measured, not assumed: its share,
plus one checkpoint tensor (the random weights draw each whole before cutting it), plus 5 % of the model.

A synthetic k3-nano with bigger experts (``write_checkpoint``, float32, ~80 MB: the weights dominate)
is loaded by one process (``LLM``) and by the two ranks of TP 2 x EP 2, each measuring its own peak RSS
growth (``memory_worker.load_peak``: the peak reset before, a warm-up build of a small model first so
imports do not count). glibc's malloc keeps freed blocks resident and hands them out again, which would
hide new allocations; ``MALLOC_MMAP_THRESHOLD_`` (fixed, inherited by the spawned processes) gives every
block of 128 KB or more its own mapping, returned to the system when freed, so RSS follows live memory.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout
from nonstop.dist.launch import spawn
from nonstop.dist.model import rank_weight_bytes
from nonstop.weights.layout import checkpoint_layout
from nonstop.weights.synth import write_checkpoint
from tests.dist.memory_worker import load_peak

NANO = Path(__file__).resolve().parents[2] / "nonstop/assets/k3-nano"
TP, EP = 2, 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status and clear_refs")
def test_each_rank_peaks_at_about_its_share_of_the_model(tmp_path, monkeypatch):
    raw = json.loads((NANO / "config.json").read_text())
    raw["text_config"].update(num_experts=16, moe_intermediate_size=256)
    cfg = ModelConfig.from_hf_dict(raw)
    big = write_checkpoint(cfg, tmp_path / "big", seed=1, dtype=torch.float32)
    warm = write_checkpoint(ModelConfig.from_file(NANO), tmp_path / "warm", seed=1, dtype=torch.float32)
    whole = rank_weight_bytes(cfg, Layout(), torch.float32)[0]
    one_tensor = max(math.prod(s.hf_shape) for s in checkpoint_layout(cfg)) * 4  # read or drawn whole, then cut
    shares = rank_weight_bytes(cfg, Layout.make(TP, EP), torch.float32)
    assert whole > 60e6 and max(shares) < 0.55 * whole  # the layout splits most of the bytes
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 << 10))
    peaks = {}
    for world in (1, Layout.make(TP, EP).world):
        out = tmp_path / f"world{world}"
        out.mkdir()
        spawn(load_peak, world, (str(out), str(warm), str(big), TP, EP), timeout=150)
        peaks[world] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    single = peaks[1][0]["load"]
    assert single > 0.9 * whole, f"the single process grew {single / 1e6:.0f} MB for a {whole / 1e6:.0f} MB model"
    for rank, (peak, share) in enumerate(zip(peaks[len(shares)], shares)):
        for what in ("load", "random"):  # the checkpoint's sharded read; a preset's random weights
            grew = peak[what]
            msg = f"rank {rank} {what}: grew {grew / 1e6:.1f} MB; share {share / 1e6:.1f}, whole {whole / 1e6:.1f} MB"
            assert 0.7 * share < grew < share + one_tensor + 0.05 * whole, msg
