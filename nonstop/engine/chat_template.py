"""Chat messages -> prompt text with the checkpoint's chat template (jinja), as transformers renders it.

Templates run in jinja's immutable sandbox with transformers' settings: trim_blocks, lstrip_blocks,
loop controls, a ``{% generation %}`` block (rendered as its body), a ``tojson`` filter that keeps
non-ASCII characters, and the names HF templates use (``messages``, ``tools``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``, ``strftime_now``).
A model without a template is refused (as vLLM does): no plain-text stand-in is made up.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache


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
    special_tokens: {"bos_token": ..., "eos_token": ...} as the template expects them."""
    if not template:
        raise ChatTemplateError(NO_TEMPLATE)
    try:
        compiled = _compile(template)
    except ModuleNotFoundError:
        raise ChatTemplateError("chat templates need jinja2: pip install jinja2") from None
    try:
        return compiled.render(messages=messages, tools=None, add_generation_prompt=True, **(special_tokens or {}))
    except ChatTemplateError:
        raise
    except Exception as exc:  # jinja raises many types: a template the request cannot satisfy
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None


def chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered by ``tokenizer``'s chat template (the template writes BOS)."""
    text = render_chat(
        messages, tokenizer.chat_template, {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    )
    return tokenizer.encode(text, add_special_tokens=False)
