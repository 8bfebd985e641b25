"""What a tuning is about (``nonstop/tune/target.py``) and what the LLM prompt says of it
(``nonstop/tune/prompt.py``), on the tiny llama config: no kernel runs."""

from __future__ import annotations

import torch

from nonstop.config import ModelConfig
from nonstop.tune import prompt
from nonstop.tune.candidate import Candidate, Outcome, RoundContext
from nonstop.tune.target import make_target
from tests.tiny_configs import TINY_CONFIGS

HIDDEN, INTER = 40, 68  # the tiny llama's hidden and intermediate sizes


def _mlp(rows, tokens=1, device="cpu"):
    cfg = ModelConfig.from_hf_dict(TINY_CONFIGS["llama"])
    return make_target("mlp", "tiny-llama", cfg, torch.float32, device, list(rows), tokens)


def test_mlp_bytes_moved_count_every_row_of_a_speculative_step():
    """An MLP step reads its weights once (gate, up, down: 3 x 68 x 40 fp32, plus the 40-wide norm) and
    each of its B x T rows reads 40 floats and writes 40: weights + R x 320 bytes."""
    weights = (3 * HIDDEN * INTER + HIDDEN) * 4
    shapes = _mlp([1, 2], tokens=2).shapes
    assert [(s.B, s.T) for s in shapes] == [(1, 2), (2, 2)]
    for s in shapes:
        assert s.weight_bytes == weights
        assert s.bytes_moved == weights + s.B * s.T * 2 * HIDDEN * 4


def test_contract_states_the_rows_of_the_first_shape():
    """The contract's example R is B x T of the first tuned shape (3 x 2 = 6), and it lists the op's
    weights with their shapes."""
    target = _mlp([3], tokens=2)
    text = prompt.contract_text(RoundContext(1, 1, target, [], {}, {}))
    assert "(e.g. R = 6)" in text
    assert f"'down': [{HIDDEN}, {INTER}] float32" in text
    assert "Other variants of this kind in the model: 0 " in text


def test_roofline_floor_in_microseconds(monkeypatch):
    """The floor of a shape is its bytes over the peak bandwidth, in microseconds; the built-in kernel's
    time is printed from milliseconds."""
    target = _mlp([1])
    (shape,) = target.shapes
    monkeypatch.setattr(prompt, "peak_bandwidth", lambda device: (1e9, "test peak"))
    ctx = RoundContext(1, 1, target, [], {shape.key: {"median_ms": 0.5}}, {})
    text = prompt.roofline_text(ctx)
    assert f"floor {shape.bytes_moved / 1e9 * 1e6:.2f} us at 0.00 TB/s (test peak)" in text
    assert "built-in kernel 500.00 us" in text


def test_compact_prompt_leaves_out_the_kernel_and_feedback_is_shown():
    """The compact prompt has no current-kernel section, the full one has it; the previous round's
    verifier messages are in both."""
    target = _mlp([1])
    previous = [Outcome(Candidate("r1c1", "", "llm:m", error="timeout"), False, [])]
    ctx = RoundContext(2, 3, target, previous, {}, {})
    _, full = prompt.build_prompt(ctx)
    _, compact = prompt.build_prompt(ctx, compact=True)
    assert "## The current kernel (built-in)" in full and "## The current kernel" not in compact
    for text in (full, compact):
        assert "r1c1: no file (timeout)" in text and "Round 2 of 3" in text


def test_the_rules_name_tensor_as_a_type_only():
    """torch.Tensor is offered only as a type for isinstance (calling it allocates uninitialised memory)."""
    assert prompt.RULES.count("torch.Tensor") == 1
    assert "torch.Tensor (a type, for isinstance" in prompt.RULES


def test_kernel_source_is_truncated_to_the_limit(monkeypatch):
    """The current kernel's source is cut at ``MAX_KERNEL_SOURCE`` characters, marked as truncated."""
    full = prompt.kernel_text("mlp")
    monkeypatch.setattr(prompt, "MAX_KERNEL_SOURCE", 200)
    cut = prompt.kernel_text("mlp")
    assert len(full) > 200 and cut == full[:200] + "\n# ... (truncated)"
