"""Capture a whole decode step in one CUDA graph and replay it; programmatic dependent launch (PDL).

A captured step replays fixed device addresses, so everything it touches must keep its storage:
* activation buffers, input ids, the step's slot and start tensors: static, owned by the executor,
  filled by copies before each replay;
* the caches: the paged pools grow (``fit_pool`` reallocates them) and the page table widens; the
  executor grows every pool *before* the step (``fit_pools``), compares ``storage_signature`` with the
  one the graph was captured under, and re-captures when any address or shape changed. Page-table
  *contents* (pages reserved in place) and slot lengths are read by the graph at replay, so they may
  change freely.

Graph-safety rules for kernel ``launch`` functions (what may run while a step is being captured):
no host synchronisation (``.item()``, ``int(t)``, ``.tolist()``, ``nonzero``, ``.cpu()``), no grid or
loop bound computed from step-varying data (use a static bound: the page table's width, the pool's
size, ``B``, ``T``), allocations only for temporaries that die within the step. ``LaunchCounter``
reports host syncs per op kind so that a CPU test catches violations.

PDL (Hopper+): a kernel launched with ``launch_pdl=True`` may start while its predecessor is still
running; it must execute ``tl.extra.cuda.gdc_wait()`` before it reads anything a predecessor wrote or
writes anything a predecessor reads (weights may be loaded before the wait), and may call
``tl.extra.cuda.gdc_launch_dependents()`` early to let its successor start. Kernel modules opt in per
launch: ``env.pdl`` says whether this step may use it, ``env.launch_kwargs`` is ``{"launch_pdl": True}``
or ``{}``; the launcher passes ``USE_PDL=env.pdl`` as a constexpr and starts with ``pdl_wait(USE_PDL)``
(the wait, then ``gdc_launch_dependents``; a false constexpr branch is never compiled, nor run by the
interpreter). Put the wait before software-pipelined loops (triton-lang/triton#11905: a pipelined
prologue load can be hoisted above a wait inside the loop). Every launcher kernel of ``nonstop/kernels``
opts in (``kernels/launch.py``: generated launchers, ``pdl_launch_args(env)``); torch operators (a
workspace's zeroing) launch as usual. The megakernel drops the launchers' ``USE_PDL``.
"""

from __future__ import annotations

import os

import torch

from nonstop.kernels.platform import interpreting

PDL_ENV = "NONSTOP_PDL"  # "0" turns PDL off
GRAPHS_ENV = "NONSTOP_CUDA_GRAPHS"  # "0" turns graph capture off


def pdl_support(device) -> tuple[bool, str]:
    """(usable, reason): PDL needs a CUDA device of compute capability >= 9.0 and a Triton with
    ``launch_pdl`` and ``tl.extra.cuda.gdc_wait`` (3.4+), not the interpreter."""
    device = torch.device(device)
    if device.type != "cuda":
        return False, f"device {device.type} (PDL is a CUDA feature)"
    if interpreting():
        return False, "Triton interpreter"
    if os.environ.get(PDL_ENV) == "0":
        return False, f"{PDL_ENV}=0"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return False, f"compute capability {major}.{minor} (PDL needs 9.0+)"
    try:
        import triton.language.extra.cuda as tl_cuda
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError as exc:
        return False, f"Triton without the CUDA backend ({exc})"
    if not hasattr(tl_cuda, "gdc_wait") or "launch_pdl" not in getattr(CUDAOptions, "__dataclass_fields__", {}):
        return False, "this Triton has no launch_pdl / gdc_wait (needs 3.4+)"
    return True, f"sm_{major}{minor}, Triton launch_pdl"


GRAPHS_CHOICES = (True, False, "auto", "emulate")  # "emulate": replay re-runs the step (tests, off a GPU)


def check_graphs(graphs) -> None:
    """A ValueError unless ``graphs`` is True, False, "auto" or "emulate" (a truthy "no" would switch capture on)."""
    if not (isinstance(graphs, bool) or (isinstance(graphs, str) and graphs in GRAPHS_CHOICES)):
        raise ValueError(f"graphs must be True, False, 'auto' or 'emulate', got {graphs!r}")


