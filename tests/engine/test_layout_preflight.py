"""The memory preflight under --tp / --ep / --world (``engine/layout_preflight.py``): the ranks' parts add up
to what dist's own shard count says each rank holds, a layout too large for this host is refused in seconds
with one line before any rank starts, --no-preflight skips the check, and a CUDA rank (rank 0 in
``DistributedLLM``, the followers in ``follow_rank``) checks its own GPU."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import types

import pytest
import torch

from nonstop.dist.layout import Layout
from nonstop.dist.model import rank_weight_bytes
from nonstop.engine import layout_preflight
from nonstop.engine.layout_preflight import check_host_memory, check_rank_memory, rank_bytes, rank_slots
from nonstop.program.preflight import PreflightError, model_bytes
from nonstop.weights.resolve import resolve_model

CFG = resolve_model("k3-nano")[0]  # heads that TP 2 divides


@pytest.mark.parametrize("tp, ep, world", [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 4), (1, 1, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_ranks_parts_are_what_each_rank_holds(tp, ep, world, dtype):
    """Each rank's weights are its shards (``dist.model.rank_weight_bytes``, counted from the checkpoint
    layout); one rank alone is the single process (weights and cache)."""
    layout = Layout.make(tp, ep, world)
    parts = rank_bytes(CFG, layout, range(world), dtype)
    assert [parts[r][0] for r in range(world)] == rank_weight_bytes(CFG, layout, dtype)
    if world == 1:
        assert parts[0] == model_bytes(CFG, dtype)
    whole_weights = model_bytes(CFG, dtype)[0]
    assert sum(w for w, _ in parts.values()) >= whole_weights  # replicated parts count on every rank


def test_cache_slots_follow_the_attention_groups():
    layout = Layout.make(1, 1, 2)  # two data-parallel groups of one rank
    assert [rank_slots(layout, r, 3) for r in range(2)] == [2, 1]
    assert [rank_slots(layout, r, 1) for r in range(2)] == [1, 1]  # a group without a slot still keeps one
    one, three = rank_bytes(CFG, layout, [0], torch.float32, 1)[0], rank_bytes(CFG, layout, [0], torch.float32, 3)[0]
    assert one[0] == three[0] and three[1] == 2 * one[1]


def test_the_host_check_decides_on_the_sum_of_its_ranks():
    layout = Layout.make(2, 2, 4)
    parts = rank_bytes(CFG, layout, range(4), torch.bfloat16)
    need = sum(w + c for w, c in parts.values())
    check_host_memory("tiny", CFG, layout, range(4), torch.bfloat16, free=need)
    with pytest.raises(PreflightError):
        check_host_memory("tiny", CFG, layout, range(4), torch.bfloat16, free=need - 1)
    check_host_memory("tiny", CFG, layout, range(2), torch.bfloat16, free=need - 1)  # half the ranks elsewhere
    message = r"tiny on 4 local ranks \(tp 2 x ep 2\) needs [\d.]+ [KMG]B at bfloat16 .*; this machine has 1 KB free"
    with pytest.raises(PreflightError, match=message):
        check_host_memory("tiny", CFG, layout, range(4), torch.bfloat16, free=1000)


def test_a_cuda_rank_checks_its_own_gpu_and_a_cpu_rank_nothing():
    layout = Layout.make(2, 1, 2)
    weights, cache = rank_bytes(CFG, layout, [1], torch.bfloat16)[1]
    gpu = torch.device("cuda", 1)
    check_rank_memory("tiny", CFG, layout, 1, torch.bfloat16, gpu, free=weights + cache)
    with pytest.raises(PreflightError, match=r"tiny's rank 1 \(tp 2 x ep 1\) needs .*; cuda:1 has 1 KB free"):
        check_rank_memory("tiny", CFG, layout, 1, torch.bfloat16, gpu, free=1000)
    check_rank_memory("tiny", CFG, layout, 1, torch.bfloat16, torch.device("cpu"), free=0)  # the host's: checked before


def test_host_ranks_are_the_launchers_or_torchruns_local_rank_0s(monkeypatch):
    from nonstop.commands.layout_args import host_ranks

    layout = Layout.make(2, 2, 8)
    for var in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    assert host_ranks(layout) == range(8)  # the process that starts the ranks
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert host_ranks(layout) is None  # a rank nonstop's launcher started: it checked
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert host_ranks(layout) == range(4, 8)  # torchrun's local rank 0 of the second host
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "5")
    assert host_ranks(layout) is None


def _check(argv: list[str]) -> None:
    from nonstop.cli import build_parser
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    args = build_parser().parse_args(argv)
    check_before_start(args, layout_from_args(args))


def test_no_preflight_skips_the_layout_memory_check(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(layout_preflight, "available_memory", lambda device: 10**9)
    with pytest.raises(PreflightError, match="kimi-k3 on 2 local ranks"):
        _check(["generate", "-m", "kimi-k3", "--tp", "2"])
    _check(["generate", "-m", "kimi-k3", "--tp", "2", "--no-preflight"])


@pytest.mark.parametrize("layout", [["--tp", "2"], ["--ep", "2", "--dtype", "bfloat16"]])
def test_a_layout_larger_than_this_host_is_refused_before_any_rank_starts(layout):
    """The issue's reproduction under a layout: one line with the sizes, within seconds, no rank started."""
    from tests.startup import startup_s, within_seconds_of_starting

    baseline = startup_s()
    t0 = time.monotonic()
    cli = [sys.executable, "-m", "nonstop.cli", "generate", "-m", "kimi-k3", *layout, "hi"]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    dtype = "bfloat16" if "bfloat16" in layout else "float32"
    line = rf"nonstop: error: kimi-k3 on 2 local ranks \(tp \d x ep \d\) needs [\d.]+ TB at {dtype} "
    assert re.search(line + r".*; this machine has [\d.]+ [GMT]B free \(pass --no-preflight", r.stderr), r.stderr
    assert "starting" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert within_seconds_of_starting(elapsed, baseline), (elapsed, baseline)


