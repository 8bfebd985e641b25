"""The expert-parallel token exchange of ``moe_ep`` across ranks, in one process: every rank of a layout
runs ``moe_ep`` in its own thread over an in-memory ``all_to_all_single`` stand-in (rows of ``inp`` cut by
``in_splits`` go to the group's ranks in order; a receiver's ``out_splits`` must match what each peer sent;
an async handle delivers only on ``wait()``). The summed rank outputs of every attention group must equal
a plain-loop reference Σ_j p_j f_{e_j}(x) (expert e: f_e(z) = (e + 1)·z + e), for both exchange modes, with
and without overlap, for uneven placements, redundant replicas, empty ranks, chunks and empty shares; the
static and dynamic modes must be bit-identical (the documented promise). No process group is needed, so
the index math of the dispatch / combine is checked without gloo."""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.dist import ExpertPlacement, Layout
from nonstop.dist.layout import split_range
from nonstop.dist.moe import moe_ep

NANO = ModelConfig.from_file("nonstop/assets/k3-nano")


class _Fabric:
    """The mailboxes of one expert group: mail[(seq)][src] = the pieces src sent, one per group rank."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.mail: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.cond = threading.Condition()


class _Work:
    def __init__(self, deliver):
        self.deliver = deliver
        self.done = False

    def wait(self):
        assert not self.done, "a work handle waited twice"
        self.done = True
        self.deliver()


class _FakeComm:
    """``Comm.all_to_all`` of one rank over a ``_Fabric`` (calls are matched by their order on each rank)."""

    def __init__(self, fabric: _Fabric, ep_rank: int):
        self.fabric, self.me, self.seq = fabric, ep_rank, 0
        self.pending: list[_Work] = []

    def all_to_all(self, out, inp, out_splits, in_splits, async_op=False, what="", kind=""):
        f, me, seq = self.fabric, self.me, self.seq
        self.seq += 1
        assert len(in_splits) == len(out_splits) == f.ranks
        assert sum(in_splits) == inp.shape[0] and sum(out_splits) == out.shape[0], what
        pieces = list(inp.clone().split(list(in_splits)))
        with f.cond:
            f.mail.setdefault(seq, {})[me] = pieces
            f.cond.notify_all()

        def deliver():
            with f.cond:
                ok = f.cond.wait_for(lambda: len(f.mail[seq]) == f.ranks, timeout=20)
                assert ok, f"{what}: a peer never joined call {seq}"
                got = [f.mail[seq][src][me] for src in range(f.ranks)]
            for src, piece in enumerate(got):
                assert piece.shape[0] == out_splits[src], (
                    f"{what}: rank {src} sent {piece.shape[0]} rows, expected {out_splits[src]}"
                )
            out.copy_(torch.cat(got) if got else out)

        if not async_op:
            deliver()
            return None
        work = _Work(deliver)
        self.pending.append(work)
        return work


def _expert(z: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """f_e(z) = (e + 1)·z + e for logical expert ids ``experts`` [N] (any float dtype)."""
    e = experts.to(z.dtype)[:, None]
    return (e + 1) * z + e


def _local_experts(placement: ExpertPlacement, ep_rank: int):
    held = torch.tensor(placement.slots[ep_rank] or (0,), dtype=torch.long)

    def run(op, z, slots):
        assert z.shape[0] == slots.shape[0]
        if slots.numel():
            assert int(slots.max()) < len(placement.slots[ep_rank]), "a pair reached a rank without its slot"
        filled = slots >= 0
        assert not (filled[1:] & ~filled[:-1]).any(), "empty static rows must come after the filled ones"
        y = torch.zeros_like(z)
        y[filled] = _expert(z[filled], held[slots[filled]])
        return y

    return run


def _run(
    layout: Layout, placement: ExpertPlacement, moe, group_rows, chunks: int, overlap: bool, exchange: str, seed=0
):
    """Every rank's moe_out, summed per attention group; the inputs; every rank's load counts."""
    gen = torch.Generator().manual_seed(seed)
    K = 5
    xs = [torch.randn(n, K, generator=gen) for n in group_rows]
    logits = [torch.randn(n, moe.num_experts, generator=gen) for n in group_rows]
    bias = torch.randn(moe.num_experts, generator=gen) * 0.1
    fabrics = {g: _Fabric(layout.ep) for g in range(layout.expert_groups)}
    outs, ops, errors = {}, {}, []

    def rank_main(rank: int):
        try:
            attrs = dict(
                moe=moe,
                placement=placement,
                ep_ranks=layout.ep,
                ep_rank=layout.ep_rank(rank),
                tp_ranks=layout.tp,
                tp_rank=layout.tp_rank(rank),
                rank=rank,
                world=layout.world,
                chunks=chunks,
                overlap=overlap,
                top_k=moe.top_k,
                max_local=placement.max_local,
            )
            op = SimpleNamespace(kind="moe_ep", attrs=attrs, weights={"bias": bias}, writes=["moe_out"])
            g = layout.dp_index(rank)
            n = group_rows[g]
            env = SimpleNamespace(
                buf={"moe_in": xs[g].clone(), "moe_logits": logits[g].clone(), "moe_out": torch.zeros(n, K)},
                comm=_FakeComm(fabrics[rank // layout.ep], layout.ep_rank(rank)),
                exchange=exchange,
                group_rows=tuple(group_rows),
            )
            moe_ep(op, env, _local_experts(placement, layout.ep_rank(rank)))
            assert all(w.done for w in env.comm.pending), "an async all-to-all was never waited for"
            outs[rank], ops[rank] = env.buf["moe_out"], op
        except BaseException as exc:  # noqa: BLE001 - reported in the main thread
            errors.append((rank, exc))

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(layout.world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung in the exchange"
    if errors:
        raise errors[0][1]
    summed = [sum(outs[r] for r in layout.tp_groups()[g]) for g in range(layout.dp)]
    return summed, xs, logits, bias, ops


def _reference(x, logits, bias, moe) -> torch.Tensor:
    """Plain loops: for each row, Σ_j p_j f_{e_j}(x) with the routing rule of model/moe.py."""
    from nonstop.model.moe import select_experts

    weights, ids = select_experts(logits, bias, moe)
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        acc = torch.zeros(x.shape[1], dtype=torch.float64)
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            acc += float(weights[i, j]) * ((e + 1) * x[i].double() + e)
        out[i] = acc.to(x.dtype)
    return out


MOE6 = dataclasses.replace(NANO.moe, num_experts=6, top_k=3)
CASES = [
    # (tp, ep, world, placement, group rows, chunks)
    (1, 2, 2, ExpertPlacement.even(6, 2), (7, 4), 1),
    (1, 3, 3, ExpertPlacement(6, ((0, 1, 2, 3), (4,), (5,))), (5, 3, 6), 2),  # uneven counts
    (1, 3, 3, ExpertPlacement(6, ((0, 1, 2), (0, 3, 4), (5, 1, 4))), (6, 1, 4), 3),  # redundant replicas
    (1, 3, 3, ExpertPlacement(6, ((5, 4, 3, 2, 1, 0), (), (0, 2))), (4, 5, 2), 2),  # an empty rank, local order
    (2, 2, 2, ExpertPlacement(6, ((3, 4, 5, 0), (0, 1, 2))), (7,), 2),  # tp 2: contiguous row shares
    (2, 4, 4, ExpertPlacement.even(6, 4), (5, 3), 3),  # 2 attention groups, uneven even-placement
    (1, 2, 4, ExpertPlacement(6, ((0, 2, 4), (1, 3, 5))), (3, 0, 2, 1), 2),  # 2 expert groups, a rank with 0 rows
    (1, 2, 2, ExpertPlacement.even(6, 2), (1, 0), 3),  # one buffer row per chunk to receive
]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("exchange", ["dynamic", "static"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_pair_meets_its_expert_and_comes_back_to_its_row(case, exchange, overlap):
    """Catches dispatch / combine index errors: a pair sent to the wrong rank or slot, outputs returned to
    the wrong row, wrong split sizes or buffer offsets, a chunk skipped or computed twice, a row share cut
    wrongly across tp ranks, an async exchange not waited for, replicas routed to ranks without the expert."""
    tp, ep, world, placement, rows, chunks = CASES[case]
    layout = Layout.make(tp, ep, world=world)
    summed, xs, logits, bias, ops = _run(layout, placement, MOE6, rows, chunks, overlap, exchange, seed=case)
    for g in range(layout.dp):
        torch.testing.assert_close(summed[g], _reference(xs[g], logits[g], bias, MOE6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_static_and_dynamic_modes_are_bit_identical(case):
    """Catches a static exchange that reorders the pairs an expert sees, or sums them in another order
    (the module docstrings promise bit-identical outputs)."""
    tp, ep, world, placement, rows, chunks = CASES[case]
    layout = Layout.make(tp, ep, world=world)
    a = _run(layout, placement, MOE6, rows, chunks, True, "static", seed=10 + case)[0]
    b = _run(layout, placement, MOE6, rows, chunks, False, "dynamic", seed=10 + case)[0]
    for g in range(layout.dp):
        assert torch.equal(a[g], b[g])


def test_load_counts_the_pairs_each_rank_routes():
    """Catches ``op.attrs['load']`` counting another rank's share, or rows outside the rank's share: summed
    over the ranks of an attention group it is the bincount of the group's routed expert ids."""
    from nonstop.model.moe import select_experts

    tp, ep, world, placement, rows, chunks = CASES[5]
    layout = Layout.make(tp, ep, world=world)
    _, xs, logits, bias, ops = _run(layout, placement, MOE6, rows, chunks, False, "dynamic", seed=3)
    for g, group in enumerate(layout.tp_groups()):
        ids = select_experts(logits[g], bias, MOE6)[1]
        want = torch.bincount(ids.reshape(-1), minlength=6)
        assert sum(ops[r].attrs["load"] for r in group).tolist() == want.tolist()
        for r in group:
            lo, hi = split_range(rows[g], tp, layout.tp_rank(r))
            mine = torch.bincount(ids[lo:hi].reshape(-1), minlength=6)
            assert ops[r].attrs["load"].tolist() == mine.tolist()


