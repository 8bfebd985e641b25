"""The README's op counts, bandwidth floors and table of CPU peer runs are ``bench/readme_numbers.py``'s output:
recomputed here where that is fast (k3-nano's counts, every super-op count, the floors, the peer rows), read from the
script's last output where it is not (Kimi K3's eager ops, counted on a narrow twin in about a minute)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench_script import load_bench

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_bench("readme_numbers.py")


def test_readme_quotes_the_numbers_as_computed_now():
    script = _script()
    recorded = json.loads(script.OUT.read_text())
    numbers = {
        "op_counts": {},
        "floors": {name: script.floor(name) for name in script.FLOOR_RUNS},
        "peers": script.peer_rows(),
    }
    for model in script.OP_COUNT_MODELS:
        saved = recorded["op_counts"][model]
        live = script.op_counts(model) if model == "k3-nano" else dict(saved, super_ops=script.super_ops(model))
        assert live == saved, (model, live, saved)
        numbers["op_counts"][model] = live
    assert numbers["floors"] == recorded["floors"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    for fragment in script.fragments(numbers):
        assert fragment in readme, fragment
