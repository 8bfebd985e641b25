"""ResponseBuilder / Choice / usage details a mutation audit found untested. A byte tokenizer makes every
expected value countable by hand (token id = UTF-8 byte; text offsets = byte counts of ASCII text)."""

from __future__ import annotations

from types import SimpleNamespace

from nonstop.engine.loop import StreamEvent
from nonstop.engine.tokenizer import ByteTokenizer
from nonstop.server.responses import Choice, ResponseBuilder, finish_reason, usage

TOK = ByteTokenizer(320)


def _event(text="", ids=(), rows=None, reason=None, prompt=(104, 105), prompt_logprobs=None, error=None):
    request = SimpleNamespace(prompt_ids=list(prompt), prompt_logprobs=prompt_logprobs)
    return StreamEvent(request, text, list(ids), rows, reason, error)


def test_abort_and_error_read_as_stop_in_openais_vocabulary():
    assert [finish_reason(r) for r in (None, "stop", "length", "abort", "error")] == [
        None,
        "stop",
        "length",
        "stop",
        "stop",
    ]


def test_chat_top_logprobs_hold_exactly_the_best_k_even_when_the_chosen_token_is_not_among_them():
    # OpenAI's chat top_logprobs list has top_logprobs entries; only completions add the chosen token (vLLM)
    row = {ord("a"): -0.1, ord("b"): -0.5, ord("c"): -3.0}
    chat = ResponseBuilder("chat", "m", TOK, 1, "x").logprobs([ord("c")], [row])["content"][0]
    assert chat["token"] == "c" and chat["logprob"] == -3.0 and chat["bytes"] == [99]
    assert [t["token"] for t in chat["top_logprobs"]] == ["a"]
    comp = ResponseBuilder("completion", "m", TOK, 1, "x").logprobs([ord("c")], [row])
    assert comp["top_logprobs"] == [{"a": -0.1, "c": -3.0}]
    assert comp["token_logprobs"] == [-3.0] and comp["tokens"] == ["c"]


def test_logprobs_0_still_lists_the_chosen_tokens():
    row = {ord("a"): -0.1, ord("b"): -0.5}
    comp = ResponseBuilder("completion", "m", TOK, 0, "x").logprobs([ord("b")], [row])
    assert comp["top_logprobs"] == [{"b": -0.5}] and comp["token_logprobs"] == [-0.5]
    chat = ResponseBuilder("chat", "m", TOK, 0, "x").logprobs([ord("b")], [row])
    assert chat["content"][0]["top_logprobs"] == [] and chat["content"][0]["logprob"] == -0.5


def test_usage_counts_each_prompt_once_and_every_generated_token():
    choices = [Choice(i, counts_prompt=i % 2 == 0) for i in range(4)]
    for i, c in enumerate(choices):
        c.add(_event("x" * (i + 1), [120] * (i + 1), reason="length", prompt=[1] * (3 if i < 2 else 5)))
    # prompts: 3 (choices 0, 1) + 5 (choices 2, 3); completions 1 + 2 + 3 + 4
    assert usage(choices) == {"prompt_tokens": 8, "completion_tokens": 10, "total_tokens": 18}


def test_choice_accumulates_tokens_and_logprobs_over_events_and_keeps_the_error():
    c = Choice(0)
    c.add(_event("a", [97], [{97: -1.0}]))
    c.add(_event("bc", [98, 99], [{98: -2.0}, {99: -3.0}]))
    c.add(_event("", [], None, reason="error", error="boom"))
    assert c.text == "abc" and c.token_ids == [97, 98, 99]
    assert c.logprobs == [{97: -1.0}, {98: -2.0}, {99: -3.0}]
    assert (c.finish_reason, c.error) == ("error", "boom")
    assert c.prompt_tokens == 2


def test_an_echo_only_choice_keeps_nothing_it_generates():
    c = Choice(0, keep_output=False)
    seen = c.add(_event("zz", [122, 122], [{122: -1.0}] * 2, reason="length"))
    assert (seen.text, seen.token_ids, seen.logprobs) == ("", [], None)
    assert c.text == "" and c.token_ids == [] and usage([c])["completion_tokens"] == 0


def test_echoed_completion_offsets_start_after_the_prompt_text():
    b = ResponseBuilder("completion", "m", TOK, 1, "x")
    c = Choice(0)
    rows = [{ord("y"): -1.0}, {ord("o"): -2.0}]
    c.add(
        _event(
            "yo",
            [ord("y"), ord("o")],
            rows,
            reason="length",
            prompt=[ord("h"), ord("i")],
            prompt_logprobs=[None, {105: -4.0}],
        )
    )
    out = b.body([c], ["hi"])["choices"][0]
    assert out["text"] == "hiyo"
    lp = out["logprobs"]
    assert lp["tokens"] == ["h", "i", "y", "o"]
    assert lp["text_offset"] == [0, 1, 2, 3]
    assert lp["token_logprobs"] == [None, -4.0, -1.0, -2.0]
    assert lp["top_logprobs"][0] is None


def test_a_chat_chunk_for_held_back_tokens_has_empty_content_and_no_logprobs_without_tokens():
    b = ResponseBuilder("chat", "m", TOK, 1, "x")
    held = b.delta_chunk(0, _event("", [97], [{97: -1.0}]))["choices"][0]
    assert held["delta"] == {"content": ""} and held["finish_reason"] is None
    assert [e["token"] for e in held["logprobs"]["content"]] == ["a"]
    last = b.delta_chunk(0, _event("", [], None, reason="stop"))["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop" and last["logprobs"] is None
    assert b.delta_chunk(0, _event("", [], None)) is None
    assert b.role_chunk(3)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert b.chunk([])["object"] == "chat.completion.chunk"


def test_text_offsets_count_characters_not_tokens():
    # "é" is two byte tokens: the first adds no character until the second completes it; then "x"
    b = ResponseBuilder("completion", "m", TOK, 0, "x")
    ids = list("éx".encode())
    lp = b.logprobs(ids, [{i: -1.0} for i in ids])
    assert lp["text_offset"] == [0, 0, 1]
    assert lp["tokens"] == ["bytes:\\xc3", "bytes:\\xa9", "x"]


def test_chat_bytes_are_the_tokens_own_bytes_even_inside_a_character():
    b = ResponseBuilder("chat", "m", TOK, 1, "x")
    entry = b.logprobs([0xC3], [{0xC3: -0.5}])["content"][0]
    assert entry["token"] == "bytes:\\xc3" and entry["bytes"] == [0xC3]
    assert entry["top_logprobs"][0]["bytes"] == [0xC3]


def test_a_whole_body_counts_usage_over_every_choice():
    choices = [Choice(i, counts_prompt=i == 0) for i in range(2)]
    for c in choices:
        c.add(_event("ab", [97, 98], reason="length", prompt=[1, 2, 3]))
    for kind in ("chat", "completion"):
        body = ResponseBuilder(kind, "m", TOK, None, "x").body(choices)
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert [c["index"] for c in body["choices"]] == [0, 1]
