"""Request bodies -> engine ``Request`` objects, with every check a client can fail (400/404/413).

Checks: the body is strict JSON (no NaN / Infinity) under the size limit, nested at most
``MAX_DEPTH`` levels and free of lone UTF-16 surrogates (which no tokenizer can encode); its fields have
the right types and ranges (``protocol``); the model is one we serve; the prompt is not empty and fits
the context; max_tokens is >= 1 (0 with ``echo``: score the prompt) and fits what is left of the
context. When max_tokens is absent: the server's default (``--default-max-tokens``, else the
checkpoint's ``max_new_tokens``), else 16 for completions and the rest of the context for chat, as
OpenAI does. Sampling fields left out take the checkpoint's generation_config.json defaults.

These functions tokenize and render templates, so the app runs them off the event loop.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from nonstop.engine.chat_template import ChatTemplateError, chat_prompt
from nonstop.engine.llm import LLM
from nonstop.engine.requests import Request
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams
from nonstop.engine.tokenizer import lone_surrogate
from nonstop.server.errors import APIError, bad_request
from nonstop.server.protocol import ChatCompletionBody, CompletionBody, SamplingFields

COMPLETION_DEFAULT_MAX_TOKENS = 16
MAX_DEPTH = 32  # JSON nesting levels a body may have (the schema needs 6)


@dataclass
class Limits:
    """What one HTTP call may ask for."""

    max_len: int  # context length: prompt + generated tokens
    max_body_bytes: int = 1 << 20
    max_prompts: int = 16
    max_choices: int = 64  # prompts x n in one call
    default_max_tokens: int | None = None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _check_tree(obj) -> tuple[str, str] | None:
    """(problem, JSON path) for the first string with a lone surrogate or a level beyond MAX_DEPTH."""
    stack = [(obj, "body", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep", path
        if isinstance(node, dict):
            for key, value in node.items():
                if lone_surrogate(key) is not None:
                    return "a key holds a lone UTF-16 surrogate (not valid Unicode)", path
                stack.append((value, f"{path}.{key}" if path != "body" else key, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, f"{path}[{i}]", depth + 1) for i, value in enumerate(node))
        elif isinstance(node, str) and lone_surrogate(node) is not None:
            return "holds a lone UTF-16 surrogate (not valid Unicode)", path
    return None


def parse_body(raw: bytes, model: type[BaseModel], limits: Limits) -> BaseModel:
    """Raw request bytes -> a validated body (413 when too large, 400 when malformed or invalid)."""
    if len(raw) > limits.max_body_bytes:
        raise APIError(
            413, f"request body is {len(raw)} bytes; the limit is {limits.max_body_bytes}", code="request_too_large"
        )
    try:
        obj = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise bad_request(
            f"request body is nested too deeply (limit {MAX_DEPTH} levels)", code="invalid_json"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise bad_request("request body must be a JSON object")
    problem = _check_tree(obj)
    if problem:
        raise bad_request(f"{problem[1]}: {problem[0]}", param=problem[1], code="invalid_value")
    try:
        body = model.model_validate(obj)
    except ValidationError as exc:
        first = most_specific(exc.errors())
        where = field_path(first["loc"]) or "body"
        if first["type"] == "extra_forbidden":
            raise bad_request(
                f"{where}: unknown parameter (not an OpenAI field this server knows)",
                param=where,
                code="unknown_parameter",
            ) from None
        message = first["msg"].removeprefix("Value error, ")
        raise bad_request(f"{where}: {message}", param=where, code="invalid_value") from None
    for param, why in body.unsupported():
        raise bad_request(why, param=param, code="unsupported_parameter")
    return body


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _client_parts(loc) -> list:
    """A validation error's location without the union member pydantic tried (``stop.str``,
    ``prompt.list[int]``, ``content.list[TextPart]``): the keys and indices the client wrote."""

    def is_tag(p) -> bool:
        return isinstance(p, str) and (p in _TYPE_TAGS or "[" in p or p[:1].isupper() or "-" in p)

    return [p for p in loc if not is_tag(p)]


def field_path(loc) -> str:
    """A validation error's location as the client's field path, spelled as OpenAI and the tree check
    spell it: keys joined by dots, list indices in brackets (``messages[0].content[1].text``)."""
    path = ""
    for part in _client_parts(loc):
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def most_specific(errors: list[dict]) -> dict:
    """The validation error to report: the one deepest in the body (the first of those). A value that
    matches no member of a union gets an error per member; the deepest names what is wrong inside the
    member the client meant (``messages[0].content[0].text: Field required``, not "Input should be a valid
    string" from the ``str`` member of ``str | list[TextPart]``)."""
    return max(errors, key=lambda e: len(_client_parts(e["loc"])))


def check_model(name: str, served: list[str]) -> None:
    if name not in served:
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves: {', '.join(served)}",
            param="model",
            code="model_not_found",
        )


