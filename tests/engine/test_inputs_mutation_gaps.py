"""Prompt and size arguments of the Python API (``engine/inputs``): checks a mutation audit found missing.

Expected values come from the module's documented contract, not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nonstop.engine.inputs import check_max_batch, check_prefill_chunk, prompt_id_lists, prompt_list


def test_one_string_is_one_prompt():
    assert prompt_list("Hello") == ["Hello"]
    assert prompt_list(["Hello", "x"]) == ["Hello", "x"]


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_a_bool_is_not_a_size(value):
    with pytest.raises(TypeError, match="max_batch must be an integer >= 1"):
        check_max_batch(value)
    with pytest.raises(TypeError, match="prefill_chunk must be an integer >= 1"):
        check_prefill_chunk(value)


@pytest.mark.parametrize("array", [np.zeros((2, 2), dtype=np.int64), torch.zeros(1, 2, dtype=torch.long)])
def test_a_2d_array_inside_a_list_of_prompts_is_named(array):
    with pytest.raises(TypeError, match=r"prompt_token_ids\[0\] must be a list of token ids or a 1-D integer array"):
        prompt_id_lists([array, [1, 2]])
