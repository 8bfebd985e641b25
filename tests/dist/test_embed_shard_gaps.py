"""Gaps a second mutation audit of ``dist/ops.py`` found: ``embed_shard``, the embedding rows of a rank's
vocabulary part (ids outside it give zero rows, which the tp all-reduce after adds to the other ranks'
parts). Expected rows are picked by hand from the part: rank t holds ids [t·rows, (t+1)·rows)."""

from __future__ import annotations

import types

import pytest
import torch

from nonstop.dist.ops import embed_shard


@pytest.mark.parametrize("rank", [0, 1])
def test_a_ranks_embedding_rows_are_its_parts_ids_and_zeros_elsewhere(rank):
    """V = 11 over tp 2: 6 rows per rank (rank 1's last a zero pad row). Ids 0, 5, 6, 10 and 3: each row
    comes from the rank whose part holds the id, and is zero on the other. Catches the part's start added
    instead of subtracted, the first id of the part (local 0) treated as outside it, and the id one past the
    part (local = rows) clamped onto the part's last row instead of zero."""
    rows = 6
    full = torch.arange(12 * 4, dtype=torch.float32).view(12, 4) + 1  # no zero row among the real ones
    full[11] = 0  # the pad row
    part = full[rank * rows : (rank + 1) * rows].clone()
    ids = torch.tensor([0, 5, 6, 10, 3])
    out = torch.full((5, 4), float("nan"))
    op = types.SimpleNamespace(weights={"embed": part}, attrs={"vocab_start": rank * rows}, writes=("h",))
    embed_shard(op, types.SimpleNamespace(buf={"ids": ids, "h": out}))
    for i, tok in enumerate(ids.tolist()):
        mine = rank * rows <= tok < (rank + 1) * rows
        want = full[tok] if mine else torch.zeros(4)
        assert torch.equal(out[i], want), (rank, tok, out[i])


def test_the_gathered_logits_drop_the_vocabulary_pad_columns():
    """V = 11 over tp 2: each rank's logits part has 6 columns, rank 1's last one a pad. The leader's
    logits are the 11 real columns in rank order. Catches the pad column kept (12 columns copied into the
    11-wide logits buffer)."""
    from nonstop.dist.ops import vocab_gather

    parts = [torch.arange(12, dtype=torch.float32).view(2, 6), torch.arange(12, 24, dtype=torch.float32).view(2, 6)]
    comm = types.SimpleNamespace(gather_to_leader=lambda t: parts)
    out = torch.full((2, 11), float("nan"))
    op = types.SimpleNamespace(reads=("logits_shard",), writes=("logits",), attrs={"vocab": 11})
    vocab_gather(op, types.SimpleNamespace(comm=comm, buf={"logits_shard": parts[0], "logits": out}))
    assert torch.equal(out, torch.cat(parts, dim=1)[:, :11])


def test_a_rank_model_with_some_weights_missing_is_refused():
    """A rank's state that holds real tensors but misses a parameter (a checkpoint part not loaded) must be
    refused naming it, not left as a meta tensor that fails later. Catches the check made only when every
    given tensor is real (one meta tensor among them then let every missing parameter through)."""
    from nonstop.config import ModelConfig
    from nonstop.dist.model import model_holding
    from tests.tiny_configs import LLAMA

    cfg = ModelConfig.from_hf_dict(LLAMA)
    state = {"embed_tokens.weight": torch.zeros(131, 40), "norm.weight": torch.empty(40, device="meta")}
    with pytest.raises(RuntimeError, match="rank 0: parameter\\(s\\) .* were not loaded"):
        model_holding(cfg, 0, state)


class _Experts:
    """Two local experts of width 3, intermediate 2, as ``RoutedExperts.weight(name, slot, dtype)`` gives."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.w = {n: torch.randn(2, *s, generator=g) for n, s in (("w1", (2, 3)), ("w3", (2, 3)), ("w2", (3, 2)))}

    def weight(self, name, slot, dtype):
        return self.w[name][slot].to(dtype)


def test_the_expert_twin_runs_slot_0_and_zeroes_only_empty_rows():
    """Rows of slots 0, -1, 1 (a static exchange's empty row between): rows 0 and 2 are experts 0 and 1 on
    their inputs, W2 (silu(W1 z) * (W3 z)) by hand; the empty row is zero. Catches local slot 0 taken for an
    empty row (every pair sent to a rank's first expert dropped)."""
    from nonstop.dist.ops import experts_twin

    ex = _Experts()
    z = torch.tensor([[1.0, -2.0, 0.5], [3.0, 3.0, 3.0], [-1.0, 0.25, 2.0]])
    op = types.SimpleNamespace(attrs={"experts": ex, "act": "silu", "beta": 1.0, "linear_beta": 1.0})
    out = experts_twin(op, z, torch.tensor([0, -1, 1]))
    for row, e in ((0, 0), (2, 1)):
        w1, w3, w2 = ex.w["w1"][e], ex.w["w3"][e], ex.w["w2"][e]
        want = w2 @ (torch.nn.functional.silu(w1 @ z[row]) * (w3 @ z[row]))
        assert torch.allclose(out[row], want, atol=1e-5), (row, out[row], want)
    assert torch.equal(out[1], torch.zeros(3))
