"""``tile_step`` declares a READ of the step's ``start`` positions on every tile of an op whose launch takes
them (RoPE, cache appends, attention, KDA windows and state), so ``advance`` (which moves ``start`` on) is
ordered after all of them, and on no other op's tiles."""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel.tasks import Access
from tests.megakernel.kernel_steps import kernel_step

READS_START = {"gqa_qkv_rope", "gqa_attn", "mla_q_up", "mla_attn", "kda_in_proj", "kda_core"}


@pytest.mark.parametrize("name", ["llama", "kimi_linear"])
def test_tiles_of_ops_that_read_start_declare_it(name):
    s = kernel_step(name, B=2, T=1).schedule
    start = s.buffer_index("start")
    seen = set()
    for t in s.tasks:
        kind = s.ops[t.op].kind
        boxes = [r for r in t.regions if r.buffer == start]
        if kind == "advance":
            assert {r.access for r in boxes} == {Access.READ, Access.WRITE}
        elif kind in READS_START:
            seen.add(kind)
            assert [(r.r0, r.r1, r.access) for r in boxes] == [(0, 2, Access.READ)], s.task_name(s.tasks.index(t))
        else:
            assert not boxes, s.task_name(s.tasks.index(t))
    assert seen == READS_START & {s.ops[t.op].kind for t in s.tasks} and seen
