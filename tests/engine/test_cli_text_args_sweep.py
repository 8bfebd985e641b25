"""Text the user gives is taken as given: an explicit empty prompt is refused (not replaced by the default
"The"); free-text arguments that are not valid UTF-8 are refused before the model loads, naming the argument
and the byte; stop strings and chat messages holding a lone surrogate are refused naming the field; chat
templates see every special token of tokenizer_config.json, as transformers renders them; an interactive
chat ending at end of input leaves the terminal on a new line."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nonstop.commands.chat import _read_lines
from nonstop.engine.chat_template import chat_text, check_messages
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams
from nonstop.engine.tokenizer import Tokenizer
from tests.engine.test_cli_generate_chat_input import _exit_code, _no_weights

REPO = Path(__file__).resolve().parents[2]
K3_NANO = REPO / "nonstop" / "assets" / "k3-nano"

# ---------------------------------------------------------------- the prompt given is the prompt used


def test_an_explicit_empty_prompt_is_refused_not_replaced_by_the_default(capsys):
    code = _exit_code(["generate", "--backend", "reference", "-n", "3", "--temperature", "0", ""])
    captured = capsys.readouterr()
    assert code == 2 and "nonstop: error: empty prompt" in captured.err
    assert captured.out == ""  # nothing generated, from "The" or anything else


# ---------------------------------------------------------------- arguments that are not UTF-8


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "caf\udce9"], "the prompt is not valid UTF-8 (byte 0xe9 at character 3)"),
        (["generate", "ab", "c\udcff"], "the prompt is not valid UTF-8 (byte 0xff at character 4)"),
        (
            ["generate", "--stop", "ok", "--stop", "\udce9", "Hi"],
            "--stop is not valid UTF-8 (byte 0xe9 at character 0)",
        ),
        (["chat", "--system", "ab\udce9"], "--system is not valid UTF-8 (byte 0xe9 at character 2)"),
        (["chat", "--stop", "x\udc80"], "--stop is not valid UTF-8 (byte 0x80 at character 1)"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused_before_loading(argv, message, monkeypatch, capsys):
    _no_weights(monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    code = _exit_code([*argv[:1], "--backend", "reference", "-n", "2", *argv[1:]])
    captured = capsys.readouterr()
    assert code == 2 and captured.err == f"nonstop: error: {message}\n" and captured.out == ""


def test_the_command_line_bytes_are_named_end_to_end():
    """The real path: argv bytes decoded by Python (surrogateescape), refused before the model loads."""
    env = {**os.environ, "PYTHONUTF8": "1"}
    argv = [sys.executable, "-m", "nonstop.cli", "generate", "--backend", "reference", "-n", "2", b"caf\xe9"]
    done = subprocess.run(argv, capture_output=True, timeout=300, cwd=REPO, env=env)
    assert done.returncode == 2
    assert done.stderr == b"nonstop: error: the prompt is not valid UTF-8 (byte 0xe9 at character 3)\n"


# ---------------------------------------------------------------- the Python API


@pytest.mark.parametrize(
    "stop, where", [("a\udce9", "stop holds a lone surrogate U+DCE9 at character 1"), (["ok", "\ud800"], "stop[1]")]
)
def test_a_stop_string_with_a_lone_surrogate_is_refused_naming_stop(stop, where):
    with pytest.raises(InvalidSamplingParam, match=r"lone surrogate") as info:
        SamplingParams(stop=stop)
    assert info.value.param == "stop" and where in str(info.value)


@pytest.mark.parametrize(
    "message, where",
    [
        (
            {"role": "user", "content": "caf\udce9"},
            "messages[1]['content'] holds a lone surrogate U+DCE9 at character 3",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text", "text": "x\udce9"}]},
            "messages[1]['content'][1]['text'] holds a lone surrogate U+DCE9 at character 1",
        ),
        ({"role": "user", "content": "hi", "name": "b\ud800b"}, "messages[1]['name'] holds a lone surrogate U+D800"),
        (
            {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "\udcff"}}],
            },
            "messages[1]['tool_calls'][0]['function']['arguments'] holds a lone surrogate U+DCFF",
        ),
    ],
)
def test_a_chat_message_with_a_lone_surrogate_is_refused_naming_the_field(message, where):
    with pytest.raises(ValueError) as info:
        check_messages([{"role": "system", "content": "be brief"}, message])
    assert where in str(info.value)


def test_llm_chat_names_the_message_not_a_place_in_the_rendered_text():
    from nonstop import LLM

    llm = LLM("k3-nano", backend="reference")
    with pytest.raises(ValueError, match=r"^messages\[0\]\['content'\] holds a lone surrogate U\+DCE9 at character 1"):
        llm.chat([{"role": "user", "content": "a\udce9"}], SamplingParams(max_tokens=2))


# ---------------------------------------------------------------- special tokens in chat templates

NAMES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask", "image", "video", "audio", "boi", "a", "b", "foo", "zed")
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    + "".join(f"{n}={{{{ {n}_token }}}};" for n in NAMES)
    + "{% if pad_token is defined %}P{% endif %}{% if unk_token is defined %}U{% endif %}"
)
ADDED = {"__type": "AddedToken", "content": "<boi>", "lstrip": False, "normalized": False, "rstrip": False}
CONFIGS = {
    "k3-nano": json.loads((K3_NANO / "tokenizer_config.json").read_text()),
    "named": {
        "bos_token": "<|bos|>",
        "eos_token": {**ADDED, "content": "<|eos|>"},
        "pad_token": "<|pad|>",
        "unk_token": "<unk>",
        "sep_token": "[SEP]",
        "cls_token": None,
        "mask_token": "[MASK]",
        "image_token": "<img>",
        "add_bos_token": True,
        "foo_token": 3,
        "additional_special_tokens": ["<x1>", "<x2>"],
    },
    "extra object": {"pad_token": "<P>", "video_token": "<vid>", "extra_special_tokens": {"audio_token": "<aud>"}},
    "extra overrides": {
        "pad_token": "<P>",
        "zed_token": "<z>",
        "extra_special_tokens": {"pad_token": "<P2>", "zed_token": "<z2>"},
    },
    "added token key": {"eos_token": "<|eos|>", "boi_token": ADDED, "foo_token": {"content": "<no type>"}},
    "additional object": {"additional_special_tokens": {"a_token": "<a>"}, "extra_special_tokens": []},
    "both objects": {"additional_special_tokens": {"a_token": "<a>"}, "extra_special_tokens": {"b_token": "<b>"}},
    "extra list": {"additional_special_tokens": {"a_token": "<a>"}, "extra_special_tokens": ["<e>"], "unk_token": ""},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_templates_see_the_special_tokens_transformers_gives_them(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    config = {**CONFIGS[name], "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}
    shutil.copy(K3_NANO / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path)).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ours = chat_text(Tokenizer.load(tmp_path, 1 << 20), messages)
    assert ours == theirs


def test_the_pad_and_unk_tokens_reach_the_template(tmp_path):
    """Without transformers: k3-nano's own pad token, and an unknown-token name set to null, as it ships."""
    tok = Tokenizer.load(K3_NANO, 1 << 20, chat_template="{{ bos_token }}[{{ pad_token }}]{{ unk_token is defined }}")
    assert chat_text(tok, [{"role": "user", "content": "Hi"}]) == "<|bos|>[<|pad|>]False"


# ---------------------------------------------------------------- end of input on a terminal


def test_end_of_input_after_a_prompt_ends_the_line(capsys):
    lines = list(_read_lines(io.TextIOWrapper(io.BytesIO(b"Hi\n"), encoding="utf-8"), prompt=True))
    assert lines == [("Hi", None)]
    assert capsys.readouterr().err == "> > \n"  # the second prompt, answered by Ctrl-D, gets its line end


def test_piped_input_writes_no_prompt_and_no_line_end(capsys):
    assert list(_read_lines(io.TextIOWrapper(io.BytesIO(b"Hi\n"), encoding="utf-8"), prompt=False)) == [("Hi", None)]
    assert capsys.readouterr().err == ""
