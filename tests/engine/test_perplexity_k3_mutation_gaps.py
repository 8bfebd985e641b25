"""``largest_forward`` (the size the memory check is made for) and infinite NLLs, pinned by hand arithmetic
(a mutation audit of ``nonstop/engine/perplexity.py`` found the windows count of the largest forward unpinned)."""

from __future__ import annotations

import math

import pytest
import torch

from nonstop.engine.perplexity import largest_forward, leading_token_ids, score_token_ids


@pytest.mark.parametrize(
    "tokens,context,batch,want",
    [
        (10, 4, 8, (2, 4)),  # ids 0..10: full windows [0..4], [4..8] (2 of 4 tokens), then a last one of 2 alone
        (8, 4, 8, (2, 4)),  # exactly two full windows, no partial one
        (3, 4, 8, (1, 3)),  # fewer tokens than the context: one window of all 3
        (100, 10, 3, (3, 10)),  # 10 full windows, 3 at a time
        (0, 4, 8, (0, 0)),
    ],
)
def test_largest_forward_by_hand(tokens, context, batch, want):
    assert largest_forward(tokens, context, batch) == want


class _Certain:
    """A model sure of token 0 everywhere: logit 0 for it, -inf for every other id."""

    def __call__(self, ids):
        out = torch.full((*ids.shape, 4), -math.inf)
        out[..., 0] = 0.0
        return out


def test_an_impossible_token_gives_an_infinite_nll_and_perplexity():
    result = score_token_ids(_Certain(), [0, 0, 3, 0], context=2)
    assert result.tokens == 3
    assert result.total_nll == math.inf  # -log 0 for the id 3; the others cost nothing
    assert result.perplexity == math.inf


def test_a_certain_model_scores_zero_nll():
    result = score_token_ids(_Certain(), [0] * 9, context=4, batch_size=1)
    assert result.total_nll == 0.0 and result.perplexity == 1.0


def test_prefixes_that_never_agree_read_the_whole_text():
    # an encoder whose first id is the text's length: no two prefixes agree on it, so only the whole text answers
    text = "a" * 20000
    assert leading_token_ids(lambda t: [len(t)], text, count=1) == ([20000], True)


def test_prefixes_that_agree_stop_early():
    text = "ab" * 20000
    ids, whole = leading_token_ids(lambda t: [ord(c) for c in t], text, count=3)
    assert (ids, whole) == ([97, 98, 97], False)
