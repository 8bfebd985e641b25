"""The megakernel and the tuning store: a stored winner whose launches are the built-in launchers with other
tile sizes runs inside the megakernel (its tasks take the winner's block sizes) and gives the reference's
greedy tokens; a winner with kernels of its own is refused for its shapes, visibly, and the built-in
launch runs there."""

from __future__ import annotations

import pytest

from nonstop.kernels.gemv import gemv_blocks
from nonstop.runtime.executors import ReferenceExecutor
from nonstop.runtime.megakernel import MegakernelExecutor
from tests.runtime.helpers import MAX_TOKENS_SHORT, PROMPTS, greedy_tokens, tiny_model
from tests.tune.helpers import HERE
from tests.tune.test_tuned_executor import _store_winner

BLOCKS = (HERE / "kernels" / "linear_residual_blocks.py").read_text()  # the built-in with BLOCK_N = BLOCK_K = 16
ROWLOOP = (HERE / "kernels" / "linear_residual_rowloop.py").read_text()  # a kernel of its own


def _gemv_blocks_in_tasks(ex) -> set[tuple]:
    """(BLOCK_N, BLOCK_K) of every megakernel task class whose body is the GEMV tile."""
    out = set()
    for mk in ex._kernels.values():
        for c in mk.plan.classes:
            consts = {p.name: p.value for p in c.params if p.kind == "const"}
            if "EPILOGUE" in consts:  # gemv_tile: linear_residual and lm_head
                out.add((consts["BLOCK_N"], consts["BLOCK_K"]))
    return out


def _megakernel_with(winner: str, tmp_path, monkeypatch):
    """(tiny llama, its megakernel executor) with ``winner`` stored for every linear_residual shape."""
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("NONSTOP_TUNING_STORE", str(path))
    model = tiny_model("llama")
    _store_winner(path, model, source=winner)
    return model, MegakernelExecutor(model)


def test_a_stored_winner_runs_in_the_megakernel(tmp_path, monkeypatch):
    model, ex = _megakernel_with(BLOCKS, tmp_path, monkeypatch)
    assert greedy_tokens(model, ex, PROMPTS, MAX_TOKENS_SHORT) == greedy_tokens(
        model, ReferenceExecutor(model), PROMPTS, MAX_TOKENS_SHORT
    )
    tuned = ex.stats["tuned"]["linear_residual"]
    assert sum(tuned["used"].values()) > 0 and tuned["refused"] == {}
    w = next(op for op in ex.program.ops if op.kind == "linear_residual").weights["w"]
    default = gemv_blocks(1, w.shape[0], w.shape[1], w.device)
    assert (default["BLOCK_N"], default["BLOCK_K"]) != (16, 16)  # so the winner's tasks are another code path
    assert (16, 16) in _gemv_blocks_in_tasks(ex)


def test_a_winner_with_its_own_kernel_is_refused_visibly(tmp_path, monkeypatch):
    model, ex = _megakernel_with(ROWLOOP, tmp_path, monkeypatch)
    with pytest.warns(RuntimeWarning, match="megakernel: the stored winner launches _gemv_rows"):
        tokens = greedy_tokens(model, ex, [[3, 4, 5]], [2])
    assert tokens == greedy_tokens(model, ReferenceExecutor(model), [[3, 4, 5]], [2])
    tuned = ex.stats["tuned"]["linear_residual"]
    assert tuned["refused"] and all("_gemv_rows" in why for why in tuned["refused"].values())
    assert sum(tuned["used"].values()) == 0
