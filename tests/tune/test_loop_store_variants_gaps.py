"""Gap the k8 mutation audit found in ``tune/loop._store``: the entry it records lists the variants its tuned shape
covered (``TunedShape.variants``); an entry listing none runs nowhere (``runtime/tuned.TunedKind.covers``)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from nonstop.tune.loop import _store
from tests.tune.helpers import tiny_target


def test_a_stored_winner_lists_the_variants_its_shape_covered(tmp_path):
    target = tiny_target("linear_residual", "kimi_k3", (1,))
    shape = target.shapes[0]
    candidate = SimpleNamespace(proposer="llm:x", id="r1c1", note="", source="def launch(op, env):\n    pass\n")
    report = SimpleNamespace(
        best={shape.key: (SimpleNamespace(candidate=candidate, record={}), None)}, baseline={}, stored=[]
    )
    path = tmp_path / "tuning.json"
    _store(report, path, target, [shape.key])
    (entry,) = [e for dev in json.loads(path.read_text())["entries"].values() for e in dev["linear_residual"].values()]
    assert entry["variants"] and sorted(entry["variants"]) == sorted(shape.variants)
    assert all(v.startswith("accumulate=") for v in entry["variants"])
