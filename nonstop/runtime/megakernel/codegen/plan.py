"""From recorded launches to what the megakernel reads: task classes (opcodes), instances, arg tables.

``build_plan(launches)`` (one list of ``record.Launch`` per program op) gives a ``Plan``:
  stages   per op, the ``(stage name, class, instance, ntiles)`` of each phase, in order;
  classes  ``TaskClass`` list: the opcode of a task is its class index (see ``source``);
  ptrs / ints / floats   the argument tables, one row per instance (= recorded launch).
A launcher's stages are its declared phases (``nonstop.kernels.launch``: one, or two or three for the
multi-phase super-ops); a class calls the launcher's tile function with ``PHASE`` = the stage's phase (1, 2, 3).
Argument kinds: ``const`` (a constexpr: part of the class), ``ptr`` / ``wptr`` (a tensor / one of the op's
weights: its address in ``ptrs`` / ``wptrs``, dtype in the class; weights apart, so the offline check can
tell weight loads from the rest), ``int`` / ``float`` (scalars: baked into the class when equal in all its
instances).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from nonstop.kernels.launch import declaration
from nonstop.runtime.megakernel.codegen import source


@dataclass
class Param:
    name: str
    kind: str  # const | ptr | wptr | int | float | none
    value: object = None  # const value; for a uniform scalar its value
    dtype: str = ""  # pointer element type / integer type (tl names)
    slot: int = 0  # column in ptrs (ptr), wptrs (wptr) or ints / floats (scalars)
    uniform: bool = False
    align16: bool = False  # every instance's address (ptr) / value (per-instance int) is a multiple of 16


@dataclass
class TaskClass:
    """A stage body with its compile-time facts: ``body`` the launcher's tile function, ``phase`` the
    ``PHASE`` it runs (0: a one-phase tile function, which takes none), ``num_tiles`` whether the tile
    function takes the stage's tile count."""

    body: object
    params: list[Param]
    label: str
    phase: int = 0
    num_tiles: bool = False
    instances: list[int] = field(default_factory=list)


@dataclass
class StageRun:
    name: str
    opcode: int
    instance: int
    ntiles: int


@dataclass
class Plan:
    classes: list[TaskClass]
    stages: list[list[StageRun]]  # per program op
    ptrs: torch.Tensor
    wptrs: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    max_p: int
    max_w: int
    max_s: int

    def signature(self) -> tuple:
        """What the generated source depends on (classes, table widths)."""
        return tuple(
            (
                id(c.body),
                c.phase,
                tuple(
                    (
                        p.name,
                        p.kind,
                        repr(p.value) if p.kind == "const" or p.uniform else "",
                        p.dtype,
                        p.slot,
                        p.align16,
                    )
                    for p in c.params
                ),
            )
            for c in self.classes
        ) + (self.max_p, self.max_s)


def stages_of(launch) -> list[tuple[str, object, int, int, bool]]:
    """(stage name, tile function, PHASE, ntiles, takes num_tiles) of a recorded launch."""
    decl = declaration(launch.fn)
    if decl is None:
        raise ValueError(
            f"{launch.name} is not a declared launcher (nonstop.kernels.launch.launcher): the megakernel cannot run it"
        )
    phases = decl.phase_tiles(launch.args, launch.grid)
    two = len(phases) > 1
    return [(name, decl.tile_fn, k + 1 if two else 0, n, decl.num_tiles) for k, (name, n) in enumerate(phases)]


def describe_args(launch) -> list[tuple[str, str, object]]:
    """(name, kind, value) per launcher parameter; kind const | ptr | wptr | int | float | none."""
    params = inspect.signature(launch.fn).parameters
    out = []
    for name, p in params.items():
        value = launch.args.get(name, p.default)
        if value is inspect.Parameter.empty:
            raise ValueError(f"{launch.name}: argument {name} missing")
        if name == "USE_PDL":  # a launch-level wait; the megakernel orders its tasks by its own counters
            value = False
        if source.is_constexpr(p):
            out.append((name, "const", value))
        elif isinstance(value, torch.Tensor):
            out.append((name, "wptr" if name in launch.weights else "ptr", value))
        elif value is None:
            out.append((name, "none", None))
        elif isinstance(value, bool):
            out.append((name, "int", int(value)))
        elif isinstance(value, int):
            out.append((name, "int", value))
        elif isinstance(value, float):
            out.append((name, "float", value))
        else:
            raise ValueError(f"{launch.name}: cannot pass argument {name}={value!r} through the megakernel tables")
    return out