def test_static_plans_are_kept_per_step_shape():
    """Catches a plan cache keyed without the step's rows: a later step of another shape would reuse the
    first shape's split sizes (its buffers too small, or peers disagreeing on the sizes). Rank 0 of 2, one
    expert each, top-1, one chunk: it sends its peer min(n, n) = n rows per step, where n is its rows."""
    from nonstop.dist.exchange import static_plan

    op = SimpleNamespace(kind="moe_ep", attrs=dict(placement=ExpertPlacement.even(2, 2), ep_ranks=2, ep_rank=0))
    op.attrs.update(tp_ranks=1, tp_rank=0, rank=0, world=2, top_k=1, chunks=1, max_local=1)
    for rows in ((3, 1), (5, 2), (3, 1)):
        plan = static_plan(op, rows, "cpu")
        assert (plan.send, plan.recv) == ([rows[0], rows[0]], [rows[0], rows[1]])
        assert plan.offsets.tolist() == [0, rows[0]]


def test_moe_ep_adds_to_what_moe_out_holds():
    """Catches ``moe_out[rows] = ...`` in place of the documented ``+=``: a rank adds its rows' routed output
    to the buffer (one rank, experts as in the other tests, moe_out starting at 1)."""
    moe = MOE6
    gen = torch.Generator().manual_seed(5)
    x, logits = torch.randn(4, 5, generator=gen), torch.randn(4, 6, generator=gen)
    bias = torch.zeros(6)
    placement = ExpertPlacement.even(6, 1)
    attrs = dict(moe=moe, placement=placement, ep_ranks=1, ep_rank=0, tp_ranks=1, tp_rank=0, rank=0, world=1)
    attrs.update(chunks=2, overlap=False, top_k=moe.top_k, max_local=placement.max_local)
    op = SimpleNamespace(kind="moe_ep", attrs=attrs, weights={"bias": bias}, writes=["moe_out"])
    env = SimpleNamespace(
        buf={"moe_in": x, "moe_logits": logits, "moe_out": torch.ones(4, 5)}, comm=None, exchange="dynamic"
    )
    moe_ep(op, env, _local_experts(placement, 0))
    torch.testing.assert_close(env.buf["moe_out"], 1 + _reference(x, logits, bias, moe), rtol=1e-5, atol=1e-5)


