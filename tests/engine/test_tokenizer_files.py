"""Tokenizers as checkpoints ship them, built here (no downloads): a Kimi-style ``tiktoken.model`` with
its special tokens in ``tokenizer_config.json`` (checked against transformers' own tiktoken converter),
chat templates from tokenizer_config.json / chat_template.jinja / ``--chat-template``, a checkpoint with
no tokenizer (text refused, token ids work) and generation_config.json defaults."""

from __future__ import annotations

import base64
import json
import random

import pytest
import torch

from nonstop.cli import main
from nonstop.config import ModelConfig
from nonstop.engine.chat_template import ChatTemplateError
from nonstop.engine.llm import LLM
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.tokenizer import KIMI_PATTERN, ByteTokenizer, TiktokenTokenizer, Tokenizer, TokenizerError
from nonstop.weights.synth import write_checkpoint
from tests.tiny_configs import LLAMA

MERGES = [
    b"th",
    b"the",
    b" t",
    b" the",
    b"ab",
    "文a".encode(),
    "中文".encode(),
    b"12",
    b"123",
    b"1234",
    b"45",
    b"in",
    b"ing",
    b" c",
    b" ca",
    b" cat",
]
SPECIALS = ["[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"]
KIMI_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)
SAMPLES = [
    "the cat",
    "中文a 12345 thing",
    "naïve café 🙂 — ok",
    "  spaces\n\nnewlines\ttabs",
    "Don't we've I'M",
    "ÀÉÎõü ΑΒΓ абв",
    "x" * 40 + " " * 30,
    "[BOS]hello<|im_end|>",
]


def _ranks() -> dict[bytes, int]:
    ranks = {bytes([i]): i for i in range(256)}
    for m in MERGES:
        ranks.setdefault(m, len(ranks))
    return ranks


