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
    return [{"token_ids": list(o.token_ids), "logprobs": o.logprobs, "prompt_logprobs": o.prompt_logprobs, "metrics": {k: v for k, v in o.metrics.items() if not k.endswith("_s")}} for o in outs]


def _layout(sc: dict):
    from nonstop.dist import ExpertPlacement, Layout

    placement = None
    if sc.get("redundant_load") is not None:
        placement = ExpertPlacement.rebalanced(sc["redundant_load"], sc["ep"], redundant=sc["redundant"])
    return Layout.make(sc["tp"], sc["ep"], sc.get("world"), placement)


def _params(sc: dict):
    from nonstop.engine.sampling import SamplingParams

    return SamplingParams(max_tokens=sc.get("max_tokens", 6), temperature=0, logprobs=sc.get("logprobs"), prompt_logprobs=sc.get("prompt_logprobs"), ignore_eos=True)


def _reference(sc: dict, cache: dict):
    from nonstop.engine.llm import LLM

    key = (sc["model"], repr(sc["prompts"]), sc.get("max_tokens", 6), sc.get("logprobs"), sc.get("prompt_logprobs"))
    if key not in cache:
        llm = LLM(sc["model"], dtype="float32", max_batch=len(sc["prompts"]))
        cache[key] = _outputs(llm.generate(prompt_token_ids=sc["prompts"], sampling=_params(sc)))
    return cache[key]


def run_scenarios(out_dir: str, scenarios: list[dict]) -> None:
    from nonstop.dist.comm import init, shutdown
    from nonstop.engine.distributed import build_worker, follow
    from nonstop.engine.distributed_llm import DistributedLLM
    from nonstop.engine.llm import resolve_model

    rank = int(os.environ["RANK"])
    refs: dict = {}
    try:
        for sc in scenarios:
            comm = init(_layout(sc), "cpu", sc.get("timeout", TIMEOUT))
            if rank == 0:
                ref = _reference(sc, refs)
                t0 = time.perf_counter()
                llm = DistributedLLM(sc["model"], dtype="float32", backend=sc.get("backend", "reference"), max_batch=len(sc["prompts"]), speculative=sc.get("speculative"), comm=comm, chunks=sc.get("chunks"), overlap=sc.get("overlap"))
                try:
                    got = _outputs(llm.generate(prompt_token_ids=sc["prompts"], sampling=_params(sc)))
                    stats = {k: list(v) for k, v in comm.stats.items()}
                finally:
                    llm.close()
                with open(Path(out_dir) / f"{sc['name']}.pkl", "wb") as fh:
                    pickle.dump({"ref": ref, "got": got, "seconds": time.perf_counter() - t0, "stats": stats}, fh)
            else:
                cfg, model_dir = resolve_model(sc["model"])
                follow(build_worker(comm, cfg, model_dir, torch.float32, sc.get("backend", "reference"), 0, sc.get("chunks"), sc.get("overlap")))
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        shutdown()


def failing_rank(out_dir: str, model: str, mode: str, timeout: float) -> None:
    """Rank 1 dies (``exit``: the process ends, exit status 0 so the launcher does not stop rank 0) or
    hangs (``hang``: stops answering) after a few steps; rank 0 records how long its next collective
    took to fail and the error."""
    from nonstop.dist import Layout
    from nonstop.dist.comm import RankFailure, init
    from nonstop.engine.distributed import build_worker
    from nonstop.engine.distributed_llm import DistributedLLM
    from nonstop.engine.llm import resolve_model
    from nonstop.engine.sampling import SamplingParams

    comm = init(Layout.make(1, 2), "cpu", timeout)
    flag = Path(out_dir) / "failed.pkl"
    if comm.rank == 0:
        llm = DistributedLLM(model, dtype="float32", comm=comm)
        t0 = time.perf_counter()
        result = {"error": None}
        try:
            llm.generate(prompt_token_ids=[[3, 4, 5]], sampling=SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
        except RankFailure as exc:
            result = {"error": str(exc), "seconds": time.perf_counter() - t0}
        with open(flag, "wb") as fh:
            pickle.dump(result, fh)
        os._exit(0)
    cfg, model_dir = resolve_model(model)
    worker = build_worker(comm, cfg, model_dir, torch.float32)
    for _ in range(4):
        worker.handle(comm.broadcast_object())
    if mode == "exit":
        os._exit(0)
    while not flag.exists():  # hang: alive, silent
        time.sleep(0.1)
    os._exit(0)
