"""The torchrun-style environment a rank joins with (RANK / WORLD_SIZE), checked before the rendezvous.

A RANK outside [0, WORLD_SIZE) (a hand-written launch script, a SLURM_PROCID against the wrong world)
can never meet its peers: the rank waited out the whole rendezvous (60 s at least, about 110 s measured
with c10d's connect retries), printed c10d's 40-line C++ stack dump, then blamed "the rendezvous with the
other ranks". These tests pin the promised one clear error, at once, naming the variable.
"""

from __future__ import annotations

import pytest

import nonstop.dist.comm as comm_mod
from nonstop.dist.layout import Layout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rank", ["2", "5", "-1"])
def test_init_refuses_a_rank_outside_the_world_before_joining(monkeypatch, rank):
    """Catches RANK >= WORLD_SIZE (or negative) let through to the rendezvous, where it can only wait out
    the rendezvous timeout (defect: ``comm.init`` checks WORLD_SIZE against the layout, never RANK)."""
    monkeypatch.setattr(comm_mod, "_join", lambda *a: pytest.fail("joined the rendezvous with an impossible RANK"))
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK"):
        comm_mod.init(Layout.make(2, 1), "cpu", 10.0, rendezvous=5.0)


@pytest.mark.timeout(30)
def test_init_names_a_rank_that_is_not_a_number(monkeypatch):
    """Catches RANK=abc reported as Python's bare "invalid literal for int() with base 10: 'abc'", which
    does not say which variable is wrong."""
    monkeypatch.setattr(comm_mod, "_join", lambda *a: pytest.fail("joined"))
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK"):
        comm_mod.init(Layout.make(2, 1), "cpu", 10.0, rendezvous=5.0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("rank", ["0", "1"])
def test_init_lets_a_rank_inside_the_world_join(monkeypatch, rank):
    """The check above must not refuse a valid rank: RANK 0 and 1 of WORLD_SIZE 2 go on to the rendezvous."""
    joined = []
    monkeypatch.setattr(comm_mod, "_join", lambda comm, world, *a: joined.append((comm.rank, world)))
    monkeypatch.setattr(comm_mod.dist.distributed_c10d, "_set_pg_timeout", lambda t, g: None)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    comm_mod.init(Layout.make(2, 1), "cpu", 10.0, rendezvous=5.0)
    assert joined == [(int(rank), 2)]


def test_a_rendezvous_that_fails_early_says_when(monkeypatch):
    """A rendezvous refused at once (a bad MASTER_ADDR, an address in use) said "failed within 60 s" as if it
    had waited the whole time; it says how long it took, and the time it was allowed."""

    def refused(*args):
        raise RuntimeError("[c10d] address already in use")

    monkeypatch.setattr(comm_mod, "_join", refused)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(comm_mod.RankFailure) as e:
        comm_mod.init(Layout.make(2, 1), "cpu", 10.0, rendezvous=60.0)
    said = str(e.value)
    assert "failed after 0.0 s (of the 60 s allowed) (address already in use)" in said, said


def test_a_local_world_size_that_is_not_a_number_is_named(monkeypatch):
    """``check_before_start`` read LOCAL_WORLD_SIZE with a bare int(): "invalid literal for int() with base
    10: 'two'", without the variable's name."""
    from nonstop.cli import build_parser
    from nonstop.commands.layout_args import check_before_start, layout_from_args

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    args = build_parser().parse_args(["generate", "--ep", "2", "--no-preflight", "hi"])
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two' is not a whole number"):
        check_before_start(args, layout_from_args(args))
