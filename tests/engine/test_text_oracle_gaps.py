"""Text <-> ids for the bundled k3-nano tokenizer against transformers (``AutoTokenizer``) as the oracle,
on random inputs: encoding (special-token lookalikes typed by a user included), decoding with
``skip_special_tokens=True``, streamed pieces, stop strings cut in the decoded text, and chat templates
in the styles of Llama 3, DeepSeek-V3 and Kimi K2 rendered and tokenized as ``apply_chat_template``
renders and tokenizes them."""

from __future__ import annotations

import random

import pytest

from nonstop.engine.chat_template import chat_prompt, check_messages, render_chat
from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.requests import Request
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import Tokenizer
from nonstop.weights.resolve import ASSETS

K3 = ASSETS / "k3-nano"
PIECES = [
    "a", "Hello", " world", " ", "  ", "\n", "\n\n", "\t", "é", "e\u0301", "世界", "\u05e9\u05dc\u05d5\u05dd",
    "\u0645\u0631\u062d\u0628\u0627", "🙂", "👨\u200d👩\u200d👧", "\u200b", "\ufeff", "<|eos|>", "<|bos|>", "<|pad|>",
    "<|im_end|>", "<|user|>", "<|eos", "|>", "{{", "{%", "'", '"', "\\", "1234", "don't", " ,", "🇫🇷", "\r\n", "\x00",
]  # fmt: skip

LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
DEEPSEEK_V3 = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{ '<｜User｜>' + message['content'] }}{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif %}{%- endfor -%}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}"
)
KIMI_K2 = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>{%- elif message['role'] == 'user' -%}<|im_user|>"
    "{%- else -%}<|im_assistant|>{%- endif -%}"
    "{{ message['name'] if message.get('name') else message['role'] }}<|im_middle|>"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
TOJSON = (
    "{% for m in messages %}{{ m | tojson }}{{ m.content | tojson(indent=2) }}"
    "{% if m.name is defined %}[{{ m.name }}]{% endif %}\n{% endfor %}{{ eos_token }}{{ pad_token }}"
)


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoTokenizer

    return Tokenizer.load(K3, 6144), AutoTokenizer.from_pretrained(str(K3))


def _text(rng: random.Random, n: int | None = None) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10) if n is None else n))


def test_random_text_encodes_to_the_ids_transformers_gives(pair):
    """Catches encoding that differs from transformers: BOS or other special tokens added or left out,
    a special-token lookalike typed in the text ("<|eos|>") encoded differently (both encode it as the
    special token: transformers' default, sanitize_control_tokens off), unicode or whitespace split
    another way."""
    tok, hf = pair
    rng = random.Random(0)
    for _ in range(300):
        text = _text(rng)
        for add in (True, False):
            assert tok.encode(text, add_special_tokens=add) == hf.encode(text, add_special_tokens=add), text
    assert tok.encode("x<|eos|>y", add_special_tokens=False) == [*tok.encode("x", False), 1, *tok.encode("y", False)]


def test_random_ids_decode_and_stream_as_transformers_decodes_them(pair):
    """Catches decoding that keeps special tokens (transformers' skip_special_tokens=True drops them) and
    streamed pieces that do not add up to the whole decode, or emit half of a multi-byte character, for
    random ids weighted towards single-byte tokens and special tokens between the bytes of a character."""
    tok, hf = pair
    rng = random.Random(1)
    high_bytes = [tok.encode(c, False)[0] for c in "\u0080\u00ff"]  # two of the 0x80-0xff single-byte tokens
    chars = [tok.encode(c, False) for c in ("€", "😀", "é", "世", "a", " ")]
    for _ in range(300):
        ids: list[int] = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:  # a whole character as its byte tokens, maybe with special tokens between them
                for i in rng.choice(chars):
                    ids += [i] + ([rng.choice([0, 1, 2])] if rng.random() < 0.2 else [])
            elif r < 0.9:
                ids.append(rng.randrange(6144))
            else:
                ids.append(rng.choice(high_bytes + [0, 1, 2]))
        whole = hf.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids) == whole, ids
        decoder = IncrementalDecoder(tok)
        pieces = [decoder.push(i) for i in ids]
        streamed = "".join(pieces)
        # only a trailing incomplete character may still be held back
        assert whole.startswith(streamed) and set(whole[len(streamed) :]) <= {"\ufffd"}, ids
        for piece in pieces:
            piece.encode("utf-8")  # no half of a surrogate pair, no lone surrogate