def resolve_max_tokens(
    requested: int | None, prompt_len: int, limits: Limits, default: int | None, param: str, prompt_param: str
) -> int:
    """max_tokens to generate, or a 400 that says why not. ``param`` names the request's max-tokens field,
    ``prompt_param`` its prompt field (``prompt`` or ``messages``)."""
    room = limits.max_len - prompt_len
    if room < 1:
        raise bad_request(
            f"this model's maximum context length is {limits.max_len} tokens, and the prompt has {prompt_len}: "
            "shorten it",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if requested is None:
        default = limits.default_max_tokens or default
        return room if default is None else min(default, room)
    if requested < 1:
        raise bad_request(f"{param} must be at least 1, got {requested}", param=param, code="invalid_value")
    if requested > room:
        raise bad_request(
            f"this model's maximum context length is {limits.max_len} tokens; you asked for {prompt_len + requested} "
            f"({prompt_len} in the prompt, {requested} to generate)",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def sampling_params(
    body: SamplingFields, llm: LLM, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None
) -> SamplingParams:
    """The request's sampling fields over the checkpoint's defaults; a penalty the LLM cannot apply (any, under
    speculative decoding) is refused as ``unsupported_parameter``, naming the first one asked for."""
    vocab = llm.tokenizer.vocab_size
    outside = [i for i in body.stop_token_ids or [] if i >= vocab]
    if outside:
        raise bad_request(
            f"stop_token_ids: {outside[0]} is outside the model's vocabulary of {vocab} tokens",
            param="stop_token_ids",
            code="invalid_value",
        )
    fields = {
        **llm.sampling_defaults(),  # under speculative decoding without the checkpoint's repetition penalty
        **body.sampling_overrides(),
        "max_tokens": max_tokens,
        "n": body.n,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
    }
    try:
        params = SamplingParams(**fields)
    except InvalidSamplingParam as exc:
        raise bad_request(str(exc), param=exc.param, code="invalid_value") from None
    try:
        llm.check_penalties(params)
    except InvalidSamplingParam as exc:
        raise bad_request(str(exc), param=exc.param, code="unsupported_parameter") from None
    return params


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _prompt_list(prompt) -> list[str | list[int]]:
    """The body's ``prompt`` as a list of prompts (each text or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _check_choices(prompts: int, n: int, limits: Limits) -> None:
    if prompts > limits.max_prompts:
        raise bad_request(f"{prompts} prompts in one request; the limit is {limits.max_prompts}", param="prompt")
    if prompts * n > limits.max_choices:
        raise bad_request(
            f"{prompts} prompt(s) x n={n} asks for {prompts * n} completions; the limit is {limits.max_choices}",
            param="n",
        )


def _requests(
    llm: LLM, text: str | None, ids: list[int], params: SamplingParams, request_id: str, param: str
) -> list[Request]:
    try:
        return llm.make_requests(text, ids, params, request_id=request_id)
    except ValueError as exc:  # a sampling field the engine refuses for this model is named (InvalidSamplingParam)
        raise bad_request(str(exc), param=getattr(exc, "param", param)) from None


def echo_only(body: CompletionBody) -> bool:
    """``echo`` with ``max_tokens`` 0: the prompt comes back (with its logprobs, to score it, as
    lm-evaluation-harness does) and nothing is generated."""
    return body.echo and body.max_tokens == 0


def completion_requests(
    body: CompletionBody, llm: LLM, limits: Limits, call_id: str
) -> tuple[list[Request], list[str]]:
    """``n`` engine requests per prompt (prompt-major, as OpenAI numbers choices), and each choice's
    prompt text (for ``echo``). With ``echo`` and ``logprobs`` the prompt's logprobs are computed too;
    an ``echo_only`` call runs each prompt for one token, which the response leaves out."""
    if body.max_tokens == 0 and not body.echo:
        raise bad_request(
            "max_tokens must be at least 1, got 0 (0 only with echo, to score the prompt)",
            param="max_tokens",
            code="invalid_value",
        )
    prompts = _prompt_list(body.prompt)
    if not prompts:
        raise bad_request(
            "prompt is empty: give a string, a list of strings or token ids", param="prompt", code="empty_prompt"
        )
    _check_choices(len(prompts), body.n, limits)
    requests, echoes = [], []
    for i, p in enumerate(prompts):
        text = p if isinstance(p, str) else None
        try:
            ids = llm.tokenizer.encode(text) if text is not None else list(p)
        except ValueError as exc:
            raise bad_request(str(exc), param="prompt") from None
        if not ids or text == "":
            raise bad_request(
                "prompt is empty: give at least one character or token", param="prompt", code="empty_prompt"
            )
        wanted = 1 if echo_only(body) else body.max_tokens
        n = resolve_max_tokens(wanted, len(ids), limits, COMPLETION_DEFAULT_MAX_TOKENS, "max_tokens", "prompt")
        prompt_logprobs = body.logprobs if body.echo else None
        params = sampling_params(body, llm, n, body.logprobs, prompt_logprobs)
        made = _requests(llm, text, ids, params, f"{call_id}-{i}", "prompt")
        requests += made
        echo = text if text is not None else llm.tokenizer.decode(ids) if body.echo else ""
        echoes += [echo] * len(made)
    return requests, echoes


def chat_requests(body: ChatCompletionBody, llm: LLM, limits: Limits, call_id: str) -> list[Request]:
    """``n`` engine requests for the conversation rendered by the model's chat template."""
    if not body.messages:
        raise bad_request("messages is empty: give at least one message", param="messages", code="empty_prompt")
    _check_choices(1, body.n, limits)
    try:
        ids = chat_prompt(llm.tokenizer, [m.for_template() for m in body.messages])
    except ChatTemplateError as exc:
        raise bad_request(str(exc), param="messages", code="chat_template_error") from None
    except ValueError as exc:
        raise bad_request(str(exc), param="messages") from None
    if not ids:
        raise bad_request("the conversation renders to an empty prompt", param="messages", code="empty_prompt")
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    n = resolve_max_tokens(requested, len(ids), limits, None, param, "messages")
    top = (body.top_logprobs or 0) if body.logprobs else None
    return _requests(llm, None, ids, sampling_params(body, llm, n, top), f"{call_id}-0", "messages")
