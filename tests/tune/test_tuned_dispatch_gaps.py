"""``TunedKind`` dispatch: a stored winner runs only for the op, B, T and dtype it was stored at. The shape key of
a call is cached per (op, B, T); a cache that forgot T or the op ran one shape's winner at another (a wrong
kernel, not a slower one). Weightless ops key on their activations' dtype."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import torch

from nonstop.runtime.tuned import CANDIDATE_RULES, TunedKind

WINNER = """
def launch(op, env):
    env.ran.append(("winner", op.name, env.B, env.T))
"""


def _entry(root: Path) -> dict:
    (root / "k.py").write_text(WINNER)
    digest = hashlib.sha256(WINNER.encode()).hexdigest()
    return {"kernel": "k.py", "sha256": digest, "rules": CANDIDATE_RULES, "variants": [""]}  # ops without variants


def _op(name: str, weights: dict, attrs: dict | None = None):
    return SimpleNamespace(name=name, kind="k", weights=weights, attrs=attrs or {}, reads=["x"])


def _env(B: int, T: int, dtype=torch.float32):
    return SimpleNamespace(B=B, T=T, buf={"x": torch.zeros(1, dtype=dtype)}, ran=[])


def _fallback(op, env, **kwargs):
    env.ran.append(("builtin", op.name, env.B, env.T))


def _kind(tmp_path: Path, keys: list[str]) -> TunedKind:
    entry = _entry(tmp_path)
    return TunedKind("k", _fallback, {k: entry for k in keys}, tmp_path)


def test_a_winner_for_t1_does_not_run_at_t2_of_the_same_b(tmp_path):
    """Stored at B1xT1 only: the same op at B=1, T=2 (a speculative / prefill step) runs the built-in."""
    op = _op("a", {"w": torch.zeros(4, 3)})
    kind = _kind(tmp_path, ["B1xT1 w=4x3 float32"])
    one, two = _env(1, 1), _env(1, 2)
    kind(op, one)
    kind(op, two)
    assert one.ran == [("winner", "a", 1, 1)]
    assert two.ran == [("builtin", "a", 1, 2)]
    assert kind.used == {"B1xT1 w=4x3 float32": 1}


def test_a_winner_for_one_op_does_not_run_for_another_op_of_the_kind(tmp_path):
    """Two ops of one kind with other weight shapes at the same B, T: only the stored one runs the winner."""
    small, big = _op("small", {"w": torch.zeros(4, 3)}), _op("big", {"w": torch.zeros(8, 3)})
    kind = _kind(tmp_path, ["B2xT1 w=4x3 float32"])
    env = _env(2, 1)
    kind(small, env)
    kind(big, env)
    kind(small, env)
    assert env.ran == [("winner", "small", 2, 1), ("builtin", "big", 2, 1), ("winner", "small", 2, 1)]


def test_a_weightless_op_runs_the_winner_of_its_activation_dtype_only(tmp_path):
    """A weightless op (attention) is keyed by its int attrs and its activations' dtype: the bfloat16 winner
    runs on bfloat16 activations, not on float32 ones (two op objects, both alive, as a program's are)."""
    kind = _kind(tmp_path, ["B1xT1 heads=2 bfloat16"])
    bf16, fp32 = _env(1, 1, torch.bfloat16), _env(1, 1, torch.float32)
    ops = _op("attn_bf16", {}, {"heads": 2}), _op("attn_fp32", {}, {"heads": 2})
    kind(ops[0], bf16)
    kind(ops[1], fp32)
    assert bf16.ran == [("winner", "attn_bf16", 1, 1)]
    assert fp32.ran == [("builtin", "attn_fp32", 1, 1)]


def test_stats_count_the_stored_shapes_of_each_kind(tmp_path, monkeypatch):
    """``stats["tuned"][kind]["shapes"]`` is the number of stored shapes of that kind on this device (2 here),
    not the number of kinds stored (3)."""
    import json

    from nonstop.runtime import tuned

    entry = _entry(tmp_path)
    store = {"version": 1, "entries": {"cpu": {"k": {"s1": entry, "s2": entry}, "j": {"s1": entry}, "i": {}}}}
    (tmp_path / "tuning.json").write_text(json.dumps(store))
    monkeypatch.setenv(tuned.STORE_ENV, str(tmp_path / "tuning.json"))
    program = SimpleNamespace(ops=[SimpleNamespace(kind="k")])
    stats: dict = {}
    out = tuned.use_tuned({"k": _fallback, "j": _fallback}, program, "cpu", stats)
    assert isinstance(out["k"], TunedKind) and out["j"] is _fallback
    assert stats["tuned"] == {"k": {"shapes": 2, "used": {}, "refused": {}, "unverified": {}}}
