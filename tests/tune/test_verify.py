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


@pytest.mark.parametrize(
    "kind,config", [("linear_residual", "llama"), ("kda_core", "kimi_linear"), ("mla_attn", "deepseek_v3")]
)
def test_builtin_kernels_are_accepted(kind, config):
    verdict = verify(builtin_source(kind), tiny_target(kind, config), timeout_s=240)
    assert verdict.accepted, verdict.reasons


def test_a_hang_is_stopped():
    source = (
        "from nonstop.kernels.dense import linear_residual\n\ndef launch(op, env):\n    while True:\n        pass\n"
    )
    verdict = verify(source, tiny_target("linear_residual"), timeout_s=15)
    assert not verdict.accepted and "timed out" in verdict.reasons[0]
