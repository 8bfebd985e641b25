"""Request bodies of the OpenAI API, validated strictly, with one policy for every field:

* honoured: the fields below without a note, and vLLM's extensions ``top_k``, ``min_p``,
  ``repetition_penalty``, ``ignore_eos`` and ``stop_token_ids`` (the openai client sends them through
  ``extra_body``); under speculative decoding a repetition, presence or frequency penalty is refused
  (``unsupported_parameter``, by ``translate.sampling_params``);
* accepted and ignored, because they never change the output: ``user``, ``metadata``, ``store``,
  ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``parallel_tool_calls``;
* refused (400 ``unsupported_parameter``) when set to anything but their neutral value, because we
  cannot honour them: ``logit_bias``, ``suffix``, ``best_of`` != n, ``tools``, ``functions``,
  ``response_format`` other than text, ``audio``, ``modalities`` other than text, ``prediction``,
  ``reasoning_effort``, ``web_search_options``, ``verbosity``, and ``stream_options`` without ``stream``
  (as OpenAI and vLLM refuse it);
* any other field: refused (400 ``unknown_parameter``), so a misspelt name never goes unnoticed.

Types are strict (``"5"`` is not an int); ranges follow the OpenAI reference. Sampling fields left
out (or null) take the checkpoint's generation_config.json defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nonstop.engine.chat_template import ROLES
from nonstop.engine.sampling import ADDITIVE_PENALTY_RANGE, MAX_N, SEED_RANGE

SEED_MIN, SEED_MAX = SEED_RANGE  # the engine's ranges, one source: a request is refused as SamplingParams would
PENALTY_MIN, PENALTY_MAX = ADDITIVE_PENALTY_RANGE


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _null_is_left_out(cls, data):
        """A field sent as null takes its default, as if left out (clients that serialise every field
        send ``"stream": null``, ``"n": null``); a required field sent as null is missing."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
)


class SamplingFields(_Body):
    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=100.0)
    presence_penalty: float | None = Field(None, ge=PENALTY_MIN, le=PENALTY_MAX)
    frequency_penalty: float | None = Field(None, ge=PENALTY_MIN, le=PENALTY_MAX)
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def sampling_overrides(self) -> dict:
        """The sampling fields this request sets (others take the model's defaults)."""
        return {name: getattr(self, name) for name in SAMPLING if getattr(self, name) is not None}

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for set fields this server cannot honour."""
        out = [("logit_bias", "logit_bias is not supported")] if self.logit_bias else []
        if self.stream_options is not None and not self.stream:
            out.append(("stream_options", "stream_options needs stream=true"))
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

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value):
        def ids(x):
            return isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)

        if isinstance(value, str) or ids(value):
            return value
        if isinstance(value, list) and (all(isinstance(p, str) for p in value) or all(ids(p) for p in value)):
            return value
        raise ValueError("give a string, a list of strings, a list of token ids or a list of token-id lists")

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.best_of not in (None, self.n):
            out.append(("best_of", "best_of must equal n (candidates are not ranked)"))
        if self.suffix:
            out.append(("suffix", "suffix is not supported"))
        return out


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    """One message; ``tool_calls`` / ``tool_call_id`` reach the chat template, ``refusal`` and
    ``annotations`` (sent back by clients that echo a response message) are ignored."""

    role: Literal[ROLES]  # the engine's list (``chat_template.ROLES``; LLM.chat checks the same)
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    annotations: list[dict] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value):
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and "type" not in part:
                    raise ValueError('each content part needs a "type" ("text", with its "text")')
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"content parts of type {kind!r} are not supported: this model reads text only")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict:
        out = {"role": self.role, "content": self.text()}
        for name in ("name", "tool_calls", "tool_call_id"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


class ChatCompletionBody(SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None
    audio: dict | None = None
    modalities: list[str] | None = None
    prediction: dict | None = None
    reasoning_effort: str | None = None
    web_search_options: dict | None = None
    verbosity: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        for name in ("tools", "functions"):
            if getattr(self, name):
                out.append((name, "tool calling is not supported"))
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none", "auto"):
                out.append((name, "tool calling is not supported"))
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            out.append(("response_format", "only the text response format is supported"))
        if self.modalities not in (None, ["text"]):
            out.append(("modalities", "only text output is supported"))
        for name in ("audio", "prediction", "reasoning_effort", "web_search_options", "verbosity"):
            if getattr(self, name) is not None:
                out.append((name, f"{name} is not supported"))
        if self.top_logprobs is not None and not self.logprobs:
            out.append(("top_logprobs", "top_logprobs needs logprobs=true"))
        return out
