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
from nonstop.engine.distributed import ClusterExecutor, build_worker
from nonstop.engine.llm import LLM, _eos_ids, check_device, parse_dtype, resolve_model
from nonstop.engine.spec.config import SpecConfig, make_drafter
from nonstop.engine.tokenizer import Tokenizer


class TargetHead:
    """What a DSpark drafter reads of its target: config, whole embedding and LM head (rank 0 only)."""

    def __init__(self, cfg, model_dir, dtype: torch.dtype, device, seed: int):
        from nonstop.dist.layout import Layout
        from nonstop.dist.load import load_rank_state, random_rank_state

        whole = Layout()
        state = random_rank_state(cfg, whole, 0, dtype, device, seed) if model_dir is None else load_rank_state(cfg, whole, 0, model_dir, dtype, device)
        self.cfg = cfg
        self.embed_tokens = torch.nn.Embedding.from_pretrained(state["embed_tokens.weight"], freeze=True)
        self.lm_head_weight = self.embed_tokens.weight if cfg.tie_word_embeddings else state["lm_head.weight"]


class DistributedLLM(LLM):
    """``LLM`` whose decode steps run on every rank of ``comm``'s layout (rank 0 only).

    Extra arguments: ``comm`` (from ``nonstop.dist.comm.init``), ``chunks`` / ``overlap`` of the MoE
    exchange (defaults: 2 overlapped chunks on CUDA, 1 on CPU), ``on_failure(message)`` called when
    another rank fails (the CLI prints and exits).
    """

    def __init__(self, model="k3-nano", dtype=None, device: str = "cpu", backend: str = "reference", max_batch: int = 16, seed: int = 0, speculative: dict | None = None, progress: bool = False, prefill_chunk: int | None = None, batch_invariant: bool = False, *, comm: Comm, chunks: int | None = None, overlap: bool | None = None, on_failure=None):
        if comm.rank != 0:
            raise ValueError(f"DistributedLLM runs on rank 0; rank {comm.rank} follows (nonstop.engine.distributed.follow)")
        check_device(device)
        self.device = comm.device
        self.dtype = parse_dtype(dtype, str(device))
        self.cfg, self.model_dir = resolve_model(model)
        self.name = str(model)
        if self.model_dir is None:
            print(f"nonstop: {model!r} is a preset: using random weights (seed {seed})", file=sys.stderr)
        worker = build_worker(comm, self.cfg, self.model_dir, self.dtype, backend, seed, chunks, overlap, progress)
        self.comm = comm
        self.layout = comm.layout
        self.executor = ClusterExecutor(worker, self.cfg, on_failure)
        self.tokenizer = Tokenizer.load(self.model_dir, self.cfg.vocab_size)
        self.eos_ids = _eos_ids(self.cfg, self.model_dir)
        self.backend = backend
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.batch_invariant = batch_invariant
        self.speculative = SpecConfig.parse(speculative)
        self.model = None
        if self.speculative is not None and self.speculative.method == "dspark":
            self.model = TargetHead(self.cfg, self.model_dir, self.dtype, self.device, seed)
        self.drafter = make_drafter(self.speculative, self.model, self.model_dir) if self.speculative else None
        self._ids = itertools.count()
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the other ranks (idempotent)."""
        self.executor.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