def _trace(chunks: int, overlap: bool) -> list[str]:
    from nonstop.dist.moe import run_chunks

    log: list[str] = []

    class Work:
        def __init__(self, name):
            self.name = name

        def wait(self):
            log.append(f"wait {self.name}")

    def dispatch(c):
        log.append(f"d{c}")
        return Work(f"d{c}")

    def compute(c):
        log.append(f"x{c}")
        return c

    def combine(c, y):
        assert y == c
        log.append(f"c{c}")
        return Work(f"c{c}")

    run_chunks(chunks, overlap, dispatch, compute, combine)
    return log


def test_chunk_pipeline_order_with_and_without_overlap():
    """Catches a pipeline that stops overlapping (waits every combine at once, or dispatches only the chunk
    it is about to compute) or that serialises wrongly: with overlap chunk c + 1's dispatch is issued before
    chunk c's experts run and every combine is waited for only at the end; without it each chunk's
    dispatch and combine complete before the next chunk starts."""
    assert _trace(3, True) == [
        "d0", "d1", "wait d0", "x0", "c0",
        "d2", "wait d1", "x1", "c1",
        "wait d2", "x2", "c2",
        "wait c0", "wait c1", "wait c2",
    ]  # fmt: skip
    assert _trace(2, False) == ["d0", "wait d0", "x0", "c0", "wait c0", "d1", "wait d1", "x1", "c1", "wait c1"]
    assert _trace(1, True) == ["d0", "wait d0", "x0", "c0", "wait c0"]


def test_static_send_order_is_chunk_destination_slot_then_arrival():
    """Catches a send order sorted by (chunk, destination) only, or not stably: the static exchange must
    hand each expert its pairs in the dynamic mode's order (module docstring: bit-identical outputs), i.e.
    sorted by (chunk, destination, local slot), ties in (row, j) order. Plain-loop reference."""
    from nonstop.dist.exchange import StaticPlan, buffer_rows

    gen = torch.Generator().manual_seed(7)
    E, L, C, P = 3, 4, 2, 40
    dest = torch.randint(0, E, (P,), generator=gen)
    slot = torch.randint(0, L, (P,), generator=gen)
    chunk = torch.arange(P) * C // P
    plan = StaticPlan([P] * E, [P] * E, torch.arange(E) * P)
    order, rows = buffer_rows(dest, slot, chunk, E, L, C, plan)
    want = sorted(range(P), key=lambda i: (int(chunk[i]), int(dest[i]), int(slot[i]), i))
    assert order.tolist() == want
    seen: dict[tuple[int, int], int] = {}
    for i, row in zip(order.tolist(), rows.tolist()):
        c, d = int(chunk[i]), int(dest[i])
        place = seen.get((c, d), 0)
        seen[(c, d)] = place + 1
        assert row == c * plan.send_rows + d * P + place
