"""A top_k larger than any vocabulary (SamplingParams and the server take any integer, e.g. 2**63) keeps
every id, on the device sampler as on the host's. It overflowed the int64 ``sample_top_k`` buffer and
failed every request of its decode batch (finish_reason ``error`` for another client's request too)."""

from __future__ import annotations

import pytest
import torch

from nonstop.engine.sampling import SamplingParams
from nonstop.runtime.device_sampling import SampleRow, fill_sample_rows


@pytest.mark.parametrize("top_k", [2**31, 2**63, 10**30])
def test_a_huge_top_k_is_off_on_the_device_row(top_k):
    row = SampleRow.of(SamplingParams(temperature=0.7, top_k=top_k, seed=3))
    assert row == SampleRow.of(SamplingParams(temperature=0.7, top_k=-1, seed=3))
    buf = {n: torch.zeros(2, dtype=torch.int64) for n in ("sample_top_k", "sample_seed", "sample_offset")}
    buf |= {n: torch.zeros(2) for n in ("sample_temperature", "sample_top_p")}
    fill_sample_rows(buf, [row, SampleRow.of(SamplingParams(top_k=2**31 - 1, seed=1))], torch.tensor([4, 5]))
    assert buf["sample_top_k"].tolist() == [-1, 2**31 - 1]  # the largest int32 still a plain top_k


def test_a_huge_top_k_in_a_device_sampled_batch_fails_no_request(tmp_path):
    """superop, device sampling, two requests in one batch: the one with top_k 2**63 samples as top_k off
    (the same tokens for its seed), and the other request is untouched."""
    from nonstop.engine.llm import LLM
    from tests.engine.tiny_models import synth_checkpoint

    llm = LLM(synth_checkpoint("llama", tmp_path), dtype="float32", backend="superop", max_batch=2, tokenizer="bytes")

    def run(top_k: int) -> dict:
        core = llm.new_core(2, isolate_errors=True)
        good = SamplingParams(max_tokens=4, temperature=1.0, seed=1, ignore_eos=True)
        other = SamplingParams(max_tokens=4, temperature=1.0, seed=2, top_k=top_k, ignore_eos=True)
        reqs = llm.make_requests(None, [5, 6, 7], good, request_id="a") + llm.make_requests(
            None, [8, 9], other, request_id="b"
        )
        for r in reqs:
            core.add(r)
        while core.running:
            core.step()
        return {r.request_id: (r.finish_reason, r.output_ids) for r in reqs}

    off, huge = run(-1), run(2**63)
    assert huge == off and {reason for reason, _ in off.values()} == {"length"}
