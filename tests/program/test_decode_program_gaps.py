"""Decode-program helpers that the other program tests leave open, each against hand arithmetic or an
independent construction: the residual-stream taps a finished step keeps (``program/taps.py``), the narrow
twin's shapes (``program/twin.py``), which model ``decode_program`` counts on (``program/count.py``), and the
preflight's boundaries and allocation-failure test (``program/preflight.py``)."""

from __future__ import annotations

import pytest
import torch

from nonstop.config import ModelConfig
from nonstop.program import preflight
from nonstop.program.taps import available_taps, read_taps
from nonstop.program.twin import narrow_twin
from tests.tiny_configs import (
    DEEPSEEK,
    DEEPSEEK_MANY_EXPERTS,
    KIMI_K3,
    KIMI_LINEAR_RELEASE,
    LLAMA,
)

K3 = ModelConfig.from_hf_dict(KIMI_K3)  # 7 layers in AttnRes blocks of 3: blocks enter layers 0, 3, 6
D = 44


def _k3_buffers(B: int, T: int) -> dict[str, torch.Tensor]:
    """Finished-step buffers whose every value names where it sits: blocks[r, j, :] = 100·j + r, partial = -r."""
    R = B * T
    rows = torch.arange(R, dtype=torch.float32)
    blocks = torch.stack([100 * j + rows for j in range(3)], dim=1)[..., None].expand(R, 3, D).contiguous()
    partial = (-rows)[:, None].expand(R, D).contiguous()
    return {"blocks": blocks, "partial": partial}


def test_k3_keeps_a_tap_at_every_block_boundary_and_the_last_layer():
    """Catches a tap list that drops the embedding (tap 0) or a block start, or misses the final stream."""
    assert available_taps(K3) == (0, 3, 6, 7)
    assert available_taps(ModelConfig.from_hf_dict(LLAMA)) == (3,)


def test_block_taps_read_their_own_block_and_the_last_tap_reads_partial():
    """tap l at a block boundary is blocks[:, l // block_size]; tap L is partial; rows regroup as [B, T, d].
    Catches an off-by-one block index or the wrong buffer for the final tap."""
    B, T = 2, 3
    buf = _k3_buffers(B, T)
    got = read_taps(K3, buf, (0, 3, 6, 7), B, T)
    for tap, j in ((0, 0), (3, 1), (6, 2)):
        want = torch.tensor([[[100.0 * j + b * T + t] * D for t in range(T)] for b in range(B)])
        torch.testing.assert_close(got[tap], want)
    want = torch.tensor([[[-float(b * T + t)] * D for t in range(T)] for b in range(B)])
    torch.testing.assert_close(got[7], want)


def test_taps_are_copies_that_the_next_step_cannot_overwrite():
    """A drafter keeps the taps while the next step reuses the Program's buffers: read_taps must copy.
    Catches returning views of ``blocks`` / ``partial``."""
    buf = _k3_buffers(1, 2)
    got = read_taps(K3, buf, (3, 7), 1, 2)
    before = {tap: t.clone() for tap, t in got.items()}
    buf["blocks"].fill_(12345.0)
    buf["partial"].fill_(-12345.0)
    for tap in got:
        torch.testing.assert_close(got[tap], before[tap])


@pytest.mark.parametrize("tap", [1, 2, 5, 8])
def test_a_tap_the_program_does_not_keep_is_refused(tap):
    """A tap inside a block (or past the last layer) is not in any buffer: a clear ValueError, not a wrong
    block's stream. Catches a dropped check."""
    with pytest.raises(ValueError, match="keeps the residual stream only at layers"):
        read_taps(K3, _k3_buffers(1, 1), (tap,), 1, 1)


# ----------------------------------------------------------------------------- the narrow twin


def test_twin_keeps_gqa_grouping_and_mha():
    """Llama's 5 query heads share 1 KV head (GQA): the twin keeps grouped queries (2 heads, 1 KV head);
    a config with as many KV heads as heads (MHA) keeps KV = heads (2, 2). Catches a twin that turns GQA
    into MHA or back."""
    gqa = narrow_twin(ModelConfig.from_hf_dict(LLAMA)).gqa
    assert (gqa.num_heads, gqa.num_kv_heads, gqa.head_dim) == (2, 1, 16)
    mha = narrow_twin(ModelConfig.from_hf_dict({**LLAMA, "num_key_value_heads": 5, "head_dim": 8})).gqa
    assert (mha.num_heads, mha.num_kv_heads) == (2, 2)


