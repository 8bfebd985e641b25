"""Gaps found by a mutation audit of ``nonstop/server/protocol.py`` (request-body validation), checked
in-process through ``translate.parse_body`` (no server needed)."""

from __future__ import annotations

import json

import pytest

from nonstop.server.errors import APIError
from nonstop.server.protocol import CompletionBody
from nonstop.server.translate import Limits, parse_body

SHAPES = "give a string, a list of strings, a list of token ids or a list of token-id lists"


@pytest.mark.parametrize(
    "prompt",
    [[[1, 2], [3, True]], [[1, 2], "ab"], [[1, 2], [0.5]], ["ab", [1, 2]]],
)
def test_a_list_mixing_token_id_lists_with_other_items_is_refused_with_the_shapes_allowed(prompt):
    """A list of prompts must be all strings or all token-id lists: one good id list among bad items is not
    enough. Catches the per-item check weakened from all() to any() (the client would get pydantic's message
    about one union member instead of the prompt shapes)."""
    raw = json.dumps({"model": "m", "prompt": prompt}).encode()
    with pytest.raises(APIError) as info:
        parse_body(raw, CompletionBody, Limits(max_len=64))
    assert info.value.status == 400
    assert info.value.param == "prompt"
    assert info.value.message == f"prompt: {SHAPES}"


def test_a_list_of_token_id_lists_is_accepted():
    body = parse_body(json.dumps({"model": "m", "prompt": [[1, 2], [3]]}).encode(), CompletionBody, Limits(max_len=64))
    assert body.prompt == [[1, 2], [3]]
