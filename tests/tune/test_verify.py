"""The sandboxed verifier end to end (one child process per candidate, under TRITON_INTERPRET=1): every
cheat of the corpus that only running can expose is rejected for the reason it names; the built-in
kernels and correct kernels written for the tests are accepted."""

from __future__ import annotations

import pytest

from nonstop.tune.verify import builtin_source, verify
from tests.tune.helpers import CORPUS, CORRECT, expectation, tiny_target

DYNAMIC = [p for p in CORPUS if expectation(p)[1] == "dynamic"]


@pytest.mark.parametrize("path", DYNAMIC, ids=lambda p: p.stem)
def test_dynamic_cheats_are_rejected(path):
    kind, _, phrase = expectation(path)
    verdict = verify(path.read_text(), tiny_target(kind), timeout_s=240)
    assert not verdict.accepted, f"{path.name} was accepted"
    assert verdict.stage in ("dynamic", "import", "run")
    assert any(phrase in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("path", CORRECT, ids=lambda p: p.stem)
def test_correct_kernels_are_accepted(path):
    verdict = verify(path.read_text(), tiny_target("linear_residual"), timeout_s=240)
    assert verdict.accepted, verdict.reasons
    assert len(verdict.record["cases"]) >= 5 and sum("hidden" in c for c in verdict.record["cases"]) >= 3
    assert verdict.timing == {}  # no GPU: verified, never timed


# every kind with a kernel, on the smallest tiny model that has it (moe_experts also in MXFP4)
BUILTIN_CASES = [
    *[(k, "llama") for k in ("embed", "gqa_attn", "gqa_qkv_rope", "linear_residual", "lm_head", "mlp")],
    *[(k, "deepseek_v3") for k in ("mla_in_proj", "mla_q_up", "mla_attn", "moe_front", "moe_experts", "moe_tail")],
    ("kda_in_proj", "kimi_linear"),
    ("kda_core", "kimi_linear"),
    ("attnres_mix_norm", "kimi_k3"),
    ("moe_experts", "kimi_k3_mxfp4"),
]


def test_every_kind_with_a_kernel_has_a_builtin_case():
    from nonstop.kernels import KERNELS

    assert {k for k, _ in BUILTIN_CASES} == set(KERNELS) - {"sample"}  # sample is not lowered into a Program


@pytest.mark.parametrize("kind,config", BUILTIN_CASES)
def test_builtin_kernels_are_accepted(kind, config):
    """The built-in kernels pass the whole verification, the executor run included (about 15-35 s each under
    the interpreter: 16 cases, 5 to 6 minutes on a loaded 2-core machine)."""
    verdict = verify(builtin_source(kind), tiny_target(kind, config), timeout_s=300)
    assert verdict.accepted, verdict.reasons
    run = verdict.record["executor_run"]
    assert run["tuned_calls"] >= 3 and run["steps"] == 4


def test_a_hang_is_stopped():
    source = (
        "from nonstop.kernels.dense import linear_residual\n\ndef launch(op, env):\n    while True:\n        pass\n"
    )
    verdict = verify(source, tiny_target("linear_residual"), timeout_s=15)
    assert not verdict.accepted and "timed out" in verdict.reasons[0]
