"""The superop executor runs the stored winner of its device (and the built-in kernel for shapes without
one), and a model run with it gives the reference's greedy tokens; a stored file that changed since it
was verified, or another device's winner, is never run."""

from __future__ import annotations

import pytest

from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.superop import SuperOpExecutor
from nonstop.runtime.tuned import op_variant, program_shape_key
from nonstop.tune import store
from tests.runtime.helpers import MAX_TOKENS_SHORT, PROMPTS, greedy_tokens, tiny_model
from tests.tune.helpers import HERE

WINNER = (HERE / "kernels" / "linear_residual_rowloop.py").read_text()


def _store_winner(path, model, device="cpu", source=WINNER):
    """The winner for every (B, T) a short greedy run can step with, as `nonstop tune` would record it."""
    program = SuperOpExecutor(model, use_kernels=False).program
    ops = [op for op in program.ops if op.kind == "linear_residual"]
    for B in range(1, 4):
        for T in range(1, 5):
            for key in {program_shape_key(program, op, B, T) for op in ops}:
                store.record(
                    path,
                    device,
                    "linear_residual",
                    key,
                    source,
                    {
                        "proposer": "test",
                        "round": 1,
                        "candidate": "r1c1",
                        "timed": False,
                        "time_ms": None,
                        "variants": sorted({op_variant(op) for op in ops}),
                    },
                )


def test_stored_winner_gives_the_reference_tokens(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    model = tiny_model("llama")
    _store_winner(path, model)
    ex = SuperOpExecutor(model)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS_SHORT) == greedy_tokens(
        model, ReferenceExecutor(model), PROMPTS, MAX_TOKENS_SHORT
    )
    used = ex.stats["tuned"]["linear_residual"]["used"]
    assert (
        sum(used.values()) >= 4
        and any(k.startswith("B3xT1") for k in used)
        and any(k.startswith("B1xT4") for k in used)
    )
    assert set(ex.stats["tuned"]) == {"linear_residual"}


def test_changed_file_and_other_devices_fall_back_to_the_builtin(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    model = tiny_model("llama")
    _store_winner(path, model, device="NVIDIA H100 80GB HBM3")  # not this machine's device
    ex = SuperOpExecutor(model)
    assert "tuned" not in ex.stats
    _store_winner(path, model)
    kernel = next((tmp_path / "kernels").glob("linear_residual-*.py"))
    kernel.write_text(WINNER.replace("BLOCK_N = 16", "BLOCK_N = 32"))  # edited after verification
    ex = SuperOpExecutor(model)
    with pytest.warns(RuntimeWarning, match="changed since it was verified"):
        tokens = greedy_tokens(model, ex, [[3, 4]], [2])
    assert tokens == greedy_tokens(model, ReferenceExecutor(model), [[3, 4]], [2])
    assert sum(ex.stats["tuned"]["linear_residual"]["used"].values()) == 0


def test_store_off(tmp_path, monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(tmp_path / "tuning.json"))
    _store_winner(tmp_path / "tuning.json", model)
    assert "tuned" in SuperOpExecutor(model).stats
    monkeypatch.setenv("NONSTOP_TUNING_STORE", "off")
    assert "tuned" not in SuperOpExecutor(model).stats
