"""Chat prompts: the checkpoint's jinja template (as k3-nano ships one); no template is an error."""

from __future__ import annotations

import pytest

from nonstop.engine.chat_template import ChatTemplateError, render_chat
from nonstop.train.tokenizer import CHAT_TEMPLATE

MESSAGES = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]


def test_the_k3_nano_template_renders_with_bos_and_generation_prompt():
    text = render_chat(MESSAGES, CHAT_TEMPLATE, {"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    assert text == "<|bos|><|system|>\nBe terse.\n<|user|>\nHi\n<|assistant|>\n"


def test_no_template_is_refused_with_the_way_out():
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        render_chat(MESSAGES, None)


def test_transformers_template_features():
    """tojson keeps non-ASCII text, {% generation %} blocks render their body, loop controls work."""
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
    )
    assert render_chat([{"role": "system", "content": "x"}, {"role": "user", "content": "é"}], template) == (
        '{"role": "user", "content": "é"}'
    )


def test_a_template_that_refuses_or_breaks_raises_a_clean_error():
    with pytest.raises(ChatTemplateError, match="no system"):
        render_chat(
            MESSAGES, "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}"
        )
    with pytest.raises(ChatTemplateError):
        render_chat(MESSAGES, "{{ messages[0].__class__.__mro__ }}{{ undefined_function() }}")
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat(MESSAGES, "{% for m in messages %}")