def _check_devices(launch, args, device) -> None:
    """The tables hold raw addresses: a tensor on another device (a host tensor on a GPU) would be read
    at an address the kernel cannot reach (an illegal address inside the persistent kernel). Refuse it.
    Off a GPU nothing is dereferenced by hardware (the interpreter; ``gpucheck``'s meta weights)."""
    want = torch.device(device).type
    if want != "cuda":
        return
    off = [f"{n} on {v.device}" for n, kind, v in args if kind in ("ptr", "wptr") and v.device.type != want]
    if off:
        raise ValueError(f"megakernel: {launch.name} takes tensors off the {want} device: {', '.join(off)}")


def build_plan(launches: list[list], device) -> Plan:
    instances = []  # per instance: described args
    keyed: dict[tuple, int] = {}
    classes: list[TaskClass] = []
    stages: list[list[StageRun]] = []
    for op_launches in launches:
        runs = []
        for launch in op_launches:
            args = describe_args(launch)
            _check_devices(launch, args, device)
            inst = len(instances)
            instances.append(args)
            for stage_name, body, phase, ntiles, num_tiles in stages_of(launch):
                key = (
                    id(body),
                    phase,
                    tuple(
                        (n, kind, repr(v) if kind == "const" else (v.dtype if kind in ("ptr", "wptr") else kind))
                        for n, kind, v in args
                    ),
                )
                if key not in keyed:
                    keyed[key] = len(classes)
                    slots = {"ptr": 0, "wptr": 0, "scalar": 0}
                    params = []
                    for n, kind, v in args:
                        if kind in ("ptr", "wptr"):
                            params.append(Param(n, kind, dtype=source.TORCH_TO_TL[v.dtype], slot=slots[kind]))
                            slots[kind] += 1
                        elif kind in ("int", "float"):
                            params.append(Param(n, kind, slot=slots["scalar"]))
                            slots["scalar"] += 1
                        else:
                            params.append(Param(n, kind, value=v))
                    classes.append(TaskClass(body, params, f"{launch.name}/{stage_name}", phase, num_tiles))
                cls = keyed[key]
                classes[cls].instances.append(inst)
                runs.append(StageRun(stage_name, cls, inst, ntiles))
        stages.append(runs)
    max_p = max([sum(k == "ptr" for _, k, _ in a) for a in instances] + [1])
    max_w = max([sum(k == "wptr" for _, k, _ in a) for a in instances] + [1])
    max_s = max([sum(k in ("int", "float") for _, k, _ in a) for a in instances] + [1])
    ptrs = torch.zeros(len(instances), max_p, dtype=torch.int64)
    wptrs = torch.zeros(len(instances), max_w, dtype=torch.int64)
    ints = torch.zeros(len(instances), max_s, dtype=torch.int64)
    floats = torch.zeros(len(instances), max_s, dtype=torch.float32)
    for i, args in enumerate(instances):
        p = w = s = 0
        for _, kind, v in args:
            if kind == "ptr":
                ptrs[i, p] = v.data_ptr()
                p += 1
            elif kind == "wptr":
                wptrs[i, w] = v.data_ptr()
                w += 1
            elif kind == "int":
                ints[i, s] = v
                s += 1
            elif kind == "float":
                floats[i, s] = v
                s += 1
    for cls in classes:  # scalars equal in every instance of a class become constants of its code
        for param in cls.params:
            if param.kind in ("ptr", "wptr"):
                table = ptrs if param.kind == "ptr" else wptrs
                param.align16 = bool((table[cls.instances, param.slot] % 16 == 0).all())
            if param.kind not in ("int", "float"):
                continue
            col = (ints if param.kind == "int" else floats)[cls.instances, param.slot]
            if param.kind == "int":
                param.dtype = source.int_type(col.tolist())
            if bool((col == col[0]).all()):
                param.uniform, param.value = True, col[0].item()
            elif param.kind == "int":
                param.align16 = bool((col % 16 == 0).all())
    return Plan(
        classes, stages, ptrs.to(device), wptrs.to(device), ints.to(device), floats.to(device), max_p, max_w, max_s
    )
