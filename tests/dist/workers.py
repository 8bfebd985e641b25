"""Rank programs for the multi-process tests (run in processes made by ``nonstop.dist.spawn``).

``run_scenarios(out_dir, scenarios)``: every rank joins each scenario's layout in turn; rank 0 runs the
single-process reference (``LLM``, backend reference) and the layout (``DistributedLLM``) on the same
prompts and pickles both outputs to ``out_dir/<name>.pkl``; the other ranks follow. Every collective
has a timeout (``TIMEOUT``), and the tests put a deadline on the whole spawn.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from pathlib import Path

import torch

TIMEOUT = 60.0


def _outputs(outs) -> list[dict]:
    return [
        {
            "token_ids": list(o.token_ids),
            "logprobs": o.logprobs,
            "prompt_logprobs": o.prompt_logprobs,
            "metrics": {k: v for k, v in o.metrics.items() if not k.endswith("_s")},
        }
        for o in outs
    ]


def _layout(sc: dict):
    from nonstop.dist import ExpertPlacement, Layout

    placement = None
    if sc.get("placement_slots") is not None:
        slots = tuple(tuple(s) for s in sc["placement_slots"])
        placement = ExpertPlacement(len({e for s in slots for e in s}), slots)  # replicas allowed
    if sc.get("redundant_load") is not None:
        placement = ExpertPlacement.rebalanced(sc["redundant_load"], sc["ep"], redundant=sc["redundant"])
    return Layout.make(sc["tp"], sc["ep"], sc.get("world"), placement)


def _params(sc: dict):
    from nonstop.engine.sampling import SamplingParams

    return SamplingParams(
        max_tokens=sc.get("max_tokens", 6),
        temperature=0,
        logprobs=sc.get("logprobs"),
        prompt_logprobs=sc.get("prompt_logprobs"),
        ignore_eos=True,
    )


def _reference(sc: dict, cache: dict):
    from nonstop.engine.llm import LLM

    key = (sc["model"], repr(sc["prompts"]), sc.get("max_tokens", 6), sc.get("logprobs"), sc.get("prompt_logprobs"))
    if key not in cache:
        llm = LLM(sc["model"], dtype="float32", backend="reference", max_batch=len(sc["prompts"]))
        cache[key] = _outputs(llm.generate(prompt_token_ids=sc["prompts"], sampling=_params(sc)))
    return cache[key]


def run_scenarios(out_dir: str, scenarios: list[dict]) -> None:
    from nonstop.dist.comm import init, shutdown
    from nonstop.engine.distributed import build_worker, follow
    from nonstop.engine.distributed_llm import DistributedLLM
    from nonstop.weights.resolve import resolve_model

    rank = int(os.environ["RANK"])
    refs: dict = {}
    try:
        for sc in scenarios:
            comm = init(_layout(sc), "cpu", sc.get("timeout", TIMEOUT))
            if rank == 0:
                ref = _reference(sc, refs)
                t0 = time.perf_counter()
                llm = DistributedLLM(
                    sc["model"],
                    dtype="float32",
                    backend=sc.get("backend", "reference"),
                    max_batch=len(sc["prompts"]),
                    speculative=sc.get("speculative"),
                    comm=comm,
                    chunks=sc.get("chunks"),
                    overlap=sc.get("overlap"),
                    exchange=sc.get("exchange", "auto"),
                    graphs=sc.get("graphs", "auto"),
                )
                try:
                    got = _outputs(llm.generate(prompt_token_ids=sc["prompts"], sampling=_params(sc)))
                    stats = {k: list(v) for k, v in comm.stats.items()}
                    stats["executor"] = llm.executor.worker.executor.stats
                    if sc.get("rebalance") is not None:  # re-place the experts for the load just recorded, run again
                        placements = llm.rebalance(sc["rebalance"])
                        stats["physical_experts"] = sorted({p.physical for p in placements.values()})
                        got += _outputs(llm.generate(prompt_token_ids=sc["prompts"], sampling=_params(sc)))
                        ref = ref + ref
                finally:
                    llm.close()
                try:  # a closed engine says so (it was a RankFailure naming a dead rank)
                    llm.generate(prompt_token_ids=sc["prompts"][:1], sampling=_params(sc))
                    after_close = None
                except Exception as exc:  # noqa: BLE001 - recorded for the test
                    after_close = f"{type(exc).__name__}: {exc}"
                result = {"ref": ref, "got": got, "seconds": time.perf_counter() - t0, "stats": stats}
                with open(Path(out_dir) / f"{sc['name']}.pkl", "wb") as fh:
                    pickle.dump({**result, "after_close": after_close}, fh)
            else:
                cfg, model_dir = resolve_model(sc["model"])
                backend = sc.get("backend", "reference")
                worker = build_worker(
                    comm,
                    cfg,
                    model_dir,
                    torch.float32,
                    backend,
                    0,
                    sc.get("chunks"),
                    sc.get("overlap"),
                    exchange=sc.get("exchange", "auto"),
                    graphs=sc.get("graphs", "auto"),
                )
                follow(worker)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        shutdown()


def failing_rank(out_dir: str, model: str, mode: str, timeout: float) -> None:
    """A rank that dies or hangs, and the rank that must notice it in bounded time.

    exit / hang: rank 1 ends (exit status 0, so the launcher does not stop rank 0 first) or stops
    answering after a few steps of a long generation; rank 0 records how long from then (rank 1 notes the
    moment in ``gone.t``, on the monotonic clock both share) until its collective failed.
    idle_exit: rank 1 ends while rank 0 is idle; rank 0's keep-alive must notice (on_failure).
    rank0_hang: rank 0 freezes (SIGSTOP) mid-generation; rank 1 records how long until it noticed,
    then kills rank 0."""
    import signal

    from nonstop.dist import Layout
    from nonstop.dist.comm import RankFailure, init
    from nonstop.engine.distributed import build_worker
    from nonstop.engine.distributed_llm import DistributedLLM
    from nonstop.engine.sampling import SamplingParams
    from nonstop.weights.resolve import resolve_model

    comm = init(Layout.make(1, 2), "cpu", timeout)
    done = Path(out_dir) / "result.pkl"

    def record(result: dict) -> None:
        with open(done, "wb") as fh:
            pickle.dump(result, fh)

    if comm.rank == 0:
        noticed = []
        llm = DistributedLLM(
            model, dtype="float32", comm=comm, on_failure=lambda msg: noticed.append((time.perf_counter(), msg))
        )
        (Path(out_dir) / "rank0.pid").write_text(str(os.getpid()))
        params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
        t0 = time.monotonic()
        if mode == "idle_exit":
            llm.generate(prompt_token_ids=[[3, 4, 5]], sampling=SamplingParams(max_tokens=2, temperature=0))
            t0 = time.perf_counter()
            while not noticed and time.perf_counter() - t0 < 4 * timeout:
                time.sleep(0.05)
            record(
                {
                    "error": noticed[0][1] if noticed else None,
                    "seconds": (noticed[0][0] if noticed else time.perf_counter()) - t0,
                }
            )
            os._exit(0)
        if mode == "rank0_hang":
            llm.generate(prompt_token_ids=[[3, 4, 5]], sampling=SamplingParams(max_tokens=3, temperature=0))
            os.kill(os.getpid(), signal.SIGSTOP)
        try:
            llm.generate(prompt_token_ids=[[3, 4, 5]], sampling=params)
            record({"error": None})
        except RankFailure as exc:
            gone = Path(out_dir) / "gone.t"
            since = float(gone.read_text()) if gone.exists() else t0
            record({"error": str(exc), "seconds": time.monotonic() - since})
        os._exit(0)
    cfg, model_dir = resolve_model(model)
    worker = build_worker(comm, cfg, model_dir, torch.float32)
    if mode == "rank0_hang":
        t0 = time.perf_counter()
        try:
            while True:
                t0 = time.perf_counter()
                worker.handle(comm.broadcast_object())
        except RankFailure as exc:
            record({"error": str(exc), "seconds": time.perf_counter() - t0})
        os.kill(int((Path(out_dir) / "rank0.pid").read_text()), signal.SIGKILL)
        os._exit(0)
    steps = 2 if mode == "idle_exit" else 4  # idle_exit: the two steps of a 2-token generation
    for _ in range(steps):
        worker.handle(comm.broadcast_object())
    (Path(out_dir) / "gone.tmp").write_text(repr(time.monotonic()))
    os.replace(Path(out_dir) / "gone.tmp", Path(out_dir) / "gone.t")
    if mode in ("exit", "idle_exit"):
        os._exit(0)
    while not done.exists():  # hang: alive, silent
        time.sleep(0.1)
    os._exit(0)
