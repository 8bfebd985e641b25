"""Tensor and expert parallelism on torch.distributed (gloo on CPU, NCCL on CUDA).

* ``layout.py``     ``Layout`` (--tp / --ep / world): attention groups, expert groups, a rank's place
* ``placement.py``  ``ExpertPlacement``: logical -> physical experts, redundant replicas, rebalancing
* ``shard.py``      a rank's config and its part of every parameter
* ``load.py``       sharded loading: only a rank's bytes are read from the safetensors files
* ``model.py``      a rank's model (its weights), shape-only twins for costs
* ``program.py``    a rank's Program with collective super-ops; ``rank_step``: costs from shapes alone
* ``comm.py``       process groups, ``init`` (env:// or given rank/world), guarded collectives
* ``ops.py``        the collective super-ops' implementations (plain torch + torch.distributed)
* ``moe.py``        MoE dispatch / combine over ``all_to_all_single``, chunked overlap
* ``exchange.py``   the static (fixed-capacity, capturable) exchange and the choice of exchange mode
* ``launch.py``     ``spawn``: start the ranks of one host (torch.multiprocessing); torchrun works too
* ``parent_watch.py`` ``die_with_parent``: a spawned rank ends when its launcher dies (prctl, or a watchdog)
The layout, placement, sharding and cost pieces need no process group (a planner imports them).
"""

from nonstop.dist.layout import Layout, LayoutError, split_range
from nonstop.dist.placement import ExpertPlacement

__all__ = ["ExpertPlacement", "Layout", "LayoutError", "spawn", "split_range"]


def __getattr__(name):
    if name == "spawn":
        from nonstop.dist.launch import spawn

        return spawn
    raise AttributeError(name)
