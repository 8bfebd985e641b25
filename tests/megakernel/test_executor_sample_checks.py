"""``MegakernelExecutor.sample_tokens`` refuses sampling rows or input ids that do not match its sequences
before anything is reserved, recorded or launched."""

from __future__ import annotations

import pytest
import torch

from nonstop.cache.state import ModelCache
from nonstop.runtime.device_sampling import SampleRow
from tests.runtime.helpers import tiny_model

pytest.importorskip("triton")

from nonstop.runtime.megakernel.executor import MegakernelExecutor  # noqa: E402


@pytest.mark.parametrize(
    "ids, rows",
    [([[5]], [SampleRow(), SampleRow()]), ([[5]], []), ([[5, 6]], [SampleRow()]), ([[5], [6]], [SampleRow()])],
)
def test_sample_tokens_needs_one_row_and_one_token_per_sequence(ids, rows):
    model = tiny_model("llama")
    ex = MegakernelExecutor(model, graphs=False)
    cache = ModelCache(model.cfg, 1, capacity=8, dtype=torch.float32, device="cpu", page_size=4)
    with pytest.raises(ValueError, match="1 sequences need input_ids"):
        ex.sample_tokens(torch.tensor(ids), cache, [0], 1, rows)
    assert int(cache.lengths[0]) == 0 and not ex._kernels and "sampling_launches" not in ex.stats
