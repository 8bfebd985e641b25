"""``ExpertPlacement``'s documented rules, checked against plain loops: the replica a remote pair goes to
(``(source + pair index) mod replicas``, spreading one rank's pairs and different ranks' pairs over the
replicas) and the rebalancer's choice between experts of equal load per replica; a rank's attention
group under a layout whose tp and ep differ."""

from __future__ import annotations

import torch

from nonstop.dist import ExpertPlacement, Layout


def test_remote_pairs_go_to_replica_source_plus_index_mod_count():
    """Catches the replica index computed without the source rank (every rank would send its first pair of
    a hot expert to the same replica). Plain-loop reference from the module docstring."""
    p = ExpertPlacement(4, ((0, 1), (0, 2), (0, 3), (1, 2, 3)))  # expert 0 on ranks 0, 1, 2; not on 3
    ids = torch.tensor([0, 0, 0, 1, 2, 0, 3, 0])
    for source in range(4):
        dest, slot = p.route(ids, source)
        for i, e in enumerate(ids.tolist()):
            if e in p.slots[source]:
                want = (source, p.slots[source].index(e))
            else:
                replicas = p.replicas(e)
                want = replicas[(source + i) % len(replicas)]
            assert (int(dest[i]), int(slot[i])) == want, (source, i)


def test_equal_load_per_replica_gives_the_extra_replica_to_the_lowest_id():
    """Catches the tie rule reversed: with equal loads the one redundant replica goes to expert 0 (every
    rank computes the same placement; the lowest id wins a tie)."""
    bal = ExpertPlacement.rebalanced([5, 5], 2, redundant=1)
    assert [len(bal.replicas(e)) for e in range(2)] == [2, 1]


def test_a_ranks_attention_group_is_its_block_of_tp_consecutive_ranks():
    """Catches the attention group computed with the expert-group size: --tp 2 --ep 4 puts ranks 2 and 3
    in attention group 1 = (2, 3), inside the single expert group (0..3)."""
    lay = Layout.make(2, 4)
    assert [lay.tp_group(r) for r in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [lay.ep_group(r) for r in range(4)] == [(0, 1, 2, 3)] * 4


def test_replicas_are_placed_by_load_per_replica():
    """Catches replicas weighed by their expert's whole load instead of load / copies. Loads 9, 7, 8 on 3
    ranks with 1 redundant replica: expert 0 (heaviest) gets 2 copies of 4.5; 2 slots per rank. Heaviest
    first: 8 (e2) -> r0, 7 (e1) -> r1, 4.5 (e0) -> r2, 4.5 (e0) -> r1 (7 < 8; r2 already holds e0)."""
    assert ExpertPlacement.rebalanced([9, 7, 8], 3, 1).slots == ((2,), (0, 1), (0,))


def test_equal_shares_are_placed_in_increasing_expert_id():
    """Catches the tie order between equal shares reversed. Loads 1, 7, 0, 6, 6 on 3 ranks (2 slots each):
    7 (e1) -> r0, 6 (e3) -> r1, 6 (e4) -> r2, 1 (e0) -> r1 (6 = 6, lower rank), 0 (e2) -> r2."""
    assert ExpertPlacement.rebalanced([1, 7, 0, 6, 6], 3, 0).slots == ((1,), (0, 3), (2, 4))
