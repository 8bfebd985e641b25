"""OpenAI response objects: completions and chat completions, whole or as stream chunks.

``Choice`` accumulates one request's events (text, tokens, logprobs); the builders turn choices into
``text_completion`` / ``chat.completion`` bodies or ``*.chunk`` deltas, with ``usage`` counted from
token ids (completion tokens include a generated end-of-sequence token, as OpenAI counts them).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.loop import StreamEvent
from nonstop.engine.tokenizer import Tokenizer


def sse(payload: dict | str) -> str:
    """One server-sent event: ``data: <json>`` (or a raw string such as ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's vocabulary: stop | length (abort and error end the response another way)."""
    return reason if reason in (None, "stop", "length") else "stop"


class TextOffsets:
    """A completion's ``text_offset``: where each token's text starts in the returned text. The tokens are
    decoded as the text was (``IncrementalDecoder``): a token inside a UTF-8 character adds nothing until
    the character completes, a special token adds nothing. ``start``: where the first token's text
    starts (after an echoed prompt's text). A stream keeps one per choice across its chunks. A stop string
    cuts the text, not the tokens (as vLLM): the logprobs still list every token generated (as
    ``completion_tokens`` counts them), so the offsets of the tokens holding the stop string reach the end
    of the returned text or past it."""

    def __init__(self, tokenizer: Tokenizer, start: int = 0):
        self.decoder = IncrementalDecoder(tokenizer)
        self.position = start

    def take(self, token_ids: list[int]) -> list[int]:
        out = []
        for t in token_ids:
            out.append(self.position)
            self.position += len(self.decoder.push(t))
        return out


@dataclass
class Choice:
    """What one request has produced so far. ``counts_prompt``: its prompt's tokens count in ``usage``
    (false for the 2nd..n-th completion of one prompt); ``keep_output`` false: what it generates is left
    out (an echo-only completion, ``max_tokens`` 0)."""

    index: int
    counts_prompt: bool = True
    keep_output: bool = True
    prompt_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    pieces: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add(self, event: StreamEvent) -> StreamEvent:
        """Record ``event``; returns it as the client sees it (without output when not kept)."""
        self.prompt_ids = event.request.prompt_ids
        self.prompt_tokens = len(self.prompt_ids)
        self.prompt_logprobs = event.request.prompt_logprobs
        if not self.keep_output:
            event = dataclasses.replace(event, text="", token_ids=[], logprobs=None)
        if event.text:
            self.pieces.append(event.text)
        self.token_ids += event.token_ids
        self.logprobs += event.logprobs or []
        if event.finished:
            self.finish_reason = event.finish_reason
            self.error = event.error
        return event

    def prompt_rows(self) -> tuple[list[int], list[dict[int, float] | None]]:
        """The prompt's tokens and their logprob rows (None for the first, which has no context)."""
        rows = self.prompt_logprobs or []
        return self.prompt_ids, list(rows) + [None] * (len(self.prompt_ids) - len(rows))


def usage(choices: list[Choice]) -> dict:
    prompt = sum(c.prompt_tokens for c in choices if c.counts_prompt)
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ResponseBuilder:
    """Builds one HTTP call's bodies. kind: ``completion`` or ``chat``; top_logprobs: None = no logprobs."""

    def __init__(self, kind: str, model: str, tokenizer: Tokenizer, top_logprobs: int | None, request_id: str):
        self.kind = kind
        self.model = model
        self.tokenizer = tokenizer
        self.top_logprobs = top_logprobs
        self.id = request_id
        self.created = int(time.time())

    # ------------------------------------------------------------------ logprobs
    def _top(self, row: dict[int, float], actual: int | None = None) -> list[tuple[int, float]]:
        """The row's best ``top_logprobs`` (token id, logprob); with ``actual``, that token too when it is
        not among them (completions, as vLLM: up to logprobs + 1 entries)."""
        best = sorted(row.items(), key=lambda kv: -kv[1])[: self.top_logprobs]
        if actual is not None and all(t != actual for t, _ in best):
            best.append((actual, row[actual]))
        return best

    def _bytes(self, token_id: int) -> list[int]:
        """The token's bytes: its own where the tokenizer says them; none for an id the tokenizer has no text
        for (``decode`` leaves it out and it has no special name); else its listed text's."""
        tok = self.tokenizer
        raw = tok.token_bytes(token_id)
        if raw is None and tok.left_out(token_id) and tok.special_name(token_id) is None:
            return []
        return list(raw if raw is not None else tok.token_text(token_id).encode())

    def logprobs(
        self, token_ids: list[int], rows: list[dict[int, float] | None], offsets: TextOffsets | None = None
    ) -> dict | None:
        """The ``logprobs`` field for these tokens (completions: parallel lists; chat: ``content``). A row
        of None (an echoed prompt's first token) has no logprob. Tokens show as ``Tokenizer.token_text``
        (a special one by its name, part of a character as ``bytes:\\x..``); ``text_offset`` comes from
        ``offsets`` (a fresh one from 0 when None)."""
        if self.top_logprobs is None:
            return None
        text = self.tokenizer.token_text
        if self.kind == "chat":
            return {
                "content": [
                    {
                        "token": text(t),
                        "logprob": row[t],
                        "bytes": self._bytes(t),
                        "top_logprobs": [
                            {"token": text(a), "logprob": lp, "bytes": self._bytes(a)} for a, lp in self._top(row)
                        ],
                    }
                    for t, row in zip(token_ids, rows)
                ]
            }
        offsets = offsets or TextOffsets(self.tokenizer)
        return {
            "tokens": [text(t) for t in token_ids],
            "token_logprobs": [None if row is None else row[t] for t, row in zip(token_ids, rows)],
            "top_logprobs": [
                None if row is None else {text(a): lp for a, lp in self._top(row, t)} for t, row in zip(token_ids, rows)
            ],
            "text_offset": offsets.take(token_ids),
        }

    def completion_logprobs(
        self, c: Choice, generated: list[int], rows: list, offsets: TextOffsets, echo: bool
    ) -> dict | None:
        """A completion choice's ``logprobs``: with ``echo`` the prompt's tokens lead, their text decoded on
        its own from offset 0 (as the echoed text is); the generated tokens' offsets come from ``offsets``."""
        generated_part = self.logprobs(generated, rows, offsets)
        if not (echo and generated_part is not None):
            return generated_part
        ids, prompt_rows = c.prompt_rows()
        prompt_part = self.logprobs(ids, prompt_rows, TextOffsets(self.tokenizer))
        return {key: prompt_part[key] + generated_part[key] for key in prompt_part}

    # ------------------------------------------------------------------ whole responses
    def body(self, choices: list[Choice], echo_texts: list[str] | None = None) -> dict:
        if self.kind == "chat":
            items = [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": self.logprobs(c.token_ids, c.logprobs),
                    "finish_reason": finish_reason(c.finish_reason),
                }
                for c in choices
            ]
            obj = "chat.completion"
        else:
            items = []
            for c in choices:
                echo = echo_texts[c.index] if echo_texts else ""
                items.append(
                    {
                        "index": c.index,
                        "text": echo + c.text,
                        "logprobs": self.completion_logprobs(
                            c, c.token_ids, c.logprobs, TextOffsets(self.tokenizer, len(echo)), bool(echo_texts)
                        ),
                        "finish_reason": finish_reason(c.finish_reason),
                    }
                )
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": items,
            "usage": usage(choices),
        }

    # ------------------------------------------------------------------ stream chunks
    def chunk(self, choice_fields: list[dict], usage_fields: dict | None = None) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choice_fields}
        if usage_fields is not None:
            out["usage"] = usage_fields
        return out

    def role_chunk(self, index: int) -> dict:
        """Chat streams open each choice with the assistant role."""
        return self.chunk(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
        )

    def delta_chunk(
        self,
        index: int,
        event: StreamEvent,
        offsets: TextOffsets | None = None,
        echo: str | None = None,
        choice: Choice | None = None,
    ) -> dict | None:
        """The chunk for one event (None when it carries nothing to send). ``offsets``: the choice's
        ``TextOffsets``, kept across its chunks. ``echo``: a completion's prompt text, sent ahead of the
        event's text with the prompt's logprobs (``choice``'s) when asked."""
        text = (echo or "") + event.text
        reason = finish_reason(event.finish_reason)
        if not text and not event.token_ids and reason is None:
            return None
        if echo is not None and self.top_logprobs is not None:
            logprobs = self.completion_logprobs(choice, event.token_ids, event.logprobs or [], offsets, True)
        elif event.token_ids:
            logprobs = self.logprobs(event.token_ids, event.logprobs or [], offsets)
        else:
            logprobs = None
        if self.kind == "chat":
            delta = {"content": text} if text or reason is None else {}
            return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}])
        return self.chunk([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}])
