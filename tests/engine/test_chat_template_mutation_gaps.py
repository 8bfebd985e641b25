"""Chat rendering and message checks: checks a mutation audit found missing.

Expected values come from transformers' ``apply_chat_template`` (5.x) on the same template, or from the
documented contract of ``check_messages`` / ``chat_prompt``, not from the code under test.
"""

from __future__ import annotations

import json

import pytest

from nonstop.engine.chat_template import chat_prompt, check_messages, render_chat
from nonstop.engine.tokenizer import Tokenizer

# block tags on lines of their own, indented: transformers renders with trim_blocks and lstrip_blocks
BLOCKS = (
    "{% for m in messages %}\n  {% if m.role == 'user' %}\nU: {{ m.content }}\n  {% endif %}\n{% endfor %}\n"
    "{% if add_generation_prompt %}\nA:\n{% endif %}"
)


def test_block_tags_leave_no_newlines_or_indentation_as_in_transformers():
    messages = [{"role": "user", "content": "hi"}, {"role": "user", "content": "yo"}]
    assert render_chat(messages, BLOCKS) == "U: hi\nU: yo\nA:\n"  # transformers' apply_chat_template output


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] must be one of"):
        check_messages([{"role": "robot", "content": "hi"}])


def test_only_an_assistant_with_tool_calls_may_leave_content_out():
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert check_messages([{"role": "assistant", "tool_calls": call}])[0]["content"] == ""
    with pytest.raises(ValueError, match="has no content"):
        check_messages([{"role": "user", "tool_calls": call}])


def test_text_parts_are_joined_as_they_are():
    parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
    assert check_messages([{"role": "user", "content": parts}])[0]["content"] == "abcd"


def test_a_text_part_with_another_field_is_refused():
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\]\[0\] must be a text part"):
        check_messages([{"role": "user", "content": [{"type": "text", "text": "a", "cache": True}]}])


def test_name_and_tool_call_id_reach_the_template():
    [checked] = check_messages([{"role": "tool", "content": "42", "name": "calc", "tool_call_id": "c1"}])
    assert checked == {"role": "tool", "content": "42", "name": "calc", "tool_call_id": "c1"}
    template = "{% for m in messages %}{{ m.name }}/{{ m.tool_call_id }}:{{ m.content }}{% endfor %}"
    assert render_chat([checked], template) == "calc/c1:42"


@pytest.mark.parametrize("field", ["name", "tool_call_id"])
def test_a_lone_surrogate_in_a_passed_on_field_is_named(field):
    with pytest.raises(ValueError, match=rf"messages\[0\]\['{field}'\] holds a lone surrogate"):
        check_messages([{"role": "tool", "content": "x", field: "a\udc80"}])


def test_a_chat_prompt_holds_the_templates_bos_only_once(tmp_path):
    """A tokenizer.json whose post-processor adds BOS (Llama style): the template writes BOS itself, so the
    rendered text is encoded without special tokens, as transformers' apply_chat_template does."""
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers, processors

    vocab = {"<s>": 0, "<unk>": 1, "U": 2, ":": 3, "h": 4, "i": 5}
    hf = HF(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    hf.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    hf.add_special_tokens(["<s>"])
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    hf.save(str(tmp_path / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}U:{{ m.content }}{% endfor %}",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = Tokenizer.load(tmp_path, len(vocab))
    assert tok.encode("hi") == [0, 4, 5]  # plain text: the post-processor's BOS
    assert chat_prompt(tok, [{"role": "user", "content": "hi"}]) == [0, 2, 3, 4, 5]
