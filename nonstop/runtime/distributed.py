"""``RankExecutor``: one rank's part of a decode step under a multi-rank layout.

It runs the rank's Program (``dist/program.py``: the single-device super-ops of its weights plus
collective super-ops) for the rows of its attention group:
* ``reference``: every op as its plain-torch twin (``program/reference.py``, ``dist/ops.py``);
* ``superop``: every op as its Triton super-op (``nonstop/kernels``) with the collectives between the
  launches; steps of more rows than the kernels take (long prefills) run the twins. Launches run eagerly:
  the MoE exchange's split sizes are data-dependent, so a step is not captured in a CUDA graph yet.
The megakernel runs one device only and is refused under a multi-rank layout.

An attention group with no rows in a step still joins the expert group's all-to-alls (``idle``): its
``moe_ep`` ops run on zero rows, every other op is skipped (the group's all-reduces have no rows either).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.config import ModelConfig
from nonstop.dist.comm import Comm
from nonstop.dist.ops import KERNEL_OPS, TWINS, DistEnv
from nonstop.dist.program import lower_rank
from nonstop.program.reference import REFERENCE
from nonstop.program.taps import read_taps
from nonstop.runtime.executors import triton_interpreter

BACKENDS = ("reference", "superop")
SHAPES_KEPT = 8  # activation buffers kept for this many step shapes (B, T)


def rank_backend(backend: str) -> str:
    """The backend a rank runs: ``auto`` is ``reference`` under a layout (the compiled CPU path is
    single-process)."""
    return "reference" if backend == "auto" else backend


def check_backend(backend: str, device: torch.device, world: int) -> None:
    backend = rank_backend(backend)
    if backend == "megakernel":
        raise ValueError(f"backend 'megakernel' runs the whole step in one kernel on one device; under a multi-rank layout ({world} ranks) use --backend reference or superop")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; under a multi-rank layout choose one of: {', '.join(BACKENDS)}")
    if backend == "superop" and device.type != "cuda" and not triton_interpreter():
        raise ValueError("backend 'superop' runs Triton kernels: it needs CUDA devices, or TRITON_INTERPRET=1 to run them in Triton's CPU interpreter (for testing)")


class RankExecutor:
    """``run(ids [B, T], cache, batch, taps)`` -> (logits [B, T, V] fp32 on the group's first rank else
    None, {tap: [B, T, d]}); ``idle()`` joins a step with no rows of its own."""

    def __init__(self, comm: Comm, cfg: ModelConfig, model, backend: str = "reference", chunks: int = 1, overlap: bool = False):
        backend = rank_backend(backend)
        check_backend(backend, comm.device, comm.layout.world)
        self.comm = comm
        self.cfg = cfg  # the whole model's config
        self.local_cfg = model.cfg
        self.backend = backend
        self.program = lower_rank(model, cfg, comm.layout, comm.rank, chunks, overlap)
        self.twins = {**REFERENCE, **TWINS}
        if backend == "superop":
            from nonstop.kernels import KERNELS

            self.kernels = {**KERNELS, **KERNEL_OPS}
        else:
            self.kernels = self.twins
        self._buffers: OrderedDict = OrderedDict()
        self.stats = {"steps": 0, "idle_steps": 0}

    def _buffers_for(self, rows: int) -> dict[str, torch.Tensor]:
        buf = self._buffers.pop(rows, None)
        if buf is None:
            buf = self.program.allocate(rows, self.comm.device)
        self._buffers[rows] = buf
        while len(self._buffers) > SHAPES_KEPT:
            self._buffers.popitem(last=False)
        return buf

    def run(self, ids: torch.Tensor, cache: ModelCache, batch: StepBatch, taps: tuple[int, ...] = ()):
        B, T = ids.shape
        buf = self._buffers_for(B * T)
        buf["ids"].copy_(ids.reshape(-1))
        env = DistEnv(buf, cache, batch, comm=self.comm)
        impl = self.kernels if B * T <= self.program.max_rows else self.twins
        for op in self.program.ops:
            impl[op.kind](op, env)
        self.stats["steps"] += 1
        logits = buf["logits"].view(B, T, -1).clone() if self.comm.leader else None
        hidden = read_taps(self.local_cfg, buf, tuple(taps), B, T) if taps else {}
        return logits, hidden

    def idle(self) -> None:
        buf = self._buffers_for(0)
        env = DistEnv(buf, None, None, comm=self.comm)
        for op in self.program.ops:
            if op.kind == "moe_ep":
                self.kernels[op.kind](op, env)
        self.stats["idle_steps"] += 1

    def set_placement(self, layout, experts: dict[str, torch.Tensor]) -> None:
        """Hold the experts of ``layout``'s placement from now on: ``experts`` = {``layers.i.mlp.experts.*``:
        this rank's stacked experts under that placement}; the per-expert load counts restart."""
        from nonstop.model.moe import RoutedExperts

        for op in self.program.ops:
            if op.kind != "moe_ep":
                continue
            a = op.attrs
            placement = layout.placement_for(op.layer, a["moe"].num_experts)
            local = placement.local(a["ep_rank"])
            old = a["experts"]
            with torch.device("meta"):
                module = RoutedExperts(len(local), old.shapes["w1"][1], old.shapes["w1"][0], old.fmt)
            prefix = f"layers.{op.layer}.mlp.experts."
            for name in list(op.weights):
                if name != "bias":
                    tensor = experts[prefix + name]
                    op.weights[name] = tensor
                    if name in module._parameters:
                        module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)
                    else:
                        module._buffers[name] = tensor
            a.update(placement=placement, experts=module, local_experts=len(local), physical_experts=placement.physical,
                     max_local=placement.max_local, local_fraction=placement.local_fraction(a["ep_rank"]))
            a.pop("load", None)
        self.comm.layout = layout

    def expert_load(self) -> dict[int, torch.Tensor]:
        """Pairs this rank routed to each logical expert so far, per MoE layer ({layer: [E]})."""
        return {op.layer: op.attrs.get("load", torch.zeros(op.attrs["moe"].num_experts, dtype=torch.long)).clone() for op in self.program.ops if op.kind == "moe_ep"}
