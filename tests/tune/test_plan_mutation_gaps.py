"""The verification plan and call sequence (``verify.plan`` / ``call_plan``) and the static stage of
``verify``: what the module docstring of ``verify.py`` promises, checked on a tiny model without a child."""

from __future__ import annotations

import random

import torch

from nonstop.tune.cases import CaseSpec
from nonstop.tune.verify import MIXED_CASES, call_plan, plan, prepare, verify
from tests.tune.helpers import tiny_target


def test_every_plan_has_a_hidden_speculative_keep_states_case():
    """A speculative step (``keep_states``: the KDA histories are written) is always among the hidden cases,
    of several tokens, its shape drawn (a fixed (2, 3) never covered a one-sequence speculative step); a
    decode target (T = 1) has no tuned one."""
    shapes = set()
    for seed in range(12):
        specs = plan(tiny_target("linear_residual"), random.Random(seed))
        ks = [s for s in specs if s.keep_states]
        assert len(ks) == 1 and ks[0].label == "hidden" and ks[0].T > 1, [s.describe() for s in specs]
        shapes.add((ks[0].B, ks[0].T))
    assert len(shapes) > 3 and 1 in {B for B, _ in shapes}


def test_a_tuned_shape_of_several_tokens_is_also_verified_as_a_speculative_step():
    """The store key does not tell a speculative step from a plain one of the same B x T: both are verified."""
    from nonstop.config import ModelConfig
    from nonstop.tune.target import make_target
    from tests.tiny_configs import TINY_CONFIGS

    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["kimi_linear"])
    target = make_target("kda_core", "tiny-kimi-linear", cfg, torch.float32, "cpu", [1, 2], tokens=3)
    tuned = [(s.B, s.T, s.keep_states) for s in plan(target, random.Random(0)) if s.label == "tuned"]
    assert sorted(tuned) == [(1, 3, False), (1, 3, True), (2, 3, False), (2, 3, True)]


def test_one_hidden_case_caches_hundreds_of_tokens():
    """Attention that reads only the first keys (a fixed 64-key split) must meet a context past it: one
    hidden case caches 300 to 600 tokens per sequence (the others at most ``MAX_PREFIX``)."""
    for seed in range(5):
        specs = plan(tiny_target("gqa_attn"), random.Random(seed))
        long = [s.context for s in specs if s.context is not None]
        assert len(long) == 1 and 300 <= long[0] <= 600, [s.describe() for s in specs]


def test_the_call_sequence_runs_a_twice_then_b_with_swapped_weights_in_the_first_cases():
    target = tiny_target("linear_residual")
    rng = random.Random(0)
    specs = [CaseSpec("hidden", target.cfg, torch.float32, B, 1, False, 0) for B in (1, 2, 3)]
    cases = [
        prepare(s, target.kind, target.device, rng.randrange(2**31), rng.randrange(2**31)) for s in specs for _ in "AB"
    ]
    states, calls = call_plan(cases, specs, target.kind, target.device)
    labels = [c.label.split(", ", 1)[1] for c in calls]
    mixed = ["call on A", "call on A again", "call on A's inputs with B's weights", "call on B",
             "call on B's inputs with A's weights"]  # fmt: skip
    assert MIXED_CASES == 2
    assert labels == mixed + mixed + ["call on A", "call on A again", "call on B"]
    # the determinism call is on the same state as the call it repeats
    again = [c for c in calls if c.same_as is not None]
    assert len(again) == 3 and all(calls[c.same_as].state == c.state for c in again)
    # "A's inputs with B's weights": the op's weights are B's bytes, everything else is A's
    a, b, ab = cases[0], cases[1], states[calls[2].state]
    for path, index in ab.packed.paths.items():
        s = ab.packed.views[index].storage
        src = b if path.startswith("op.") else a
        want = src.packed.storages[src.packed.views[src.packed.paths[path]].storage]
        assert torch.equal(ab.packed.storages[s], want), path
    assert calls[3].state == 1 and calls[0].state == 0


def test_a_static_violation_is_refused_before_any_process():
    source = "import os\nfrom nonstop.kernels.dense import linear_residual as launch\n"
    verdict = verify(source, tiny_target("linear_residual"), timeout_s=30)
    assert not verdict.accepted and verdict.stage == "static"
    assert any("import os" in r for r in verdict.reasons), verdict.reasons


def test_hidden_configs_have_odd_widths():
    """Odd hidden and vocabulary widths: a kernel that only works on even (or 16-multiple) widths shows."""
    from nonstop.tune.cases import hidden_config

    cfg = tiny_target("linear_residual").cfg
    for seed in range(8):
        hidden = hidden_config(cfg, random.Random(seed))
        assert hidden.hidden_size % 2 == 1 and hidden.vocab_size % 2 == 1, (hidden.hidden_size, hidden.vocab_size)


def test_torch_compute_in_nonstop_code_other_than_kernels_and_cache_is_a_violation():
    """The child's recorder: nonstop code outside nonstop.kernels / nonstop.cache (here the model's RMSNorm,
    as a twin would) computing on the candidate's behalf is a violation that names the file."""
    from nonstop.model.norms import rms_norm
    from nonstop.tune.child_run import Recorder

    x, w = torch.randn(3, 4), torch.randn(4)
    recorder = Recorder("/nonexistent/candidate.py")
    with recorder:
        rms_norm(x, w, 1e-6)
    assert recorder.violations and all(v.endswith(" run by nonstop/model/norms.py") for v in recorder.violations), (
        recorder.violations
    )
