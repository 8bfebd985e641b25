"""OpenAI response objects: completions and chat completions, whole or as stream chunks.

``Choice`` accumulates one request's events (text, tokens, logprobs); the builders turn choices into
``text_completion`` / ``chat.completion`` bodies or ``*.chunk`` deltas, with ``usage`` counted from
token ids (completion tokens include a generated end-of-sequence token, as OpenAI counts them).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from nonstop.engine.loop import StreamEvent
from nonstop.engine.tokenizer import Tokenizer


def sse(payload: dict | str) -> str:
    """One server-sent event: ``data: <json>`` (or a raw string such as ``[DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's vocabulary: stop | length (abort and error end the response another way)."""
    return reason if reason in (None, "stop", "length") else "stop"


@dataclass
class Choice:
    """What one request has produced so far. ``counts_prompt``: its prompt's tokens count in ``usage``
    (false for the 2nd..n-th completion of one prompt)."""

    index: int
    counts_prompt: bool = True
    prompt_tokens: int = 0
    pieces: list[str] = field(default_factory=list)
    length: int = 0  # characters of text
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add(self, event: StreamEvent) -> None:
        self.prompt_tokens = len(event.request.prompt_ids)
        if event.text:
            self.pieces.append(event.text)
            self.length += len(event.text)
        self.token_ids += event.token_ids
        self.logprobs += event.logprobs or []
        if event.finished:
            self.finish_reason = event.finish_reason
            self.error = event.error


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
    def _top(self, row: dict[int, float]) -> list[tuple[str, float]]:
        best = sorted(row.items(), key=lambda kv: -kv[1])[: self.top_logprobs]
        return [(self.tokenizer.token_text(t), lp) for t, lp in best]

    def logprobs(self, token_ids: list[int], rows: list[dict[int, float]], offset: int = 0) -> dict | None:
        """The ``logprobs`` field for these tokens (completions: parallel lists; chat: ``content``)."""
        if self.top_logprobs is None:
            return None
        texts = [self.tokenizer.token_text(t) for t in token_ids]
        if self.kind == "chat":
            return {
                "content": [
                    {
                        "token": s,
                        "logprob": row[t],
                        "bytes": list(s.encode()),
                        "top_logprobs": [
                            {"token": a, "logprob": lp, "bytes": list(a.encode())} for a, lp in self._top(row)
                        ],
                    }
                    for s, t, row in zip(texts, token_ids, rows)
                ]
            }
        offsets, pos = [], offset
        for s in texts:
            offsets.append(pos)
            pos += len(s)
        return {
            "tokens": texts,
            "token_logprobs": [row[t] for t, row in zip(token_ids, rows)],
            "top_logprobs": [dict(self._top(row)) for row in rows],
            "text_offset": offsets,
        }

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
                        "logprobs": self.logprobs(c.token_ids, c.logprobs, len(echo)),
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

    def delta_chunk(self, index: int, event: StreamEvent, text_offset: int = 0, prefix: str = "") -> dict | None:
        """The chunk for one event (None when it carries nothing to send)."""
        text = prefix + event.text
        reason = finish_reason(event.finish_reason)
        if not text and not event.token_ids and reason is None:
            return None
        logprobs = self.logprobs(event.token_ids, event.logprobs or [], text_offset) if event.token_ids else None
        if self.kind == "chat":
            delta = {"content": text} if text or reason is None else {}
            return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}])
        return self.chunk([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}])
