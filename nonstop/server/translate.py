"""Request bodies -> engine ``Request`` objects, with every check a client can fail (400/404/413).

Checks: the body is a JSON object under the size limit, its fields have the right types and ranges
(``protocol``), the model is one we serve, the prompt is not empty and fits the context, and
max_tokens is >= 1 and fits what is left of the context (when absent: 16 for completions, the rest
of the context for chat, as OpenAI does).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from nonstop.engine.llm import LLM
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.server.chat import ChatTemplateError, render_chat
from nonstop.server.errors import APIError, bad_request
from nonstop.server.protocol import ChatCompletionBody, CompletionBody, SamplingFields

COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclass
class Limits:
    """What one HTTP call may ask for."""

    max_len: int  # context length: prompt + generated tokens
    max_body_bytes: int = 1 << 20
    max_prompts: int = 16


def parse_body(raw: bytes, model: type[BaseModel], limits: Limits) -> BaseModel:
    """Raw request bytes -> a validated body (413 when too large, 400 when malformed or invalid)."""
    if len(raw) > limits.max_body_bytes:
        raise APIError(413, f"request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}", code="request_too_large")
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request("request body must be a JSON object")
    try:
        body = model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise bad_request(f"{where}: {first['msg']}", param=where, code="invalid_value") from None
    for param, why in body.unsupported():
        raise bad_request(why, param=param, code="unsupported_parameter")
    return body


def check_model(name: str, served: list[str]) -> None:
    if name not in served:
        raise APIError(404, f"the model {name!r} does not exist; this server serves: {', '.join(served)}", param="model", code="model_not_found")


def resolve_max_tokens(requested: int | None, prompt_len: int, limits: Limits, default: int | None, param: str) -> int:
    """max_tokens to generate, or a 400 that says why not."""
    room = limits.max_len - prompt_len
    if room < 1:
        raise bad_request(f"this model's maximum context length is {limits.max_len} tokens, and the prompt has {prompt_len}: shorten it", param="prompt" if param == "max_tokens" else "messages", code="context_length_exceeded")
    if requested is None:
        return room if default is None else min(default, room)
    if requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}", param=param, code="invalid_value")
    if requested > room:
        raise bad_request(f"this model's maximum context length is {limits.max_len} tokens; you asked for {prompt_len + requested} ({prompt_len} in the prompt, {requested} to generate)", param=param, code="context_length_exceeded")
    return requested


def sampling_params(body: SamplingFields, max_tokens: int, logprobs: int | None) -> SamplingParams:
    try:
        return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=body.stop, stop_token_ids=body.stop_token_ids, logprobs=logprobs, ignore_eos=body.ignore_eos)
    except ValueError as exc:
        raise bad_request(str(exc), code="invalid_value") from None


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _prompt_list(prompt) -> list[str | list[int]]:
    """The body's ``prompt`` as a list of prompts (each text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def completion_requests(body: CompletionBody, llm: LLM, limits: Limits, call_id: str) -> tuple[list[Request], list[str]]:
    """One engine request per prompt, and each prompt's text (for ``echo``)."""
    prompts = _prompt_list(body.prompt)
    if not prompts:
        raise bad_request("prompt is empty: give a string, a list of strings or token ids", param="prompt", code="empty_prompt")
    if len(prompts) > limits.max_prompts:
        raise bad_request(f"{len(prompts)} prompts in one request; the limit is {limits.max_prompts}", param="prompt")
    requests, echoes = [], []
    for i, p in enumerate(prompts):
        text = p if isinstance(p, str) else None
        try:
            ids = llm.tokenizer.encode(text) if text is not None else list(p)
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from None
        if not ids or text == "":
            raise bad_request("prompt is empty: give at least one character or token", param="prompt", code="empty_prompt")
        n = resolve_max_tokens(body.max_tokens, len(ids), limits, COMPLETION_DEFAULT_MAX_TOKENS, "max_tokens")
        try:
            req = llm.make_request(text, ids, sampling_params(body, n, body.logprobs), request_id=f"{call_id}-{i}")
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from None
        requests.append(req)
        echoes.append(text if text is not None else llm.tokenizer.decode(ids))
    return requests, echoes


def _template(tok) -> str | None:
    """The tokenizer's chat template: a string, or the ``default`` entry of a list of named ones."""
    t = tok.chat_template
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) and t else None


def chat_request(body: ChatCompletionBody, llm: LLM, limits: Limits, call_id: str) -> Request:
    if not body.messages:
        raise bad_request("messages is empty: give at least one message", param="messages", code="empty_prompt")
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in body.messages]
    tok = llm.tokenizer
    template = _template(tok)
    try:
        text = render_chat(messages, template, getattr(tok, "config", None))
        ids = tok.encode(text, add_special_tokens=template is None)
    except (ChatTemplateError, ValueError) as exc:
        raise bad_request(str(exc), param="messages") from None
    if not ids:
        raise bad_request("the conversation renders to an empty prompt", param="messages", code="empty_prompt")
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    n = resolve_max_tokens(requested, len(ids), limits, None, param)
    top = (body.top_logprobs or 0) if body.logprobs else None
    return llm.make_request(None, ids, sampling_params(body, n, top), request_id=f"{call_id}-0")
