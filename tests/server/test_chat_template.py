"""Chat prompts: the checkpoint's jinja template (as k3-nano ships one) or the plain default."""

from __future__ import annotations

import pytest

from nonstop.server.chat import ChatTemplateError, default_chat_prompt, render_chat
from nonstop.train.tokenizer import CHAT_TEMPLATE

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]


def test_the_k3_nano_template_renders_with_bos_and_generation_prompt():
    text = render_chat(MESSAGES, CHAT_TEMPLATE, {"bos_token": "<|bos|>", "eos_token": {"content": "<|eos|>"}})
    assert text == "<|bos|><|system|>\nBe terse.\n<|user|>\nHi\n<|assistant|>\n"


def test_the_default_prompt_without_a_template():
    assert render_chat(MESSAGES, None) == default_chat_prompt(MESSAGES) == "system: Be terse.\nuser: Hi\nassistant:"


def test_a_template_that_refuses_or_breaks_raises_a_clean_error():
    with pytest.raises(ChatTemplateError, match="no system"):
        render_chat(MESSAGES, "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}")
    with pytest.raises(ChatTemplateError):
        render_chat(MESSAGES, "{{ messages[0].__class__.__mro__ }}{{ undefined_function() }}")
