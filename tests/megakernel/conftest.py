"""The simulator runs thousands of tiny torch ops: one intra-op thread avoids OpenMP spinning on a busy
machine (10x less CPU here). Restored after each module."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
