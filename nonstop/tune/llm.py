"""The ``llm`` proposer: any OpenAI-compatible chat endpoint (``POST {base_url}/chat/completions``).

``--llm-base-url`` (e.g. ``https://api.openai.com/v1``, a vLLM/SGLang server, or ``nonstop serve``'s own
``http://127.0.0.1:8000/v1``), ``--llm-model``, and the API key from the environment variable named by
``--llm-api-key-env`` (default ``OPENAI_API_KEY``; no key: no Authorization header). Each round sends
``n`` independent requests with the same prompt (``prompt.build_prompt``: it carries the previous
round's verifier messages) at the given temperature; the file is the fenced Python block of each
reply (``candidate.extract_code``). An endpoint that refuses the prompt as too long for its context
gets the compact prompt (without the current kernel's source) from then on. A reply that fails (an
HTTP error, a body cut short, not UTF-8, not JSON, not a chat completion, a timeout) is one candidate "not
produced"; an endpoint that stops answering after it has answered ends the rounds (``stopped``) and the loop
keeps what was verified; one that never answers (unreachable, or no reply to the first request within the
timeout) is an ``EndpointError``. The timeout (``--llm-timeout-s``) bounds a whole reply, not each read: an
endpoint that trickles bytes is cut off too. Standard library only (``urllib``).
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

from nonstop.tune.candidate import Candidate, RoundContext, extract_code
from nonstop.tune.prompt import build_prompt


class EndpointError(ValueError):
    """The endpoint cannot be used at all (unreachable, refused the key, unknown model): one clear line."""


class ContextTooLong(RuntimeError):
    """The endpoint refused the prompt as longer than its context (HTTP 400)."""


def _is_http_url(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host (and, if it names one, a port in 0..65535)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or past 65535
    except ValueError:  # also "http://[::1" (an unclosed IPv6 host)
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


class LLMProposer:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.7,
        max_tokens: int = 8192,
        timeout_s: float = 600.0,
    ):
        if not base_url:
            raise ValueError(
                "--llm-base-url is required with --proposer llm (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1)"
            )
        if not _is_http_url(base_url):
            raise ValueError(
                f"--llm-base-url {base_url!r} is no http(s) URL with a host (e.g. http://127.0.0.1:8000/v1)"
            )
        if not model:
            raise ValueError("--llm-model is required with --proposer llm")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.key = os.environ.get(api_key_env) if api_key_env else None
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.name = f"llm:{model}"
        self.prompts: list[str] = []  # the user messages sent (for reports and tests)
        self.compact = False  # set when the endpoint's context is too short for the full prompt
        self.answered = 0  # replies received so far
        self.stopped: str | None = None  # why no more rounds: the endpoint stopped answering

    def ask(self, system: str, user: str) -> str:
        """The content of one chat completion; ``EndpointError`` when the endpoint cannot be used at all,
        ``ContextTooLong``, or ``RuntimeError`` / ``OSError`` for one failed reply."""
        body = json.dumps(
            {
                "model": self.model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        deadline = time.monotonic() + self.timeout_s
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = _read_by(response, deadline, self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            if exc.code in (401, 403, 404):
                raise EndpointError(f"{self.url} answered HTTP {exc.code}: {detail}") from None
            if exc.code == 400 and "context" in detail.lower():
                raise ContextTooLong(detail) from None
            raise RuntimeError(f"HTTP {exc.code}: {detail}") from None
        except urllib.error.URLError as exc:
            raise EndpointError(f"cannot reach {self.url}: {exc.reason}") from None
        except http.client.HTTPException as exc:  # IncompleteRead, a bad status line ...
            raise RuntimeError(f"the reply was cut short or malformed ({type(exc).__name__}: {exc})") from None
        return completion_content(raw)

    def propose(self, context: RoundContext, n: int) -> list[Candidate]:
        """Up to ``n`` candidates, one request each. A failed reply is a candidate "not produced"; an endpoint
        that stops answering after it has answered before ends the round and sets ``stopped`` (the loop then
        ends its rounds, keeping what was verified); one that never answered raises ``EndpointError``."""
        prompt = functools.cache(lambda compact: build_prompt(context, compact=compact))
        out = []
        for i in range(n):
            cid = f"r{context.round}c{i + 1}"
            try:
                reply = self._reply(prompt)
            except EndpointError as exc:
                if not self.answered:
                    raise
                self.stopped = f"the endpoint stopped answering ({exc})"
                out.append(Candidate(cid, "", self.name, error=self.stopped))
                break
            except (RuntimeError, OSError) as exc:  # OSError: timeouts, resets
                if isinstance(exc, TimeoutError) and not self.answered:  # it has never answered in time
                    raise EndpointError(f"{self.url} sent no reply ({exc})") from None
                out.append(Candidate(cid, "", self.name, error=f"the endpoint failed: {exc}"[:300]))
                continue
            self.answered += 1
            out.append(Candidate(cid, extract_code(reply), self.name))
        return out

    def _reply(self, prompt) -> str:
        """One reply to ``prompt(compact)``; an endpoint that refuses the full prompt as too long for its
        context gets the compact one, from then on."""
        system, user = prompt(self.compact)
        self.prompts.append(user)
        try:
            return self.ask(system, user)
        except ContextTooLong:
            if self.compact:
                raise RuntimeError("the prompt is longer than the endpoint's context, even compact") from None
        self.compact = True  # once: drop the current kernel's source from the prompt
        system, user = prompt(True)
        self.prompts[-1] = user
        return self.ask(system, user)


def _read_by(response, deadline: float, timeout_s: float) -> bytes:
    """The body of ``response``, read as it arrives; ``TimeoutError`` once ``deadline`` (``time.monotonic``)
    passes before it is complete (each wait for bytes is also bounded by the socket's timeout),
    ``http.client.IncompleteRead`` when it ends short of its Content-Length."""
    chunks = []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the reply was not complete within {timeout_s:g} s")
        chunk = response.read1(1 << 16)
        if not chunk:
            body, left = b"".join(chunks), getattr(response, "length", None)
            if left:  # read1 ends quietly where read raises
                raise http.client.IncompleteRead(body, left)
            return body
        chunks.append(chunk)


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """The start of an HTTP error's body (what the endpoint said), or what stopped it from being read (a body
    cut short, a reset, a timeout)."""
    try:
        return exc.read().decode(errors="replace")[:300]
    except (http.client.HTTPException, OSError) as err:
        return f"(its body could not be read: {type(err).__name__})"


def completion_content(raw: bytes) -> str:
    """The message content of a chat completion's body; ``RuntimeError`` (one line) when it is none."""
    try:
        data = json.loads(raw.decode())
        content = data["choices"][0]["message"]["content"]
    except UnicodeDecodeError:
        raise RuntimeError("the reply is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"the reply is not JSON ({exc})") from None
    except (KeyError, IndexError, TypeError):
        raise RuntimeError(f"not a chat completion: {raw[:300].decode(errors='replace')}") from None
    if content is not None and not isinstance(content, str):
        raise RuntimeError(f"not a chat completion: the message content is {type(content).__name__}, not text")
    return content or ""
