"""The LLM prompt's rules say what the static checker allows: every torch name they offer passes it."""

from __future__ import annotations

import re

import pytest

from nonstop.tune.allowed import path_problem
from nonstop.tune.prompt import RULES
from nonstop.tune.static_check import static_check

NAMED = sorted(set(re.findall(r"\btorch(?:\.\w+)+", RULES)))
CANDIDATE = """
import torch
from nonstop.kernels.dense import linear_residual


def launch(op, env):
    scratch = {call}(env.buf[op.writes[0]])
    linear_residual(op, env)
"""


def test_the_rules_name_torch_functions():
    assert "torch.zeros" in NAMED and any(n.startswith("torch.cuda.") for n in NAMED), NAMED


@pytest.mark.parametrize("name", NAMED)
def test_every_torch_name_in_the_rules_is_allowed(name):
    assert path_problem(name.split(".")) is None
    if name == "torch.Tensor":  # a type, for isinstance (the legacy constructor allocates uninitialised memory)
        typed = "isinstance(env.buf[op.writes[0]], {call})"
        source = CANDIDATE.replace("scratch = {call}(env.buf[op.writes[0]])", typed)
        assert static_check(source.format(call=name), "linear_residual") == []
        assert static_check(CANDIDATE.format(call=name), "linear_residual")
        return
    assert static_check(CANDIDATE.format(call=name), "linear_residual") == []


def test_the_rules_offer_no_allocation_the_checker_rejects():
    assert "empty" not in RULES
    assert static_check(CANDIDATE.format(call="torch.empty_like"), "linear_residual")
    assert static_check(CANDIDATE.format(call="torch.empty"), "linear_residual")
