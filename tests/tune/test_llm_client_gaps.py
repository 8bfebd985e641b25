"""The ``llm`` proposer's client (``nonstop/tune/llm.py``) and what proposers share
(``nonstop/tune/candidate.py``), with ``urllib.request.urlopen`` and the prompt replaced by fakes: no
network, no model, no kernel."""

from __future__ import annotations

import http.client
import io
import json
import urllib.error

import pytest

import nonstop.tune.llm as llm
from nonstop.tune.candidate import Candidate, Outcome, extract_code


def _completion(content) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class _Reply:
    def __init__(self, body: bytes):
        self.body = body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read1(self, n: int) -> bytes:
        """As http.client.HTTPResponse.read1: up to ``n`` bytes of what has arrived, b"" at the end."""
        if isinstance(self.body, Exception):
            raise self.body
        chunk, self.body = self.body[:n], self.body[n:]
        return chunk


def _http_error(code: int, detail: str) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://x", code, "err", {}, io.BytesIO(detail.encode()))


@pytest.fixture
def endpoint(monkeypatch):
    """A fake endpoint: ``replies`` is a list of bodies (bytes) or exceptions, served in order; ``sent``
    the requests it saw."""
    state = {"replies": [], "sent": []}

    def urlopen(request, timeout=None):
        state["sent"].append(request)
        reply = state["replies"].pop(0)
        if isinstance(reply, urllib.error.URLError):
            raise reply
        return _Reply(reply)

    monkeypatch.setattr(llm.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(llm, "build_prompt", lambda context, compact=False: ("SYS", "short" if compact else "full"))
    return state


def _context(round_=1):
    from types import SimpleNamespace

    return SimpleNamespace(round=round_)


def test_request_url_body_and_key(endpoint, monkeypatch):
    """POST {base_url without its trailing slash}/chat/completions with the model, both messages, the
    temperature and max_tokens given, and "Bearer KEY" from the named variable."""
    monkeypatch.setenv("MY_KEY", "sekrit")
    p = llm.LLMProposer("http://h:1/v1/", "m1", "MY_KEY", temperature=0.25, max_tokens=77)
    endpoint["replies"] = [_completion("x")]
    assert p.ask("S", "U") == "x"
    (req,) = endpoint["sent"]
    assert req.full_url == "http://h:1/v1/chat/completions" and req.get_method() == "POST"
    body = json.loads(req.data)
    assert body == {
        "model": "m1",
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        "temperature": 0.25,
        "max_tokens": 77,
    }
    assert req.get_header("Authorization") == "Bearer sekrit"


def test_no_key_no_authorization_header(endpoint, monkeypatch):
    """An unset key variable (or none named) sends no Authorization header."""
    monkeypatch.delenv("MY_KEY", raising=False)
    for env in ("MY_KEY", ""):
        p = llm.LLMProposer("http://h/v1", "m", env)
        endpoint["replies"] = [_completion("x")]
        p.ask("S", "U")
        assert endpoint["sent"][-1].get_header("Authorization") is None


@pytest.mark.parametrize(
    "code, detail, error",
    [
        (401, "bad key", llm.EndpointError),
        (403, "forbidden", llm.EndpointError),
        (404, "no such model", llm.EndpointError),
        (400, "This model's maximum Context length is 8192 tokens", llm.ContextTooLong),
        (400, "bad temperature", RuntimeError),
        (500, "busy", RuntimeError),
    ],
)
def test_http_errors_are_classified(endpoint, code, detail, error):
    """401/403/404: the endpoint cannot be used; 400 naming the context (any case): too long; else one
    failed reply (a RuntimeError, not an EndpointError)."""
    endpoint["replies"] = [_http_error(code, detail)]
    with pytest.raises(error) as info:
        llm.LLMProposer("http://h/v1", "m").ask("S", "U")
    if error is RuntimeError:
        assert not isinstance(info.value, (llm.EndpointError, llm.ContextTooLong))


def test_a_reply_cut_short_is_one_failed_candidate(endpoint):
    """An IncompleteRead while reading is a RuntimeError (one candidate not produced), not a crash."""
    endpoint["replies"] = [http.client.IncompleteRead(b"{", 100), _completion("```python\nB\n```")]
    p = llm.LLMProposer("http://h/v1", "m")
    first, second = p.propose(_context(), 2)
    assert first.error and "cut short" in first.error and first.source == ""
    assert second.error is None and second.source == "B\n" and p.answered == 1


def test_an_endpoint_that_stops_answering_ends_the_round(endpoint):
    """After one answer, a 404 sets ``stopped`` and ends the round (no third request); never answered,
    it is an EndpointError."""
    endpoint["replies"] = [_completion("A"), _http_error(404, "gone"), _completion("C")]
    p = llm.LLMProposer("http://h/v1", "m")
    out = p.propose(_context(2), 3)
    assert [c.id for c in out] == ["r2c1", "r2c2"] and out[1].error == p.stopped
    assert p.stopped and "stopped answering" in p.stopped
    assert len(endpoint["sent"]) == 2
    fresh = llm.LLMProposer("http://h/v1", "m")
    endpoint["replies"] = [_http_error(404, "gone")]
    with pytest.raises(llm.EndpointError):
        fresh.propose(_context(), 1)


def test_context_too_long_falls_back_to_the_compact_prompt_once(endpoint):
    """A 400 about the context: the same candidate is asked again with the compact prompt, which is kept
    from then on (one prompt recorded per candidate); too long even compact: one failed candidate."""
    too_long = _http_error(400, "context length exceeded")
    endpoint["replies"] = [too_long, _completion("A"), _completion("B"), _http_error(400, "context too long")]
    p = llm.LLMProposer("http://h/v1", "m")
    out = p.propose(_context(), 3)
    assert [json.loads(r.data)["messages"][1]["content"] for r in endpoint["sent"]] == [
        "full",
        "short",
        "short",
        "short",
    ]
    assert p.compact and p.prompts == ["short", "short", "short"]
    assert [c.source for c in out[:2]] == ["A\n", "B\n"]
    assert out[2].error and "even compact" in out[2].error


@pytest.mark.parametrize("content, text", [(None, ""), ("hi", "hi")])
def test_completion_content(content, text):
    """A null content is an empty reply; text is returned as it is."""
    assert llm.completion_content(_completion(content)) == text


def test_completion_content_that_is_not_text():
    """A content that is a list or number is no chat completion (one line, not a TypeError later)."""
    with pytest.raises(RuntimeError, match="not text"):
        llm.completion_content(_completion([{"type": "text", "text": "x"}]))


def test_extract_code_prefers_the_block_that_defines_launch():
    """Of two blocks, the one defining launch wins over a longer one without it; of several with launch,
    the longest; ```py fences count."""
    other = "```python\n" + "x = 1\n" * 20 + "```\n"
    mine = "```py\ndef launch(op, env):\n    pass\n```\n"
    assert extract_code(other + mine) == "def launch(op, env):\n    pass\n"
    longer = "```python\ndef launch(op, env):\n    a = 1\n    pass\n```\n"
    assert extract_code(mine + longer) == "def launch(op, env):\n    a = 1\n    pass\n"


def test_extract_code_of_a_reply_cut_off_inside_its_block():
    """A reply cut off by max_tokens inside its fence: the code after the fence, not the prose before it."""
    reply = "Here it is:\n```python\ndef launch(op, env):\n    x = 1"
    assert extract_code(reply) == "def launch(op, env):\n    x = 1\n"
    assert extract_code("no fences at all") == "no fences at all\n"


def test_outcome_messages():
    """Feedback lines: no file with its error; untimed accept; timed accept in microseconds."""
    c = Candidate("r1c1", "src", "search")
    assert Outcome(Candidate("r1c2", "", "llm:m", error="boom"), False, []).message() == "r1c2: no file (boom)"
    assert Outcome(c, False, ["a", "b"]).message() == "r1c1: REJECTED\n  - a\n  - b"
    assert Outcome(c, True, []).message() == "r1c1: ACCEPTED (verified; untimed on this machine)"
    timed = Outcome(c, True, [], timing={"B1": {"median_ms": 0.0123}})
    assert timed.message() == "r1c1: ACCEPTED, median B1: 12.3 us"


@pytest.mark.parametrize("fence", ["python3", "Python", "PY", "", "python ", "py3"])
def test_extract_code_takes_a_block_whatever_its_info_string(fence):
    """A reply fenced as ```python3 or ```Python matched no block; the fallback for a reply cut off inside its block
    then matched the closing fence and the candidate became an empty file ("\\n")."""
    reply = f"Here it is:\n```{fence}\ndef launch(op, env):\n    return 1\n```\nDone.\n"
    assert extract_code(reply) == "def launch(op, env):\n    return 1\n"


def test_extract_code_prefers_the_block_that_defines_launch_over_a_longer_one_that_calls_it():
    """Any block that merely mentioned "launch" counted as defining it, so a longer usage sketch beat the file
    (the test read ``"def launch" in b or "launch" in b``). Only a top-level ``def launch(`` counts now."""
    mine = "```python\ndef launch(op, env):\n    pass\n```\n"
    usage = "```python\n# the harness calls launch(op, env) per step:\nout = launch(op, env)\nassert out\n```\n"
    assert extract_code(mine + usage) == "def launch(op, env):\n    pass\n"
    assert extract_code(usage + mine) == "def launch(op, env):\n    pass\n"


@pytest.mark.parametrize(
    "url", ["x", "127.0.0.1:8000/v1", "http://[::1", "file:///etc/passwd#", "ftp://h/v1", "http:///v1", "http://h:abc/"]
)
def test_a_base_url_that_is_no_http_url_is_refused_when_the_proposer_is_built(url):
    """``--llm-base-url x`` was taken as given: the target was built and the first request failed with "unknown url
    type"; ``http://[::1`` gave a bare "Invalid IPv6 URL"; a ``file://`` URL read a local file as the model's
    reply. The proposer now refuses any URL that is not http(s) with a host, naming the flag."""
    with pytest.raises(ValueError, match="--llm-base-url .* is no http"):
        llm.LLMProposer(url, "m")


def test_an_http_url_with_an_ipv6_host_and_port_is_taken():
    """The check refuses no real endpoint: an IPv6 host with a port, https, a trailing slash."""
    for url in ("http://[::1]:8000/v1", "https://api.example.com/v1/", "http://localhost:30000"):
        assert llm.LLMProposer(url, "m").url.endswith("/chat/completions")


def test_a_timeout_after_an_answer_is_one_candidate_not_produced(endpoint):
    """A timeout after the endpoint has answered costs that one candidate and the round goes on: the
    timeout branch once fell through to the success path (the previous reply counted again, or a crash on
    the first). Before any answer it ends the run (EndpointError)."""
    endpoint["replies"] = [
        _completion("```python\nA\n```"),
        TimeoutError("timed out"),
        _completion("```python\nC\n```"),
    ]
    p = llm.LLMProposer("http://h/v1", "m")
    first, second, third = p.propose(_context(), 3)
    assert first.source == "A\n" and third.source == "C\n" and p.answered == 2
    assert second.source == "" and second.error and "timed out" in second.error
    endpoint["replies"] = [TimeoutError("timed out")]
    with pytest.raises(llm.EndpointError, match="sent no reply"):
        llm.LLMProposer("http://h/v1", "m").propose(_context(), 1)
