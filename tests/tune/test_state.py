"""Moving a state to the verification child: views and aliasing survive, every call gets fresh memory,
and a write just outside a storage shows in its guard band."""

from __future__ import annotations

import torch

from nonstop.tune.cases import CaseSpec, build_state, run_twin
from nonstop.tune.state import GUARD, pack, snapshot, unpack
from tests.tune.helpers import tiny_target


def _state():
    packed_w = torch.arange(24, dtype=torch.float32)
    roots = {"op": {"w": packed_w.view(4, 6), "w_head": packed_w[6:12], "n": 3}, "buf": {"x": torch.randn(2, 5)}}
    return roots


def test_pack_unpack_keeps_views_and_aliasing():
    roots = _state()
    packed = pack(roots)
    assert len(packed.storages) == 2  # the packed weight and x
    a = unpack(packed, "cpu", torch.Generator().manual_seed(0))
    b = unpack(packed, "cpu", torch.Generator().manual_seed(1))
    w, head = a.state["op"]["w"], a.state["op"]["w_head"]
    assert torch.equal(w, roots["op"]["w"]) and torch.equal(head, roots["op"]["w_head"])
    head[0] = -1.0
    assert w[1, 0] == -1.0  # still a view of the same storage
    assert a.state["op"]["w"].data_ptr() != b.state["op"]["w"].data_ptr()  # fresh memory per unpack
    assert all(a.guard_intact(i) for i in range(2))
    a.padded[1][GUARD - 1] ^= 0xFF  # one byte before x
    assert not a.guard_intact(1) and a.guard_intact(0)
    assert a.storage_of(a.state["buf"]["x"]) == (1, 0)
    assert a.storage_of(torch.zeros(1)) is None


def test_case_states_poison_what_the_op_writes_and_the_twin_fills_it():
    """gqa_qkv_rope writes q and appends k, v to the cache: those are NaN before the twin, finite after,
    and they are the only storages it changes."""
    spec = CaseSpec("hidden", tiny_target("gqa_qkv_rope").cfg, torch.float32, 2, 3, False, 0)
    state = build_state(spec, "gqa_qkv_rope", "cpu", 1, 2)
    layer = state.cache.layers[state.op.attrs["cache_layer"]]
    rows = layer.pages.rows(state.batch.slots, state.batch.positions).reshape(-1)
    assert state.buf["gqa_q"].isnan().all() and layer.tensors["k"][rows].isnan().all()
    packed = pack(state.roots())
    run_twin(state)
    after = snapshot(state.roots(), packed)
    changed = {
        p
        for p, i in packed.paths.items()
        if not torch.equal(packed.storages[packed.views[i].storage], after[packed.views[i].storage])
    }
    assert changed == {"buf.gqa_q", "cache.layers[0].tensors.k", "cache.layers[0].tensors.v"}
    assert state.buf["gqa_q"].isfinite().all() and layer.tensors["k"][rows].isfinite().all()


def test_swapped_weights_states_have_their_own_twin():
    """The verifier's mixed call: A's buffers and caches with B's weights, and the twin's answer for that."""
    from nonstop.tune.verify import call_plan, prepare

    t = tiny_target("linear_residual")
    spec = CaseSpec("tuned", t.cfg, t.dtype, 3, 1, False, 0)
    a, b = prepare(spec, "linear_residual", "cpu", 1, 2), prepare(spec, "linear_residual", "cpu", 3, 4)
    states, calls = call_plan([a, b], [spec], "linear_residual", "cpu")
    assert [c.label.split("call on ")[1] for c in calls] == ["A", "A again", "A's inputs with B's weights", "B",
                                                             "B's inputs with A's weights"]  # fmt: skip
    mixed = states[calls[2].state]

    def storage(p, path):
        return p.packed.views[p.packed.paths[path]].storage

    w, x = storage(a, "op.weights.w"), storage(a, "buf.attn_out")
    assert torch.equal(mixed.packed.storages[w], b.packed.storages[storage(b, "op.weights.w")])
    assert torch.equal(mixed.packed.storages[x], a.packed.storages[x])
    out = a.packed.views[a.packed.paths["buf.h"]].storage
    assert mixed.outputs == [out] and not torch.equal(mixed.after[out], a.after[out])
    assert calls[1].same_as == 0
