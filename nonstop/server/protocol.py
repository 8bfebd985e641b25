"""Request bodies of the OpenAI API (the fields we serve), validated strictly.

Types are strict (``"5"`` is not an int); ranges follow the OpenAI reference. Unknown fields are
ignored; known fields we cannot honour (n > 1, penalties, logit_bias, tools, ...) are refused by
``unsupported`` rather than silently dropped. ``top_k``, ``ignore_eos`` and ``stop_token_ids`` are
extensions (as in vLLM), sent by the openai client through ``extra_body``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    model: str
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    n: int = Field(1, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for set fields this server cannot honour."""
        out = []
        if self.n != 1:
            out.append(("n", "only n=1 is supported"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                out.append((name, f"{name} is not supported (leave it 0)"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        if isinstance(self.stop, list) and len(self.stop) > 16:
            out.append(("stop", "at most 16 stop strings"))
        return out


PromptIds = list[int]


class CompletionBody(SamplingFields):
    """POST /v1/completions. ``prompt``: a string, a list of strings, token ids, or a list of those."""

    prompt: str | list[str] | list[PromptIds] | PromptIds
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.best_of not in (None, 1):
            out.append(("best_of", "only best_of=1 is supported"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        return out


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionBody(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.tools:
            out.append(("tools", "tool calling is not supported"))
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            out.append(("response_format", "only the text response format is supported"))
        if self.top_logprobs is not None and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs=true"))
        return out
