"""Moving a super-op's whole step state (op + buffers + caches + batch) between processes, with guard bands.

A *state* is the object graph a launcher sees: ``(op, buf, cache, batch)``. ``pack`` turns it into
plain data: the graph pickled with every tensor replaced by a persistent id
(``("tensor", index)``, ``_Pickler.persistent_id``), the tensors'
views (storage index, element offset, shape, stride, dtype) and the raw bytes of every distinct
storage. Aliasing survives (two views of one packed weight stay two views of one storage).

``unpack`` (in the verification child) rebuilds the graph on fresh memory: each storage is copied into
a new allocation of ``GUARD`` random bytes + the storage + ``GUARD`` random bytes, so every call gets
fresh addresses, and a write just outside any tensor shows up in the guard bands.

``named_tensors`` walks a state and names every tensor by its path (``buf.h``,
``cache.layers[3].recurrent``, ``op.weights.w`` ...): outputs and inputs are compared by path.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass

import torch

GUARD = 4096  # bytes of guard band on each side of every storage (a multiple of every element size)


@dataclass(frozen=True)
class View:
    """A tensor as a view of storage ``storage``: element offset, shape, stride and dtype name."""

    storage: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    def itemsize(self) -> int:
        return torch.empty(0, dtype=dtype_of(self.dtype)).element_size()


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ----------------------------------------------------------------------------- walking a state


def _children(obj):
    """(name, child) pairs of the containers and nonstop / torch.nn objects a state is made of."""
    if isinstance(obj, dict):
        return [(f"[{k!r}]" if not isinstance(k, str) else f".{k}", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    module = type(obj).__module__ or ""
    if (module.startswith("nonstop.") or isinstance(obj, torch.nn.Module)) and hasattr(obj, "__dict__"):
        return [(f".{k}", v) for k, v in vars(obj).items() if not callable(v) or isinstance(v, torch.nn.Module)]
    return []


def named_tensors(state: dict) -> dict[str, torch.Tensor]:
    """{path: tensor} of every tensor reachable from ``state`` (a dict of roots), each tensor once
    (the first path in a depth-first walk)."""
    out: dict[str, torch.Tensor] = {}
    seen_tensors: set[int] = set()
    seen: set[int] = set()
    stack = [(name, obj) for name, obj in reversed(list(state.items()))]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen_tensors:
                seen_tensors.add(id(obj))
                out[path] = obj
            continue
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        stack.extend((path + name, child) for name, child in reversed(_children(obj)))
    return out


# ----------------------------------------------------------------------------- pack (parent side)


class _Table:
    def __init__(self):
        self.storages: list[torch.UntypedStorage] = []
        self.views: list[View] = []
        self._storage_index: dict[tuple, int] = {}
        self._tensor_index: dict[int, int] = {}
        self._keep: list = []

    def storage_index(self, t: torch.Tensor) -> int:
        s = t.untyped_storage()
        key = (s.data_ptr(), s.nbytes(), str(s.device)) if s.nbytes() else ("empty", id(s))
        if key not in self._storage_index:
            self._storage_index[key] = len(self.storages)
            self.storages.append(s)
            self._keep.append(s)
        return self._storage_index[key]

    def add(self, t: torch.Tensor) -> int:
        if id(t) not in self._tensor_index:
            self._tensor_index[id(t)] = len(self.views)
            self._keep.append(t)
            self.views.append(view_of(t, self.storage_index(t)))
        return self._tensor_index[id(t)]


def view_of(t: torch.Tensor, storage: int) -> View:
    return View(storage, t.storage_offset(), tuple(t.shape), tuple(t.stride()), dtype_name(t.dtype))


class _Pickler(pickle.Pickler):
    def __init__(self, file, table: _Table):
        super().__init__(file, protocol=4)
        self.table = table

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            return ("tensor", self.table.add(obj))
        return None


@dataclass
class Packed:
    """A state as plain data: ``skeleton`` (pickle bytes), ``views`` (one per tensor), ``storages``
    (uint8 CPU tensors, one per distinct storage) and ``paths`` ({path: tensor index})."""

    skeleton: bytes
    views: list[View]
    storages: list[torch.Tensor]
    paths: dict[str, int]

    def path_views(self) -> dict[str, View]:
        return {p: self.views[i] for p, i in self.paths.items()}


def storage_bytes(s: torch.UntypedStorage) -> torch.Tensor:
    """The whole storage as a flat uint8 tensor (a view, same device)."""
    return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)


def pack(state: dict) -> Packed:
    table = _Table()
    buf = io.BytesIO()
    _Pickler(buf, table).dump(state)
    paths = {path: table.add(t) for path, t in named_tensors(state).items()}
    storages = [storage_bytes(s).cpu().clone() for s in table.storages]
    return Packed(buf.getvalue(), table.views, storages, paths)


def snapshot(state: dict, packed: Packed) -> list[torch.Tensor]:
    """The current bytes of ``packed``'s storages, read again from the live ``state`` (after a twin ran
    on it): storages are matched through the paths, so the state must not have re-allocated them."""
    live = named_tensors(state)
    out: list[torch.Tensor | None] = [None] * len(packed.storages)
    for path, index in packed.paths.items():
        view = packed.views[index]
        t = live.get(path)
        if t is None or view_of(t, view.storage) != view:
            raise RuntimeError(f"the twin re-allocated {path}; the verifier needs states whose tensors stay in place")
        if out[view.storage] is None:
            out[view.storage] = storage_bytes(t.untyped_storage()).cpu().clone()
    return [s if s is not None else packed.storages[i] for i, s in enumerate(out)]


# ----------------------------------------------------------------------------- unpack (child side)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors: list[torch.Tensor]):
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid):
        kind, index = pid
        if kind != "tensor":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        return self.tensors[index]


@dataclass
class Unpacked:
    """A rebuilt state: ``state`` (the object graph), ``padded`` (per storage: the guarded allocation,
    uint8 [GUARD + nbytes + GUARD]) and ``guards`` (the guard bytes written, per storage)."""

    state: dict
    padded: list[torch.Tensor]
    guards: list[torch.Tensor]

    def body(self, index: int) -> torch.Tensor:
        """The storage's bytes (without guards) as a uint8 view."""
        p = self.padded[index]
        return p[GUARD : p.numel() - GUARD]

    def guard_intact(self, index: int) -> bool:
        p = self.padded[index]
        return bool(torch.equal(torch.cat([p[:GUARD], p[p.numel() - GUARD :]]).cpu(), self.guards[index]))

    def storage_of(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(storage index, element offset inside the storage) of a tensor that lives in one of the
        padded allocations, else None (a tensor the launch allocated or swapped in)."""
        ptr = t.untyped_storage().data_ptr()
        for i, p in enumerate(self.padded):
            if p.untyped_storage().data_ptr() == ptr:
                return i, t.storage_offset() - GUARD // t.element_size()
        return None


def unpack(packed: Packed, device, generator: torch.Generator) -> Unpacked:
    padded, guards = [], []
    for raw in packed.storages:
        n = raw.numel()
        guard = torch.randint(0, 256, (2 * GUARD,), dtype=torch.uint8, generator=generator)
        p = torch.empty(n + 2 * GUARD, dtype=torch.uint8, device=device)
        p[:GUARD].copy_(guard[:GUARD])
        p[GUARD + n :].copy_(guard[GUARD:])
        p[GUARD : GUARD + n].copy_(raw)
        padded.append(p)
        guards.append(guard)
    tensors = []
    for v in packed.views:
        dtype = dtype_of(v.dtype)
        base = GUARD // torch.empty(0, dtype=dtype).element_size()
        t = torch.empty(0, dtype=dtype, device=device).set_(
            padded[v.storage].untyped_storage(), base + v.offset, v.shape, v.stride
        )
        tensors.append(t)
    state = _Unpickler(io.BytesIO(packed.skeleton), tensors).load()
    return Unpacked(state, padded, guards)