def test_stop_strings_across_token_boundaries_cut_the_decoded_text_at_the_first_match(pair):
    """Catches a stop string missed when it spans tokens (or multi-byte characters split across tokens),
    a cut at the wrong match (the first to end wins, then the earliest start), and streamed pieces that
    differ from the final text. Expected: searched in transformers' decode of all the ids."""
    tok, hf = pair
    rng = random.Random(2)
    checked = 0
    for trial in range(400):
        if trial % 2:  # a small alphabet: stop strings that overlap themselves ("aab" in "aaab")
            text = "".join(rng.choice(["a", "b", "ab", "á"]) for _ in range(rng.randint(2, 16)))
        else:
            text = _text(rng, rng.randint(2, 12)).replace("<|", "<")  # no EOS in the middle
        ids = hf.encode(text, add_special_tokens=False)
        whole = hf.decode(ids, skip_special_tokens=True)
        if len(whole) < 2 or "\ufffd" in whole:
            continue
        stops = []
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(whole))
            stops.append(whole[i : rng.randint(i + 1, min(len(whole), i + 6))])
        req = Request("r", None, [5], SamplingParams(temperature=0, max_tokens=len(ids), stop=stops), frozenset())
        pieces = []
        for i in ids:
            pieces.append(req.append(i, tok))
            if req.finished:
                break
        first = min((whole.find(s) + len(s), whole.find(s)) for s in stops)  # every stop is in the text
        assert req.finish_reason == "stop" and req.text == whole[: first[1]], (text, stops)
        assert "".join(pieces) == req.text
        checked += 1
    assert checked > 200


def _conversation(rng: random.Random) -> list[dict]:
    messages = []
    for k in range(rng.randint(1, 5)):
        role = rng.choice(("system", "user", "assistant") if k else ("system", "user"))
        content = _text(rng)
        if rng.random() < 0.25:  # OpenAI text parts: nonstop joins them as they are
            content = [{"type": "text", "text": _text(rng)} for _ in range(rng.randint(1, 3))]
        message = {"role": role, "content": content}
        if rng.random() < 0.2:
            message["name"] = _text(rng, 2)
        messages.append(message)
    if rng.random() < 0.1:
        messages[-1]["content"] = "x" * 5000
    return messages


def _joined(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        parts = m["content"]
        out.append({**m, "content": parts if isinstance(parts, str) else "".join(p["text"] for p in parts)})
    return out


@pytest.mark.parametrize("name", ["k3-nano", "llama3", "deepseek_v3", "kimi_k2", "tojson"])
def test_random_conversations_render_and_tokenize_as_apply_chat_template(pair, name):
    """Catches a chat template environment that differs from transformers' (trim_blocks / lstrip_blocks,
    namespace, tojson escaping non-ASCII, the special tokens a template sees, message fields such as
    ``name`` passed on or lost) and prompt ids that differ from ``apply_chat_template(tokenize=True)``,
    for multi-turn conversations with empty, unicode, special-token lookalike and long contents."""
    from nonstop.server.protocol import ChatMessage

    tok, hf = pair
    template = {"k3-nano": tok.chat_template, "llama3": LLAMA3, "deepseek_v3": DEEPSEEK_V3, "kimi_k2": KIMI_K2}
    template = template.get(name, TOJSON)
    rng = random.Random(name)
    for _ in range(60):
        messages = _conversation(rng)
        checked = check_messages(messages)
        server = [ChatMessage.model_validate(m).for_template() for m in messages]
        assert server == checked  # the server and LLM.chat hand the template the same messages
        kwargs = {"chat_template": template, "add_generation_prompt": True}
        expected = hf.apply_chat_template(_joined(messages), tokenize=False, **kwargs)
        assert render_chat(checked, template, tok.special_tokens) == expected, messages
        ids = hf.apply_chat_template(_joined(messages), tokenize=True, return_dict=False, **kwargs)
        own, tok.chat_template = tok.chat_template, template
        try:
            assert chat_prompt(tok, checked) == list(ids), messages
        finally:
            tok.chat_template = own
