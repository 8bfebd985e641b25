"""Chat messages -> prompt text: the checkpoint's ``chat_template`` (jinja, from tokenizer_config.json)
or, when it has none, a plain default::

    system: You are terse.
    user: Hello
    assistant:

Templates run in jinja's sandbox as transformers runs them (trim_blocks, lstrip_blocks, loop
controls) with the names HF templates use (``messages``, ``add_generation_prompt``, ``bos_token``,
``eos_token``, ``raise_exception``, ``strftime_now``).
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache


class ChatTemplateError(ValueError):
    """The template refused the conversation or failed to render."""


def default_chat_prompt(messages: list[dict]) -> str:
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines + ["assistant:"])


def _special(config: dict, name: str) -> str:
    value = config.get(name) or ""
    return value.get("content", "") if isinstance(value, dict) else str(value)


@lru_cache(maxsize=4)
def _compile(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ChatTemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def render_chat(messages: list[dict], template: str | None, tokenizer_config: dict | None = None) -> str:
    """The prompt for ``messages`` ([{role, content}]) ending where the assistant's answer begins."""
    if not template:
        return default_chat_prompt(messages)
    config = tokenizer_config or {}
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=True, bos_token=_special(config, "bos_token"), eos_token=_special(config, "eos_token"))
    except ChatTemplateError:
        raise
    except Exception as exc:  # jinja raises many types: a template the request cannot satisfy
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
