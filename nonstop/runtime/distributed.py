"""``RankExecutor``: one rank's part of a decode step under a multi-rank layout.

It runs the rank's Program (``dist/program.py``: the single-device super-ops of its weights plus
collective super-ops) for the rows of its attention group:
* ``reference``: every op as its plain-torch twin (``program/reference.py``, ``dist/ops.py``);
* ``superop``: every op as its Triton super-op (``nonstop/kernels``) with the collectives between the
  launches; steps of more rows than the kernels take (long prefills) run the twins.
The megakernel runs one device only and is refused under a multi-rank layout.

Each step's MoE exchange mode (``exchange``: auto | static | dynamic) is chosen from facts every rank of an
expert group shares (``dist/exchange.py``): the rows of every attention group this step, the layout, the
device type, whether capture is forced. With the static exchange a superop step reads nothing back from
the device, and on CUDA (``graphs``: auto captures the static steps, True makes every decode step static
and captured) the whole rank step - kernels and NCCL collectives - is captured in one CUDA graph per
step shape and replayed (``runtime/cuda_graph.py``: static buffers and step tensors, pools grown before
the step, re-captured when the cache storage moved). A capture records the collectives without running
them, so a rank that re-captures still runs each collective exactly once per step, as its peers do.
Untested on GPUs (no multi-GPU machine was lent): a capture that fails falls back to eager launches.

The first eager steps of a shape run under a ``LaunchCounter``: ``stats["host_syncs"]`` holds the host
synchronisations (``.item()``, ``.tolist()``, ``.cpu()``, ``nonzero``, host uploads) per op kind of the
latest counted step - none in a static superop step.

An attention group with no rows in a step still joins the expert group's all-to-alls (``idle``): its
``moe_ep`` ops run on zero rows, every other op is skipped (the group's all-reduces have no rows either).
"""

from __future__ import annotations

import sys
import warnings
from collections import OrderedDict

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.config import ModelConfig
from nonstop.dist.comm import Comm
from nonstop.dist.exchange import REQUESTS, choose_exchange
from nonstop.dist.ops import KERNEL_OPS, TWINS, DistEnv
from nonstop.dist.program import lower_rank
from nonstop.model.rows import is_row_exact
from nonstop.program.reference import REFERENCE
from nonstop.program.taps import read_taps
from nonstop.runtime.cuda_graph import fit_pools, graphs_wanted, module_containers, new_pool, storage_signature
from nonstop.runtime.executors import BACKENDS as SINGLE_PROCESS_BACKENDS
from nonstop.runtime.executors import triton_interpreter
from nonstop.runtime.launch_count import LaunchCounter
from nonstop.runtime.superop import StaticStep

BACKENDS = ("reference", "superop")
SHAPES_KEPT = 8  # activation buffers (and captured graphs) kept for this many step shapes
COUNTED_STEPS = 3  # eager steps of a shape counted until two counts agree


def rank_backend(backend: str) -> str:
    """The backend a rank runs: ``auto`` is ``reference`` under a layout (the compiled CPU path is
    single-process)."""
    return "reference" if backend == "auto" else backend


def check_backend(backend: str, device: torch.device, world: int) -> None:
    backend = rank_backend(backend)
    if backend == "megakernel":
        raise ValueError(
            "backend 'megakernel' runs the whole step in one kernel on one device; under a multi-rank layout "
            f"({world} ranks) use --backend reference or superop"
        )
    if backend in SINGLE_PROCESS_BACKENDS and backend not in BACKENDS:  # the step compiled for a CPU
        raise ValueError(
            f"backend {backend!r} runs the whole model in a single process; under a multi-rank layout "
            f"({world} ranks) use --backend {' or '.join(BACKENDS)}"
        )
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; under a multi-rank layout choose one of: {', '.join(BACKENDS)}")
    if backend == "superop" and device.type != "cuda" and not triton_interpreter():
        raise ValueError(
            "backend 'superop' runs Triton kernels: it needs CUDA devices, or TRITON_INTERPRET=1 to run them in "
            "Triton's CPU interpreter (for testing)"
        )


