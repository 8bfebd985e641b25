"""``shapes_program`` shares one lowered rank model between layouts whose rank holds the same parts; what it
returns must be what building that rank's Program afresh gives, whatever was asked before it (``distribute``
edits the ops it is given: a shared op edited for one layout would leak into the next)."""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig
from nonstop.dist import Layout
from nonstop.dist.model import build_rank_model, meta_rank_state
from nonstop.dist.program import distribute, shapes_program
from nonstop.program.lower import lower

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")
LAYOUTS = [(2, 1, 2), (2, 1, 4), (1, 2, 2), (1, 2, 4), (2, 2, 4), (2, 4, 4), (4, 2, 4)]


def _fresh(layout: Layout, rank: int, exchange: str):
    model = build_rank_model(NANO, layout, rank, meta_rank_state(NANO, layout, rank, torch.float32))
    return distribute(lower(model), NANO, layout, rank, 1, exchange=exchange)


def _summary(program) -> list:
    return [
        (
            op.name,
            op.kind,
            op.reads,
            op.writes,
            sorted((k, tuple(w.shape), w.dtype) for k, w in op.weights.items()),
            repr(sorted(op.attrs.items())),
            op.cost(3, 17),
            op.tiles(3, 17),
        )
        for op in program.ops
    ]


def test_a_shared_rank_model_gives_the_program_built_afresh_in_any_order():
    """Every Program is kept until all are made: one layout's must not change when another is asked for."""
    made = {}
    for round_ in range(2):  # the second round reads every rank model from the cache
        for tp, ep, world in LAYOUTS if round_ == 0 else LAYOUTS[::-1]:
            layout = Layout.make(tp, ep, world)
            for rank in range(world):
                for exchange in ("dynamic", "static"):
                    program = shapes_program(NANO, layout, rank, torch.float32, exchange=exchange)
                    made[(round_, tp, ep, world, rank, exchange)] = (layout, program)
    for (round_, tp, ep, world, rank, exchange), (layout, program) in made.items():
        assert _summary(program) == _summary(_fresh(layout, rank, exchange)), (round_, tp, ep, world, rank, exchange)
