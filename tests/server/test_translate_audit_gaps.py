"""Gap found by a mutation audit of ``nonstop/server/translate.py``: how a completion ``prompt`` splits
into prompts (OpenAI: a list of token-id lists is one prompt per inner list; a flat id list is one prompt)."""

from __future__ import annotations

from nonstop.server.translate import _prompt_list


def test_a_list_of_token_id_lists_is_one_prompt_per_inner_list():
    """Catches a list of id lists taken for a single prompt (its first item a list, not an int)."""
    assert _prompt_list([[1, 2], [3]]) == [[1, 2], [3]]
    assert _prompt_list([1, 2, 3]) == [[1, 2, 3]]
    assert _prompt_list(["ab", "c"]) == ["ab", "c"]
    assert _prompt_list("ab") == ["ab"]