def test_twin_keeps_q_lora_latent_and_routing_group_structure():
    """DeepSeek's q-LoRA stays a q-LoRA, K3's MLA too; Kimi Linear's MLA has no q-LoRA and its twin none;
    K3's latent MoE keeps a latent, DeepSeek's plain MoE none; the twin has at least 2·top_k experts per
    routing group so top-k still chooses among groups. Catches a twin that adds or drops a q-LoRA / latent or
    shrinks the experts below top-k."""
    for raw, q_lora in (
        (DEEPSEEK, 24),
        (KIMI_K3, 24),
        (KIMI_LINEAR_RELEASE, None),
        (DEEPSEEK_MANY_EXPERTS, 24),
    ):
        cfg = ModelConfig.from_hf_dict(raw)
        twin = narrow_twin(cfg)
        if cfg.mla is not None:
            assert twin.mla.q_lora_rank == (q_lora if cfg.mla.q_lora_rank else None), raw["model_type"]
        if cfg.moe is not None:
            m, t = cfg.moe, twin.moe
            assert (t.latent_size is None) == (m.latent_size is None)
            assert t.top_k == m.top_k and t.num_groups == m.num_groups
            per_group = max(2, -(-2 * m.top_k // m.num_groups))  # ceil(2·top_k / groups), at least 2
            assert t.num_experts == per_group * m.num_groups
            assert t.num_experts >= 2 * m.top_k


def test_a_small_model_is_counted_on_itself():
    """``decode_program`` builds and counts a model under INSTANTIATE_LIMIT itself ("this model"); only a
    larger one falls back to a narrow twin. Catches an inverted size test."""
    from nonstop.program.count import decode_program

    _, eager, source = decode_program(ModelConfig.from_hf_dict(LLAMA), torch.float32)
    assert source == "this model" and eager > 0


# ----------------------------------------------------------------------------- preflight


def test_a_checkpoint_that_exactly_fills_the_disk_is_allowed(tmp_path):
    """check_disk refuses only when the bytes exceed the free space. Catches ``>=``."""
    preflight.check_disk("ckpt", 5000, tmp_path, free=5000)
    with pytest.raises(preflight.PreflightError, match="needs 5 KB of disk"):
        preflight.check_disk("ckpt", 5001, tmp_path, free=5000)


def test_refuse_if_short_allows_an_exact_fit():
    """weights + cache == free fits. Catches ``>=``."""
    preflight.refuse_if_short("m", 600, 400, torch.bfloat16, 1, "this machine", 1000)
    with pytest.raises(preflight.PreflightError, match="m needs 1 KB at bfloat16"):
        preflight.refuse_if_short("m", 600, 401, torch.bfloat16, 1, "this machine", 1000)


def test_the_cpu_allocators_error_is_an_allocation_failure():
    """torch's CPU allocator raises a RuntimeError ("DefaultCPUAllocator: can't allocate memory ..."), not a
    MemoryError: it must count as an allocation failure; other RuntimeErrors must not."""
    assert preflight.allocation_failed(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory"))
    assert preflight.allocation_failed(MemoryError())
    assert not preflight.allocation_failed(RuntimeError("shape mismatch"))


def test_cache_bytes_scale_with_slots_states_included():
    """Every slot holds its own KDA state and its own cache: cache = slots·(state + tokens·per_token), with
    tokens capped at max_positions. Catches a state counted once for all slots or an uncapped token count."""
    fp = preflight.Footprint(0, 0, 0, 7, 0, cache_bytes_per_token=3, state_bytes_per_sequence=100)
    assert preflight.footprint_bytes(fp, max_positions=50, slots=4, cache_tokens=1024) == (7, 4 * (100 + 50 * 3))
    assert preflight.footprint_bytes(fp, max_positions=5000, slots=2, cache_tokens=10) == (7, 2 * (100 + 10 * 3))


def test_a_verification_step_is_counted_with_the_kda_states_it_keeps():
    """``count_decode_ops(rows=R)`` counts the step a speculative decoder verifies with: a KDA model keeps its
    conv window and recurrent state after every row (``keep_states``), which dispatches extra ops. The count
    must equal the same step run here with ``keep_states=True`` (and differ from one without). Catches a
    verification count made without the kept states."""
    from nonstop.model.build import random_model
    from nonstop.model.rows import row_exact
    from nonstop.program.count import OpCounter, count_decode_ops, prefilled

    model = random_model(ModelConfig.from_hf_dict(KIMI_LINEAR_RELEASE), torch.float32, seed=2)
    rows = 3

    def count(keep: bool) -> int:
        cache, _ = prefilled(model, 8, rows + 4)
        ids, batch, counter = torch.arange(rows)[None], cache.batch([0], rows, keep_states=keep), OpCounter()
        with torch.inference_mode(), counter, row_exact():
            model(ids, cache, batch)
        return counter.total

    kept = count(True)
    assert kept != count(False)
    assert count_decode_ops(model, rows=rows).total == kept