def write_kimi_tokenizer(d, template: str | None = KIMI_TEMPLATE) -> int:
    """tiktoken.model + tokenizer_config.json (as Kimi checkpoints ship them) in ``d``; the vocabulary size."""
    ranks = _ranks()
    d.mkdir(parents=True, exist_ok=True)
    (d / "tiktoken.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    base = len(ranks)
    added = {
        str(base + i): {"content": s, "special": True, "lstrip": False, "rstrip": False} for i, s in enumerate(SPECIALS)
    }
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "added_tokens_decoder": added,
    }
    if template:
        config["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return base + 256 + 2


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("kimi-tok")
    vocab = len(_ranks()) + 256 + 2  # the ranks, the reserved special ids and [BOS] / [EOS] (write_kimi_tokenizer's)
    cfg = ModelConfig.from_hf_dict(
        {**LLAMA, "vocab_size": vocab, "bos_token_id": len(_ranks()), "eos_token_id": len(_ranks()) + 1}
    )
    write_checkpoint(cfg, d, seed=2, dtype=torch.float32)
    (d / "tokenizer.json").unlink()  # synth writes a byte tokenizer; this checkpoint ships tiktoken only
    assert write_kimi_tokenizer(d) == vocab  # after synth, which replaces a directory's tokenizer files
    return d


def _oracle(d):
    """transformers' conversion of the same tiktoken file (its own BPE and regex engine)."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    return TikTokenConverter(
        vocab_file=str(d / "tiktoken.model"), pattern=KIMI_PATTERN, additional_special_tokens=SPECIALS
    ).converted()


def test_tiktoken_files_encode_as_transformers_converts_them(kimi_dir):
    tok = Tokenizer.load(kimi_dir, 10_000)
    assert isinstance(tok, TiktokenTokenizer)
    oracle = _oracle(kimi_dir)
    rng = random.Random(0)
    alphabet = "the cat ing 中文a 12345 é🙂\n\t'sDON'T"
    texts = SAMPLES[:-1] + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 60))) for _ in range(200)]
    for text in texts:
        ids = tok.encode(text)
        assert ids == oracle.encode(text, add_special_tokens=False).ids, text
        assert tok.decode(ids) == text


def test_kimi_pre_tokenizer_splits(kimi_dir):
    tok, r = Tokenizer.load(kimi_dir, 10_000), _ranks()
    # Han runs apart from Latin: the merge "文a" is never used
    assert tok.encode("中文a") == [r["中文".encode()], r[b"a"]]
    assert tok.encode("12345") == [r[b"123"], r[b"45"]]  # at most 3 digits per piece ("1234" is never used)
    assert tok.encode("the cat") == [r[b"the"], r[b" cat"]]


def test_special_tokens_from_tokenizer_config(kimi_dir):
    tok = Tokenizer.load(kimi_dir, 10_000)
    base = len(_ranks())
    ids = tok.encode("[BOS]hi<|im_end|>")
    assert ids[0] == base and ids[-1] == base + 2
    assert tok.decode(ids) == "hi"  # special tokens are left out of text
    assert [tok.token_text(i) for i in ids] == ["[BOS]", "h", "i", "<|im_end|>"]  # one token: by its name
    assert tok.token_id(f"<|reserved_token_{base + 100}|>") == base + 100  # unnamed ids get reserved names
    assert tok.bos_token == "[BOS]" and tok.eos_token == "[EOS]"


def test_chat_with_the_checkpoints_template(kimi_dir):
    llm = LLM(kimi_dir, dtype="float32", max_batch=1)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the cat"}]
    out = llm.chat(messages, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    base = len(_ranks())
    prompt = out.prompt_token_ids
    assert (
        prompt[0] == base + 5 and prompt.count(base + 6) == 3 and prompt[-1] == base + 6
    )  # system, middles, open turn
    assert base + 3 in prompt and base + 4 in prompt
    assert llm.tokenizer.decode(prompt) == "systemBe brief.userthe catassistant"
    assert len(out.token_ids) == 3


def test_chat_template_precedence(kimi_dir, tmp_path):
    import shutil

    d = tmp_path / "c"
    shutil.copytree(kimi_dir, d)
    msgs = [{"role": "user", "content": "x"}]
    (d / "chat_template.jinja").write_text("JINJA{{ messages[0]['content'] }}")
    assert Tokenizer.load(d, 10_000).chat_template == "JINJA{{ messages[0]['content'] }}"
    override = tmp_path / "mine.jinja"
    override.write_text("MINE{{ messages[0]['content'] }}")
    llm_tok = Tokenizer.load(d, 10_000, chat_template=override)
    assert llm_tok.chat_template.startswith("MINE")
    (d / "chat_template.jinja").unlink()
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "DEFAULT"}]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.load(d, 10_000).chat_template == "DEFAULT"
    del config["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    from nonstop.engine.chat_template import chat_prompt

    with pytest.raises(ChatTemplateError, match="--chat-template"):
        chat_prompt(Tokenizer.load(d, 10_000), msgs)


def test_a_checkpoint_without_tokenizer_refuses_text_but_runs_token_ids(kimi_dir, tmp_path, capsys):
    import shutil

    d = tmp_path / "bare"
    shutil.copytree(kimi_dir, d)
    (d / "tiktoken.model").unlink()
    llm = LLM(d, dtype="float32", max_batch=1)
    with pytest.raises(TokenizerError, match=r"has no tokenizer .*token ids"):
        llm.generate(["hello"], SamplingParams(max_tokens=2))
    out = llm.generate(
        prompt_token_ids=[[5, 6, 7]], sampling=SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 3 and out.text == ""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["generate", "--model", str(d), "hello"])
    assert e.value.code == 2 and "no tokenizer" in capsys.readouterr().err
    assert main(["generate", "--model", str(d), "--prompt-ids", "5,6,7", "-n", "3", "--ignore-eos"]) == 0
    assert "token ids:" in capsys.readouterr().out
    assert main(["generate", "--model", str(d), "--tokenizer", "bytes", "-n", "2", "hi"]) == 0  # bytes only when asked


def test_generation_config_defaults(kimi_dir, tmp_path):
    import shutil

    d = tmp_path / "g"
    shutil.copytree(kimi_dir, d)
    (d / "generation_config.json").write_text(
        json.dumps(
            {
                "temperature": 0.6,
                "top_p": 0.9,
                "top_k": 20,
                "min_p": 0.02,
                "repetition_penalty": 1.1,
                "max_new_tokens": 7,
                "eos_token_id": [9],
            }
        )
    )
    llm = LLM(d, dtype="float32", max_batch=1)
    p = llm.default_sampling()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.repetition_penalty, p.max_tokens) == (
        0.6,
        0.9,
        20,
        0.02,
        1.1,
        7,
    )
    assert 9 in llm.eos_ids
    assert llm.default_sampling(temperature=0).temperature == 0
    out = llm.generate(prompt_token_ids=[[5, 6]])[0]  # no SamplingParams: the checkpoint's
    assert 1 <= len(out.token_ids) <= 7
    assert LLM(d, dtype="float32", generation_config=False).default_sampling().max_tokens == SamplingParams().max_tokens


def test_token_text_keeps_distinct_tokens_distinct(kimi_dir):
    """A logprobs listing names each token: part of a UTF-8 character as its bytes (OpenAI's
    ``bytes:\\x..``), never the replacement character that every such token would share."""
    byte = ByteTokenizer(300)
    assert byte.token_text(ord("A")) == "A" and byte.token_bytes(ord("A")) == b"A"
    lead, cont = "é".encode()
    assert byte.token_text(lead) == "bytes:\\xc3" and byte.token_text(cont) == "bytes:\\xa9"
    assert byte.token_text(299) == "<|299|>"
    tok = Tokenizer.load(kimi_dir, 10_000)
    ids = [i for i in range(len(_ranks())) if tok.token_bytes(i) in (b"\xe2", b"\x80")]
    assert len(ids) == 2 and len({tok.token_text(i) for i in ids}) == 2 and "\ufffd" not in tok.token_text(ids[0])


def test_a_byte_level_tokenizer_json_names_each_tokens_own_bytes():
    """The bundled k3-nano's tokenizer.json (byte-level BPE): every token's bytes joined are the text's
    UTF-8, so tokens that are part of a character are listed by their bytes, not all as U+FFFD; a token
    that is whole text is listed as that text."""
    from nonstop.engine.tokenizer import HFTokenizer
    from nonstop.weights.resolve import resolve_model

    _, model_dir = resolve_model("k3-nano")
    tok = Tokenizer.load(model_dir, 10**6)
    assert isinstance(tok, HFTokenizer)
    text = "日本語🙂 naïve café, ok"
    ids = tok.encode(text, add_special_tokens=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    parts = [tok.token_text(i) for i in ids]
    assert "\ufffd" not in "".join(parts) and any(p.startswith("bytes:\\x") for p in parts)
    word = tok.encode(" the", add_special_tokens=False)
    assert len(word) == 1 and tok.token_text(word[0]) == " the"


def test_a_byte_fallback_tokenizer_json_names_its_byte_tokens(tmp_path):
    """A SentencePiece-style tokenizer.json (Metaspace, ``<0xHH>`` byte-fallback tokens): a character
    outside the vocabulary becomes byte tokens, listed by their bytes; other tokens as their text."""
    from tokenizers import Tokenizer as HF
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {f"<0x{b:02X}>": b for b in range(256)} | {"▁": 256, "a": 257, "b": 258, "▁a": 259, "<unk>": 260}
    hf = HF(models.BPE(vocab=vocab, merges=[("▁", "a")], unk_token="<unk>", byte_fallback=True))
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.load(tmp_path, len(vocab))
    ids = tok.encode("aé", add_special_tokens=False)
    assert [tok.token_bytes(i) for i in ids][-2:] == list(map(bytes, (["é".encode()[0]], ["é".encode()[1]])))
    assert [tok.token_text(i) for i in ids][-2:] == ["bytes:\\xc3", "bytes:\\xa9"]
    assert tok.token_text(vocab["▁a"]) == tok.decode([vocab["▁a"]]) and tok.token_bytes(vocab["b"]) is None


def test_a_chat_template_of_the_wrong_type_is_named(tmp_path):
    """``chat_template: 5`` was read as no template ("this model has no chat template")."""
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 5}))
    with pytest.raises(TokenizerError, match="chat_template must be a string"):
        Tokenizer.load(tmp_path, 300)
