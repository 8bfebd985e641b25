"""Chat messages -> prompt text with the checkpoint's chat template (jinja), as transformers renders it.

Templates run in jinja's immutable sandbox with transformers' settings: trim_blocks, lstrip_blocks,
loop controls, a ``{% generation %}`` block (rendered as its body), a ``tojson`` filter that keeps
non-ASCII characters, and the names HF templates use (``messages``, ``tools``,
``add_generation_prompt``, ``raise_exception``, ``strftime_now`` and the special tokens of
tokenizer_config.json, ``bos_token``, ``eos_token``, ``pad_token``, ... as transformers names them in its
``special_tokens_map``: ``Tokenizer.special_tokens``).
A model without a template is refused (as vLLM does): no plain-text stand-in is made up.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from nonstop.engine.tokenizer import check_text


class ChatTemplateError(ValueError):
    """No template, or the template refused the conversation or failed to render."""


NO_TEMPLATE = (
    "this model has no chat template (chat_template.jinja or tokenizer_config.json): give one with --chat-template FILE"
)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """``{% generation %}...{% endgeneration %}`` (marks assistant text for training): its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise ChatTemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template does not parse: {exc}") from None


def render_chat(messages: list[dict], template: str | None, special_tokens: dict[str, str] | None = None) -> str:
    """The prompt for ``messages`` ([{role, content}]) ending where the assistant's answer begins.
    special_tokens: {"bos_token": ..., "eos_token": ..., "pad_token": ...}: names the template may use
    (``Tokenizer.special_tokens``)."""
    if not template:
        raise ChatTemplateError(NO_TEMPLATE)
    try:
        compiled = _compile(template)
    except ModuleNotFoundError:
        raise ChatTemplateError("chat templates need jinja2: pip install jinja2") from None
    try:
        return compiled.render(
            messages=messages, tools=None, documents=None, add_generation_prompt=True, **(special_tokens or {})
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # jinja raises many types: a template the request cannot satisfy
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None


ROLES = ("system", "developer", "user", "assistant", "tool")
_OPTIONAL_TEXT = ("name", "tool_call_id", "refusal")  # str or None
_OPTIONAL_DICTS = ("tool_calls", "annotations")  # list of dicts or None


def check_messages(messages) -> list[dict]:
    """``messages`` checked as the server's ``ChatMessage`` checks them (``server/protocol``) and made
    ready for the template: a non-empty list of dicts with a ``role`` (system, developer, user, assistant or
    tool) and a ``content`` that is a string or a list of text parts (``{"type": "text", "text": str}``,
    joined into one string); ``name`` / ``tool_call_id`` strings and ``tool_calls`` (a list of dicts) are
    passed on, ``refusal`` and ``annotations`` accepted and dropped, any other key refused. Unlike the server,
    which reads a missing content as "", content may be left out (or None) only by an assistant message
    with ``tool_calls``: a message with no text is a mistake, not a prompt. A string passed on that is not
    valid Unicode (a lone surrogate) is refused. A TypeError or ValueError names the message (its index) and
    the field."""
    if isinstance(messages, (str, bytes, dict)) or not isinstance(messages, (list, tuple)):
        raise TypeError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}"
        )
    if not messages:
        raise ValueError("messages is empty: give at least one message")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise TypeError(f"{where} must be a dict with 'role' and 'content', got {type(message).__name__}")
        unknown = sorted(str(k) for k in message if k not in ("role", "content", *_OPTIONAL_TEXT, *_OPTIONAL_DICTS))
        if unknown:
            raise ValueError(
                f"{where} has unknown field(s) {', '.join(unknown)}; known: role, content, name, tool_calls, "
                "tool_call_id, refusal, annotations"
            )
        role = message.get("role")
        if role is None:
            raise ValueError(f"{where} has no 'role' (one of {', '.join(ROLES)})")
        if not isinstance(role, str) or role not in ROLES:
            raise ValueError(f"{where}['role'] must be one of {', '.join(ROLES)}, got {role!r}")
        for name in _OPTIONAL_TEXT:
            if message.get(name) is not None and not isinstance(message[name], str):
                raise TypeError(f"{where}[{name!r}] must be a string, got {type(message[name]).__name__}")
        for name in _OPTIONAL_DICTS:
            value = message.get(name)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
                raise TypeError(f"{where}[{name!r}] must be a list of dicts, got {value!r}")
        content = message.get("content")
        if content is None:
            if not (role == "assistant" and message.get("tool_calls")):
                raise ValueError(
                    f"{where} ({role}) has no content: give 'content' as a string or a list of text parts "
                    "(only an assistant message with tool_calls may leave it out)"
                )
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(
                        f"{where}['content'][{j}] is a part of type {kind!r}: only text parts are supported "
                        "(this model reads text only)"
                    )
                if not (isinstance(part, dict) and set(part) == {"type", "text"} and isinstance(part["text"], str)):
                    raise TypeError(
                        f"{where}['content'][{j}] must be a text part {{'type': 'text', 'text': str}}, got {part!r}"
                    )
                parts.append(part["text"])
            text = "".join(parts)
        else:
            raise TypeError(
                f"{where}['content'] must be a string or a list of text parts, got {type(content).__name__}"
            )
        for name in ("content", "name", "tool_call_id", "tool_calls"):
            _check_unicode(message.get(name), f"{where}[{name!r}]")
        checked = {"role": role, "content": text}
        for name in ("name", "tool_calls", "tool_call_id"):
            if message.get(name) is not None:
                checked[name] = message[name]
        out.append(checked)
    return out


def _check_unicode(value, where: str) -> None:
    """Refuse a string in ``value`` (or in its lists and dicts) that is not valid Unicode, naming where it is."""
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(item, f"{where}[{key!r}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{where}[{i}]")


def chat_text(tokenizer, messages: list[dict]) -> str:
    """``messages`` rendered by ``tokenizer``'s chat template with its special tokens (``special_tokens``)."""
    return render_chat(messages, tokenizer.chat_template, tokenizer.special_tokens)


def chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered by ``tokenizer``'s chat template (the template writes BOS)."""
    return tokenizer.encode(chat_text(tokenizer, messages), add_special_tokens=False)
