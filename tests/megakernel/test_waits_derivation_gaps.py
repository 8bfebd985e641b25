"""The waits ``tiling.waits.assemble`` derives, checked against hand-worked dependencies of tiny schedules.

The validator proves a derived schedule safe, but not that its waits are the fewest the docstring promises
(each extra wait is a counter poll on every task of every step) nor that a consumer waits only for the tiles
that produce what it reads. Every expected wait below is worked out by hand from the regions: which earlier
accesses conflict (read after write / accumulate, write after anything, accumulate after write / read) and
which of those are already implied by another wait.
"""

from __future__ import annotations

import pytest

from nonstop.runtime.megakernel import validate
from nonstop.runtime.megakernel.tasks import (
    Access,
    BufferInfo,
    OpTiles,
    Region,
    ScheduleError,
    StageSpec,
    TileSpec,
)
from nonstop.runtime.megakernel.tiling.waits import assemble

R, W, A = Access.READ, Access.WRITE, Access.ACCUMULATE


def _bufs(*names: str) -> list[BufferInfo]:
    return [BufferInfo(n, 1, 4) for n in names]


def _reg(b: int, access: Access, c0: int = 0, c1: int = 4) -> Region:
    return Region(b, 0, 1, c0, c1, access)


def _op(name: str, *tiles, kind: str | None = None, stage: str = "main") -> OpTiles:
    return OpTiles(name, kind or name, None, [StageSpec(stage, [TileSpec(i, tuple(r)) for i, r in enumerate(tiles)])])


def _waits(s, task: int) -> set[tuple[str, int, int]]:
    """(counter name, base, per_step) of each wait of task ``task``."""
    return {(s.counters[w.counter].name, w.base, w.per_step) for w in s.tasks[task].waits}


def test_a_chain_waits_only_on_its_direct_producer():
    """x -> op1 -> y -> op2 -> z -> op3; each op also reads x. op3 needs op0 (x) and op2 (z), but op2's
    tasks already follow op1 and (through it) op0, so op3's only wait is on op2. Catches dropping the
    transitive-reduction step or the ancestors' own ancestors (extra waits on every step)."""
    x, y, z, u = range(4)
    ops = [
        _op("op0", [_reg(x, W)]),
        _op("op1", [_reg(x, R), _reg(y, W)]),
        _op("op2", [_reg(x, R), _reg(y, R), _reg(z, W)]),
        _op("op3", [_reg(x, R), _reg(z, R), _reg(u, W)]),
    ]
    s = assemble(_bufs("x", "y", "z", "u"), ops, persistent=False)
    validate(s)
    assert [_waits(s, t) for t in range(4)] == [
        set(),
        {("op0/main", 1, 1)},
        {("op1/main", 1, 1)},
        {("op2/main", 1, 1)},
    ]


def test_a_wait_counts_every_tile_of_the_producer_and_no_more():
    """op0 writes x in 3 column tiles, op1 reads all of x: one wait for all 3 increments of op0's counter
    (target e*3 + 3). Catches a too-low target (a reader released after only some producer tiles)."""
    x, y = range(2)
    ops = [_op("op0", [_reg(x, W, 0, 1)], [_reg(x, W, 1, 3)], [_reg(x, W, 3, 4)]), _op("op1", [_reg(x, R), _reg(y, W)])]
    s = assemble(_bufs("x", "y"), ops, persistent=False)
    assert s.counters[s.tasks[0].counter].per_step == 3
    assert _waits(s, 3) == {("op0/main", 3, 3)}
    assert [w.target(2) for w in s.tasks[3].waits] == [2 * 3 + 3]


def test_split_counters_separate_accumulating_tiles_by_the_buffer_they_accumulate_into():
    """A zero stage writes x and z; an add stage accumulates twice into x and once into z; op1 reads x.
    With split counters op1 waits on the two x-accumulating tiles only, not on the z tile (and not on the
    zeroing, which those tiles already follow). Catches grouping tiles by written buffers while ignoring
    the ones they accumulate into."""
    x, z, y = range(3)
    front = OpTiles(
        "op0",
        "split",
        None,
        [
            StageSpec("zero", [TileSpec(0, (_reg(x, W),)), TileSpec(1, (_reg(z, W),))]),
            StageSpec(
                "add",
                [TileSpec(0, (_reg(x, A),)), TileSpec(1, (_reg(x, A),)), TileSpec(2, (_reg(z, A),))],
            ),
        ],
    )
    s = assemble(_bufs("x", "z", "y"), [front, _op("op1", [_reg(x, R), _reg(y, W)])], False, split_counters=True)
    validate(s)
    names = {c.name: c.per_step for c in s.counters}
    assert names == {"op0/zero:x": 1, "op0/zero:z": 1, "op0/add:x": 2, "op0/add:z": 1, "op1/main:y": 1}, names
    assert _waits(s, len(s.tasks) - 1) == {("op0/add:x", 2, 2)}
    # each accumulating tile waits on the zeroing of its own buffer only
    assert [_waits(s, t) for t in (2, 3, 4)] == [{("op0/zero:x", 1, 1)}] * 2 + [{("op0/zero:z", 1, 1)}]