def test_distributed_llm_checks_rank_0s_gpu_unless_told_not_to(monkeypatch):
    """On CUDA, rank 0 refuses before it loads its part; with preflight=False it goes on to load it."""
    import nonstop.engine.distributed_llm as distributed_llm

    class Loading(Exception):
        pass

    def build_worker(*args, **kwargs):
        raise Loading

    monkeypatch.setattr(layout_preflight, "available_memory", lambda device: 1000)
    monkeypatch.setattr(distributed_llm, "build_worker", build_worker)
    comm = types.SimpleNamespace(rank=0, layout=Layout.make(2, 1, 2), device=torch.device("cuda", 0))
    with pytest.raises(PreflightError, match=r"k3-nano's rank 0 .*; cuda:0 has 1 KB free"):
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm)
    with pytest.raises(Loading):
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm, preflight=False)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_batch": 0}, "max_batch"),
        ({"prefill_chunk": 0}, "prefill_chunk"),
        ({"speculative": {"method": "no-such-method"}}, "method"),
    ],
)
def test_distributed_llm_checks_its_options_before_it_loads(monkeypatch, options, message):
    """As LLM does: max_batch=0 was accepted, rank 0's part loaded, and the first request never finished."""
    import nonstop.engine.distributed_llm as distributed_llm

    class Loading(Exception):
        pass

    def build_worker(*args, **kwargs):
        raise Loading

    monkeypatch.setattr(distributed_llm, "build_worker", build_worker)
    comm = types.SimpleNamespace(rank=0, layout=Layout.make(2, 1, 2), device=torch.device("cpu"))
    with pytest.raises(ValueError, match=message):
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm, preflight=False, **options)
    with pytest.raises(Loading):
        distributed_llm.DistributedLLM("k3-nano", dtype="float32", comm=comm, preflight=False)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--ep", "2", "--speculative", "ngram", "--num-draft-tokens", "99", "Hi"], "num_tokens must be"),
        (["serve", "--ep", "2", "--chat-template", "/nonexistent.jinja"], "chat template /nonexistent.jinja"),
    ],
)
def test_what_rank_0_would_refuse_is_refused_before_any_rank_starts(monkeypatch, argv, message):
    """Rank 0 refused them once loaded, and rank 1 then reported rank 0's end as a second, wrong error."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=message):
        _check(argv)