def check_exchange(exchange: str) -> None:
    if exchange not in REQUESTS:
        raise ValueError(f"unknown MoE exchange {exchange!r}; choose one of: {', '.join(REQUESTS)}")


def _snapshot(stats: dict) -> dict:
    return {k: tuple(v) for k, v in stats.items()}


def _restore(stats: dict, snapshot: dict) -> None:
    """Put ``Comm.stats`` (kind -> [launches, bytes]) back to a snapshot."""
    stats.clear()
    stats.update({k: list(v) for k, v in snapshot.items()})


def _kept(cache: OrderedDict, key, make):
    """``cache[key]`` (made by ``make()`` when missing), most recent last; at most SHAPES_KEPT entries."""
    value = cache.pop(key, None)
    if value is None:
        value = make()
    cache[key] = value
    while len(cache) > SHAPES_KEPT:
        cache.popitem(last=False)
    return value


class RankExecutor:
    """``run(ids [B, T], cache, batch, taps, group_rows)`` -> (logits [B, T, V] fp32 on the group's first
    rank else None, {tap: [B, T, d]}); ``idle(group_rows)`` joins a step with no rows of its own.

    exchange: auto | static | dynamic (the MoE exchange, ``dist/exchange.py``). graphs: True | False |
    "auto" (CUDA, superop, static exchange) | "emulate" (the capture / replay logic without CUDA: replay
    re-runs the step; for tests)."""

    def __init__(
        self,
        comm: Comm,
        cfg: ModelConfig,
        model,
        backend: str = "reference",
        chunks: int = 1,
        overlap: bool = False,
        exchange: str = "auto",
        graphs="auto",
    ):
        backend = rank_backend(backend)
        check_backend(backend, comm.device, comm.layout.world)
        check_exchange(exchange)
        self.comm = comm
        self.cfg = cfg  # the whole model's config
        self.local_cfg = model.cfg
        self.backend = backend
        self.exchange = exchange
        self.program = lower_rank(model, cfg, comm.layout, comm.rank, chunks, overlap)
        self.twins = {**REFERENCE, **TWINS}
        kernel_modules = []
        if backend == "superop":
            from nonstop.kernels import KERNELS

            self.kernels = {**KERNELS, **KERNEL_OPS}
            kernel_modules = [
                m for name, m in sorted(sys.modules.items()) if name.startswith("nonstop.kernels.") and m is not None
            ]
        else:
            self.kernels = self.twins
        self.emulate = graphs == "emulate"
        self.graphs_required = self.emulate or graphs is True  # then every decode step is static and captured
        if self.emulate:
            self.graphs, reason = True, "emulated (replay re-runs the step)"
        elif exchange == "dynamic":
            self.graphs, reason = False, "off: the dynamic MoE exchange reads split sizes on the host"
        else:
            self.graphs, reason = graphs_wanted(comm.device, backend == "superop", graphs)
        self._pool = new_pool(comm.device) if self.graphs and not self.emulate else None
        self._kept = module_containers(kernel_modules)  # kernel workspaces: part of the storage signature
        self._buffers: OrderedDict = OrderedDict()
        self._steps: OrderedDict = OrderedDict()  # captured step shapes
        self._modes: OrderedDict = OrderedDict()  # group_rows -> (mode, reason)
        self._counts_left: dict = {}
        self._route_on_device()
        moe_in = self.program.buffers.get("moe_in")
        self._width_bytes = 0 if moe_in is None else moe_in.row_numel * self.program.dtype.itemsize
        self.stats = {
            "steps": 0,
            "idle_steps": 0,
            "exchange": None,
            "exchange_steps": {"static": 0, "dynamic": 0},
            "graphs": reason,
            "graph_captures": 0,
            "graph_replays": 0,
            "host_syncs_per_step": None,
            "host_syncs": {},
            "launches": {},
        }

    def _route_on_device(self) -> None:
        """Build every placement's routing tables on the data device now, not inside a step."""
        for op in self.program.ops:
            if op.kind == "moe_ep":
                op.attrs["placement"].tables_on(self.comm.device)

    # ------------------------------------------------------------------ the exchange mode
    def exchange_mode(self, group_rows: tuple[int, ...]) -> str:
        """The MoE exchange of a step whose attention groups have ``group_rows`` rows (the same on every
        rank of an expert group: it depends on nothing rank-specific)."""
        max_rows = self.program.max_rows
        required = self.graphs and self.graphs_required
        mode, reason = _kept(
            self._modes,
            group_rows,
            lambda: choose_exchange(
                self.exchange,
                self.program.ops,
                group_rows,
                max_rows,
                self.comm.device.type,
                required,
                self._width_bytes,
            ),
        )
        self.stats["exchange"] = f"{mode}: {reason}"
        self.stats["exchange_steps"][mode] += 1
        return mode

    # ------------------------------------------------------------------ running the ops
    def _launch_all(self, env: DistEnv, impl: dict, only: str | None = None) -> None:
        for op in self.program.ops:
            if only is None or op.kind == only:
                impl[op.kind](op, env)

    def _run_eagerly(self, env: DistEnv, impl: dict, name: str) -> None:
        """Run the ops now; the first steps of a shape are counted (launches, host syncs per op kind)."""
        left = self._counts_left.get(name, COUNTED_STEPS)
        if left == 0:
            self._launch_all(env, impl)
            return
        counter = LaunchCounter(self.comm.device)
        with counter:
            for op in self.program.ops:
                with counter.tagged(op.kind):
                    impl[op.kind](op, env)
        got = counter.summary()
        previous = self.stats["launches"].get(name)
        self._counts_left[name] = 0 if previous is not None and previous["launches"] == got["launches"] else left - 1
        self.stats["launches"][name] = got
        self.stats["host_syncs_per_step"] = got["host_syncs"]
        self.stats["host_syncs"] = got["host_syncs_by_kind"]

    def _run_captured(
        self, ids: torch.Tensor, cache: ModelCache, batch: StepBatch, group_rows: tuple[int, ...], mode: str
    ):
        """The step through its shape's CUDA graph: replayed when the cache storage is the one it was
        captured with, else run eagerly and captured again. Returns the shape's buffers."""
        B, T = ids.shape
        key = (B, T, bool(batch.keep_states), is_row_exact())
        step = _kept(
            self._steps,
            key + (group_rows,),
            lambda: StaticStep(self.program, key, self.comm.device, self._pool, self.emulate),
        )
        step.buf["ids"].copy_(ids.reshape(-1))
        step.slots.copy_(batch.slots)
        step.start.copy_(batch.start)
        env = DistEnv(step.buf, cache, step.batch, comm=self.comm, group_rows=group_rows, exchange=mode)
        name = f"{step.name} {mode}"
        if step.graph_off is not None:
            self._run_eagerly(env, self.kernels, name)
            return step.buf
        fit_pools(cache)
        signature = storage_signature(cache, [getattr(m, n) for m, n in self._kept])
        stats = self.comm.stats
        before = _snapshot(stats)
        if step.graph.ready and step.graph.signature == signature:
            step.graph.replay()  # a CUDA replay runs no Python: the collectives' counts are added by hand
            _restore(stats, before)
            for kind, (launches, sent) in step.sent.items():
                stats[kind][0] += launches
                stats[kind][1] += sent
            self.stats["graph_replays"] += 1
            return step.buf
        self._run_eagerly(env, self.kernels, name)
        step.sent = {k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1]) for k, v in stats.items()}
        counted = _snapshot(stats)
        kept = [getattr(m, n) for m, n in self._kept]
        try:  # a capture records the collectives without running them: nothing is sent
            step.graph.capture(lambda: self._launch_all(env, self.kernels), storage_signature(cache, kept))
            self.stats["graph_captures"] += 1
        except Exception as exc:  # a launch or a collective that is not capturable: this shape runs eagerly
            step.graph.release()
            step.graph_off = f"capture failed: {type(exc).__name__}: {exc}"
            self.stats["graphs"] = f"off for {step.name}: {step.graph_off}"
            warnings.warn(f"rank {self.comm.rank}: CUDA graph {step.graph_off}", RuntimeWarning, stacklevel=3)
        _restore(stats, counted)
        return step.buf

    def run(
        self,
        ids: torch.Tensor,
        cache: ModelCache,
        batch: StepBatch,
        taps: tuple[int, ...] = (),
        group_rows: tuple[int, ...] | None = None,
    ):
        """One step of this rank's attention group; ``group_rows``: rows (B·T) of every attention group this
        step (default: every group as many as this one)."""
        B, T = ids.shape
        rows = B * T
        group_rows = tuple(group_rows) if group_rows else (rows,) * self.comm.layout.dp
        mode = self.exchange_mode(group_rows)
        kernels = rows <= self.program.max_rows
        if self.graphs and kernels and mode == "static":
            buf = self._run_captured(ids, cache, batch, group_rows, mode)
        else:
            buf = _kept(self._buffers, rows, lambda: self.program.allocate(rows, self.comm.device))
            buf["ids"].copy_(ids.reshape(-1))
            env = DistEnv(buf, cache, batch, comm=self.comm, group_rows=group_rows, exchange=mode)
            name = f"{B}x{T} {mode}" + ("" if kernels else " twins")
            self._run_eagerly(env, self.kernels if kernels else self.twins, name)
        self.stats["steps"] += 1
        logits = buf["logits"].view(B, T, -1).clone() if self.comm.leader else None
        hidden = read_taps(self.local_cfg, buf, tuple(taps), B, T) if taps else {}
        return logits, hidden

    def idle(self, group_rows: tuple[int, ...] | None = None) -> None:
        """Join a step in which this rank's attention group has no rows (``group_rows``: every group's rows)."""
        group_rows = tuple(group_rows) if group_rows else (0,) * self.comm.layout.dp
        mode = self.exchange_mode(group_rows)
        buf = _kept(self._buffers, 0, lambda: self.program.allocate(0, self.comm.device))
        env = DistEnv(buf, None, None, comm=self.comm, group_rows=group_rows, exchange=mode)
        self._launch_all(env, self.kernels, only="moe_ep")
        self.stats["idle_steps"] += 1

    def set_placement(self, layout, experts: dict[str, torch.Tensor]) -> None:
        """Hold the experts of ``layout``'s placement from now on: ``experts`` = {``layers.i.mlp.experts.*``:
        this rank's stacked experts under that placement}; the per-expert load counts restart, and the
        captured steps and exchange plans (made for the old placement and weights) are dropped."""
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
            a.update(
                placement=placement,
                experts=module,
                local_experts=len(local),
                physical_experts=placement.physical,
                max_local=placement.max_local,
                local_fraction=placement.local_fraction(a["ep_rank"]),
            )
            a.pop("load", None)
            a.pop("static_plans", None)
        self._route_on_device()
        self._steps.clear()
        self._modes.clear()
        self._counts_left.clear()
        self.comm.layout = layout

    def expert_load(self) -> dict[int, torch.Tensor]:
        """Pairs this rank routed to each logical expert so far, per MoE layer ({layer: [E]}, on the CPU)."""
        return {
            op.layer: op.attrs.get("load", torch.zeros(op.attrs["moe"].num_experts, dtype=torch.long)).cpu().clone()
            for op in self.program.ops
            if op.kind == "moe_ep"
        }