def test_persistent_steps_wait_on_the_previous_step_only_where_not_implied():
    """op0 reads y, writes x; op1 reads x, writes y (a loop across steps). In step e+1, op0 must follow
    op1 of step e (its write of y and its read of x), which also follows op0 of step e: one previous-step
    wait (target e*1 + 0). op1 of step e+1 waits on op0 of step e+1, which already follows all of step e:
    no previous-step wait. Catches dropping the previous-step ancestor sets (redundant waits) and
    previous-step waits keyed to the wrong step."""
    x, y = range(2)
    ops = [_op("op0", [_reg(y, R), _reg(x, W)]), _op("op1", [_reg(x, R), _reg(y, W)])]
    s = assemble(_bufs("x", "y"), ops, persistent=True)
    validate(s)
    assert _waits(s, 0) == {("op1/main", 0, 1)}
    assert _waits(s, 1) == {("op0/main", 1, 1)}


def test_a_write_after_read_in_the_next_step_waits_on_the_reader():
    """op0 writes x, op1 reads x. Step e+1's op0 overwrites x: it must wait for step e's op1 (the reader),
    which implies step e's op0 too, so one previous-step wait on op1 and none on op0 itself."""
    x, y = range(2)
    ops = [_op("op0", [_reg(x, W)]), _op("op1", [_reg(x, R), _reg(y, W)])]
    s = assemble(_bufs("x", "y"), ops, persistent=True)
    validate(s)
    assert _waits(s, 0) == {("op1/main", 0, 1)}
    assert _waits(s, 1) == {("op0/main", 1, 1)}


def test_previous_step_ancestors_of_every_tile_of_a_counter_count():
    """op1's tile 0 writes p, tile 1 writes q; opZ reads both and overwrites x1 and x2, which opP (reader of
    p) and opQ (reader of q) write later in the queue. In step e+1, tile 0 of op1 waits for opP of step e and
    tile 1 for opQ: opZ, which waits on all of op1, already follows both, so it needs no previous-step wait.
    Catches keeping only the last tile's previous-step ancestors (an extra wait on opP every step)."""
    p, q, s_, x1, x2 = range(5)
    ops = [
        _op("op1", [_reg(p, W)], [_reg(q, W)]),
        _op("opZ", [_reg(p, R), _reg(q, R), _reg(s_, W), _reg(x1, W), _reg(x2, W)]),
        _op("opP", [_reg(p, R), _reg(x1, W)]),
        _op("opQ", [_reg(q, R), _reg(x2, W)]),
    ]
    s = assemble(_bufs("p", "q", "s", "x1", "x2"), ops, persistent=True)
    validate(s)
    assert _waits(s, 0) == {("opP/main", 0, 1)} and _waits(s, 1) == {("opQ/main", 0, 1)}
    assert _waits(s, 2) == {("op1/main", 2, 2)}


def test_tiles_of_one_stage_that_conflict_are_refused_by_name():
    """Two tiles of one stage both write column 1 of x: tiles of a stage run unordered, so assemble must
    refuse the op with a message naming the tile, not derive a wait of the stage on itself."""
    ops = [_op("op0", [_reg(0, W, 0, 2)], [_reg(0, W, 1, 3)])]
    with pytest.raises(ScheduleError, match=r"tiles of one stage conflict: op0/main\[1\]"):
        assemble(_bufs("x"), ops, persistent=False)


def test_conflicting_tiles_of_one_stage_are_refused_with_split_counters_too():
    """With split counters, tile 0 writes x and tile 1 reads x and writes y: they get different counters
    but still belong to one stage, whose tiles run unordered (one grid on the superop backend). Catches
    checking only the tile's own counter for siblings (a wait between tiles of one stage)."""
    ops = [_op("op0", [_reg(0, W)], [_reg(0, R), _reg(1, W)])]
    with pytest.raises(ScheduleError, match=r"tiles of one stage conflict: op0/main\[1\]"):
        assemble(_bufs("x", "y"), ops, persistent=False, split_counters=True)


def test_opcodes_follow_the_given_table_or_first_appearance():
    """Task.opcode is the index of (kind, stage) in the given dispatch table; without one, the pairs in order
    of first appearance, stages without tiles taking no opcode."""
    x, y = range(2)
    empty = OpTiles("e", "empty", None, [StageSpec("main", [])])
    ops = [empty, _op("a", [_reg(x, W)], kind="ka"), _op("b", [_reg(x, R), _reg(y, W)], kind="kb")]
    s = assemble(_bufs("x", "y"), ops, persistent=False)
    assert [t.opcode for t in s.tasks] == [0, 1] and s.opcodes == [("ka", "main"), ("kb", "main")]
    s = assemble(_bufs("x", "y"), ops, False, opcodes=[("kb", "main"), ("ka", "main")])
    assert [t.opcode for t in s.tasks] == [1, 0]
    with pytest.raises(ScheduleError, match="no opcode for kind 'kb'"):
        assemble(_bufs("x", "y"), ops, False, opcodes=[("ka", "main")])
