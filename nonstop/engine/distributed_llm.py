"""``DistributedLLM``: the ``LLM`` API on rank 0 of a multi-rank layout (``nonstop.dist``).

Made after ``nonstop.dist.comm.init`` on every rank: rank 0 builds a ``DistributedLLM`` (its part of the
model, the tokenizer, the scheduler through ``generate`` / ``new_core`` / the server), every other rank
builds a ``RankWorker`` and calls ``follow`` (see ``engine/distributed.py``). ``close()`` tells the
followers to stop.

DSpark drafting reads the target's embedding and LM head: rank 0 then also reads those two tensors in
full (``TargetHead``).
"""

from __future__ import annotations

import atexit
import itertools
import sys

import torch

from nonstop.dist.comm import Comm
from nonstop.engine.distributed import ClusterExecutor, build_worker, check_rank_options
from nonstop.engine.layout_preflight import check_rank_memory
from nonstop.engine.llm import LLM, checked_arguments
from nonstop.engine.speculative.config import SpeculativeConfig, drafter_dir, make_drafter
from nonstop.weights.resolve import check_device


class TargetHead:
    """What a DSpark drafter reads of its target: config, whole embedding and LM head (rank 0 only)."""

    def __init__(self, cfg, model_dir, dtype: torch.dtype, device, seed: int):
        from nonstop.dist.layout import Layout
        from nonstop.dist.load import load_rank_state, random_rank_state

        whole, only = Layout(), {"embed_tokens.weight", "lm_head.weight"}.__contains__  # not the whole model
        state = (
            random_rank_state(cfg, whole, 0, dtype, device, seed, only)
            if model_dir is None
            else load_rank_state(cfg, whole, 0, model_dir, dtype, device, only=only)
        )
        self.cfg = cfg
        self.embed_tokens = torch.nn.Embedding.from_pretrained(state["embed_tokens.weight"], freeze=True)
        self.lm_head_weight = self.embed_tokens.weight if cfg.tie_word_embeddings else state["lm_head.weight"]


class DistributedLLM(LLM):
    """``LLM`` whose decode steps run on every rank of ``comm``'s layout (rank 0 only).

    Extra arguments: ``comm`` (from ``nonstop.dist.comm.init``), ``chunks`` / ``overlap`` of the MoE
    exchange (defaults: 2 overlapped chunks on CUDA, 1 on CPU), ``exchange`` its mode (auto | static |
    dynamic: ``nonstop/dist/exchange.py``), ``graphs`` CUDA-graph capture of the rank steps (auto: CUDA,
    superop, static exchange), ``on_failure(message)`` called when another rank fails (the CLI prints and
    exits), ``before_load(llm)`` as ``LLM``'s. ``preflight``: on CUDA, refuse before loading when rank 0's
    part of the model and the caches of ``max_batch`` sequences exceed its GPU's free memory
    (``engine/layout_preflight.check_rank_memory``; CPU ranks share the host, checked before they start).
    """

    def __init__(
        self,
        model="k3-nano",
        dtype=None,
        device: str = "cpu",
        backend: str = "auto",
        max_batch: int = 16,
        seed: int = 0,
        speculative: dict | None = None,
        progress: bool = False,
        prefill_chunk: int | None = None,
        batch_invariant: bool = False,
        tokenizer: str = "auto",
        chat_template=None,
        generation_config: bool = True,
        preflight: bool = True,
        *,
        comm: Comm,
        chunks: int | None = None,
        overlap: bool | None = None,
        exchange: str = "auto",
        graphs="auto",
        on_failure=None,
        before_load=None,
    ):
        if comm.rank != 0:
            raise ValueError(
                f"DistributedLLM runs on rank 0; rank {comm.rank} follows (nonstop.engine.distributed.follow)"
            )
        max_batch, prefill_chunk, batch_invariant, generation_config, preflight, progress = checked_arguments(
            max_batch, prefill_chunk, seed, batch_invariant, generation_config, preflight, progress
        )
        check_device(device)
        chunks, overlap = check_rank_options(chunks, overlap, graphs)  # before any rank loads its part
        self.device = comm.device
        self._resolve(model, dtype, device, tokenizer, chat_template, generation_config)
        self.speculative_config = SpeculativeConfig.parse(speculative)  # a bad option fails before the weights load
        if self.speculative_config is not None and self.speculative_config.method == "dspark":
            drafter_dir(self.speculative_config, self.model_dir)
        if before_load is not None:  # as LLM's: config and tokenizer known, no weights read yet
            before_load(self)
        if preflight:
            check_rank_memory(self.name, self.cfg, comm.layout, comm.rank, self.dtype, comm.device, max_batch)
        if self.model_dir is None:
            print(f"nonstop: {model!r} is a preset: using random weights (seed {seed})", file=sys.stderr)
        worker = build_worker(
            comm, self.cfg, self.model_dir, self.dtype, backend, seed, chunks, overlap, progress, exchange, graphs
        )
        self.comm = comm
        self.layout = comm.layout
        self.executor = ClusterExecutor(worker, self.cfg, on_failure)
        self.backend = self.executor.name
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.batch_invariant = batch_invariant
        self.model = None
        if self.speculative_config is not None and self.speculative_config.method == "dspark":
            self.model = TargetHead(self.cfg, self.model_dir, self.dtype, self.device, seed)
        self.drafter = (
            make_drafter(self.speculative_config, self.model, self.model_dir) if self.speculative_config else None
        )
        self._ids = itertools.count()
        atexit.register(self.close)

    def rebalance(self, redundant: int = 0) -> dict:
        """Re-place every MoE layer's experts for the per-expert load recorded since the last placement
        (summed over all ranks), with ``redundant`` extra replicas of the hottest experts; each rank reads
        its new experts. Returns {layer: ExpertPlacement}. Outputs do not change, only where experts run."""
        return self.executor.rebalance(redundant)

    def close(self) -> None:
        """Stop the other ranks (idempotent)."""
        self.executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