def graphs_wanted(device, use_kernels: bool, graphs) -> tuple[bool, str]:
    """(capture, reason) for the executor's ``graphs`` argument: True | False | "auto" (CUDA + kernels); any
    other value is refused (``check_graphs``) rather than read as truthy."""
    check_graphs(graphs)
    if graphs is False:
        return False, "off (graphs=False)"
    if torch.device(device).type != "cuda":
        return False, "not a CUDA device"
    if os.environ.get(GRAPHS_ENV) == "0":
        return False, f"{GRAPHS_ENV}=0"
    if graphs == "auto" and not use_kernels:
        return False, "twins sync with the host (page reservation): not capturable"
    return True, "on"


def token_caches(cache) -> list:
    """The layers of a ``ModelCache`` whose storage is a paged pool (GQA K/V, MLA latent)."""
    return [layer for layer in cache.layers if hasattr(layer, "tensors")]


def fit_pools(cache) -> None:
    """Grow every pool to the page table's page count now, outside any graph."""
    for layer in token_caches(cache):
        layer.fit_pool()


def _tensor_leaves(value, depth: int = 2) -> list[torch.Tensor]:
    """Tensors held by value directly or in dicts / lists / tuples (``depth`` levels)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth == 0:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensor_leaves(v, depth - 1)]
    return []


def _addresses(tensors) -> tuple:
    return tuple((t.data_ptr(), tuple(t.shape)) for t in tensors)


def storage_signature(cache, kept=()) -> tuple:
    """Addresses and shapes of every tensor a step reads or writes besides its static buffers and the
    weights: the cache's tensors (pools, page table, lengths, KDA state and its histories, whatever a
    layer holds) and those in ``kept`` (containers that kernel modules keep between launches, e.g.
    workspaces: see ``module_containers``). A graph captured under one signature is valid exactly
    while it is unchanged."""
    items: list = [id(cache), _addresses(_tensor_leaves(vars(cache.pages))), _addresses([cache.lengths])]
    for layer in cache.layers:
        items.append(_addresses(t for v in vars(layer).values() for t in _tensor_leaves(v)))
    for container in kept:
        items.append(_addresses(_tensor_leaves(container)))
    return tuple(items)


def module_containers(modules) -> list[tuple[object, str]]:
    """(module, name) of the module-level dicts and lists of ``modules``: where a kernel module keeps
    tensors between launches (a workspace it grows would leave a captured graph pointing at freed
    memory, so their addresses are part of the storage signature)."""
    return [
        (m, name)
        for m in modules
        for name, v in vars(m).items()
        if isinstance(v, (dict, list)) and not name.startswith("__")
    ]


class CapturedStep:
    """One decode step, captured once and replayed.

    On CUDA ``capture(fn)`` records ``fn``'s launches into a ``torch.cuda.CUDAGraph`` (without running
    them) in the memory pool ``pool`` (shared by an executor's graphs: all their outputs live in static
    buffers, so temporaries may share memory); ``replay()`` launches the graph. With ``emulate=True``
    (CPU tests of the executor's capture / re-capture logic) replay calls ``fn`` again.
    """

    def __init__(self, pool=None, emulate: bool = False):
        self.pool = pool
        self.emulate = emulate
        self.signature: tuple | None = None
        self.graph = None
        self._fn = None
        self.captures = 0

    @property
    def ready(self) -> bool:
        return self.signature is not None

    def capture(self, fn, signature: tuple) -> None:
        self.release()
        if self.emulate:
            self._fn = fn
        else:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                fn()
            self.graph = graph
        self.signature = signature
        self.captures += 1

    def replay(self) -> None:
        if self.emulate:
            self._fn()
        else:
            self.graph.replay()

    def release(self) -> None:
        self.graph = None
        self._fn = None
        self.signature = None


def new_pool(device):
    """A memory-pool handle for graphs on ``device`` (None off CUDA)."""
    return torch.cuda.graph_pool_handle() if torch.device(device).type == "cuda" else None
