"""Differential checks of ``TiktokenTokenizer`` (Kimi K2 / Kimi Linear / Kimi K3 checkpoints: tiktoken.model +
tokenizer_config.json) against an independent re-implementation of Moonshot's published ``tokenization_kimi.py``
(``TikTokenTokenizer``), built here from its facts on a synthetic byte-level BPE file:

* split pattern: Han runs, cased non-Han words with English contractions, 1-3 digits, punctuation runs,
  newlines, spaces (``pat_str`` of the published class);
* special tokens: ids ``base .. base + 256 (+ 2 in the K2 / Kimi Linear copies)`` after the ``base`` ranks,
  named by ``added_tokens_decoder``, else ``<|reserved_token_{id}|>``; every one is a tiktoken special token;
* ``encode(text)``: text cut in 400_000-character slices, each cut again wherever a run of whitespace (or of
  non-whitespace, ``str.isspace``) passes 25_000 characters; special-token text encodes as the special id
  (``allowed_special="all"``); no BOS is ever added;
* ``decode(ids, skip_special_tokens=True)`` goes through transformers' python backend, which leaves out
  ``all_special_ids`` only: the named special tokens (bos / eos / unk / pad) and ``additional_special_tokens``
  (the class defaults to eight chat markers); any other id of the special block decodes to its name.

Sources: troy12x/quasar-kimi tokenization_kimi.py (K2-style, 256 + 2), PabloRaka/bear tokenization_kimi.py
(K3-style, 256), huggingface/transformers src/transformers/models/kimi2_6/tokenization_kimi2_6.py (256), and
transformers' tokenization_python.py ``convert_ids_to_tokens`` / tokenization_utils_base.py
``all_special_tokens`` for what ``skip_special_tokens`` leaves out.
"""

from __future__ import annotations

import base64
import json
import random

import pytest

from nonstop.engine.detokenize import IncrementalDecoder
from nonstop.engine.tokenizer import TiktokenTokenizer, Tokenizer

tiktoken = pytest.importorskip("tiktoken")

# the published pat_str, alternative by alternative
PUBLISHED_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
# additional_special_tokens the published class uses when tokenizer_config.json gives none
DEFAULT_ADDITIONAL = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
]
MERGES = [
    b"th",
    b"the",
    b" t",
    b" the",
    b"  ",
    b"    ",
    "中".encode()[:2],
    "中".encode(),
    "中文".encode(),
]
MERGES += [b"\xf0\x9f", b"<|", b"|>", b"12", b"123", b"in", b"ing"]
# merges that make cuts and piece boundaries show in the ids: digit groups (\p{N}{1,3}), a contraction
# after capitals (case-insensitive suffix), pairs of ideographic spaces (where a long run is cut)
MERGES += [b"45", b"N'", b"N'T", b"n'", b"n'T", b"\xe3\x80", "\u3000".encode(), ("\u3000" * 2).encode()]


def _ranks() -> dict[bytes, int]:
    ranks = {bytes([i]): i for i in range(256)}
    for m in MERGES:
        ranks.setdefault(m, len(ranks))
    return ranks


BASE = len(_ranks())
NAMED = {
    BASE: "[BOS]",
    BASE + 1: "[EOS]",
    BASE + 2: "<|im_end|>",
    BASE + 3: "<|im_user|>",
    BASE + 4: "<|im_assistant|>",
    BASE + 5: "<|im_middle|>",
    BASE + 10: "<|tool_calls_section_begin|>",
    BASE + 11: "<think>",
}


def _write(d, extra: dict | None = None):
    d.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in _ranks().items())
    (d / "tiktoken.model").write_text(lines)
    added = {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False} for i, s in NAMED.items()}
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
    }
    config["added_tokens_decoder"] = added
    config.update(extra or {})
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


def _reference(reserved: int = 258):
    """The published tokenizer's tiktoken.Encoding: ``reserved`` special ids after the base ranks."""
    specials = {NAMED.get(i, f"<|reserved_token_{i}|>"): i for i in range(BASE, BASE + reserved)}
    return tiktoken.Encoding(
        "ref",
        pat_str=PUBLISHED_PATTERN,
        mergeable_ranks=_ranks(),
        special_tokens=specials,
    )


def _published_slices(text: str) -> list[str]:
    """400_000-character slices, each cut where a run of one class (str.isspace) passes 25_000 characters."""
    out = []
    for start in range(0, len(text), 400_000):
        part = text[start : start + 400_000]
        run, space, cut = 0, part[:1].isspace(), 0
        for i, c in enumerate(part):
            if c.isspace() != space:
                run, space = 1, c.isspace()
            else:
                run += 1
                if run > 25_000:
                    out.append(part[cut:i])
                    cut, run = i, 1
        out.append(part[cut:])
    return out


def _reference_encode(enc, text: str) -> list[int]:
    return [i for piece in _published_slices(text) for i in enc.encode(piece, allowed_special="all")]


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    d = _write(tmp_path_factory.mktemp("kimi"))
    tok = Tokenizer.load(d, BASE + 258)
    assert isinstance(tok, TiktokenTokenizer)
    return tok


ALPHABET = list("ab the 中文字 \n\r\t  🙂é'sDON'T123456<|>[]") + [
    "<|im_end|>",
    "[BOS]",
    "<|tool_calls_section_begin|>",
    f"<|reserved_token_{BASE + 9}|>",
    f"<|reserved_token_{BASE + 257}|>",
    f"<|reserved_token_{BASE + 258}|>",  # past the special block: plain text
    "<|reserved_token_|>",
    "\u3000",
    "\x85",
    "\u200b",
    "\x1c",
    "ǅ",
    "\u0301",
]


def test_random_and_adversarial_text_encodes_as_the_published_tokenizer(kimi):
    """Catches a changed split pattern, special-token text not encoded as its id (or text past the special
    block encoded as one), and a changed special block; 1500 random strings over CJK, emoji, contractions,
    digits, unicode whitespace and special-token text mid-string."""
    enc = _reference()
    rng = random.Random(5)
    for _ in range(1500):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 40)))
        assert kimi.encode(text) == _reference_encode(enc, text), repr(text)


@pytest.mark.parametrize(
    "text",
    ["12345 6789", "can'T DON'T I'M we'Ve", "中文abc中文", "ǅungla ΑΒΓ", "x\r\n\n  y", "  <|im_end|>  [EOS]\n"],
)
def test_fixed_adversarial_text_encodes_as_the_published_tokenizer(kimi, text):
    """Catches a changed digit group length, a contraction suffix that is no longer case-insensitive,
    Han runs not kept apart from other letters, titlecase letters, and newline / special-token edges."""
    assert kimi.encode(text) == _reference_encode(_reference(), text)


@pytest.mark.parametrize(
    "text",
    [
        " " * 60_001,
        "x" * 50_001 + " " * 25_001 + "y",
        "a b " + "\u3000" * 26_000 + "b",  # ideographic space: whitespace to str.isspace
        "a" + "\x1c\x85" * 13_000 + "b",  # ASCII file separator and NEL: whitespace too
        "z" + "\u200b" * 26_000,  # zero-width space: not whitespace, one long non-space run
        "中" * 30_000,
        "a" * 399_999 + "  " + "b" * 30_000,  # the 400_000-character cut falls inside a run
    ],
)
def test_long_runs_are_cut_where_the_published_tokenizer_cuts_them(kimi, text):
    """Catches a changed slice length or run limit, a cut one character off, runs counted across a slice
    boundary, and a whitespace test other than str.isspace (unicode spaces, \\x1c, NEL, U+200B)."""
    assert kimi.encode(text) == _reference_encode(_reference(), text)


def test_encode_never_adds_bos_even_when_the_config_asks(tmp_path):
    """The published encode(text) adds no BOS (add_bos_token is not read); catches a BOS prepended to
    prompts of Kimi checkpoints whose tokenizer_config.json says add_bos_token."""
    tok = Tokenizer.load(_write(tmp_path / "k", {"add_bos_token": True}), BASE + 258)
    ids = _reference().encode("the cat", allowed_special="all")
    assert tok.encode("the cat") == ids
    assert tok.encode("the cat", add_special_tokens=True) == ids


def test_the_largest_special_id_and_a_larger_model_vocabulary(tmp_path):
    """The last id of the 256 + 2 block is a token (named by default) and a model vocabulary larger than
    the tokenizer's changes nothing; catches an off-by-one in the special block or in the vocabulary check."""
    tok = Tokenizer.load(_write(tmp_path / "k"), BASE + 258 + 1000)
    last = BASE + 257
    assert tok.encode(f"a<|reserved_token_{last}|>") == [ord("a"), last]
    assert tok.special_name(last) == f"<|reserved_token_{last}|>"
    assert tok.special_name(last + 1) is None
    assert tok.encode("the") == _reference().encode("the")


def test_streamed_pieces_add_up_to_the_whole_decode(kimi):
    """Catches streaming that loses or repeats text around special ids and characters split over tokens."""
    rng = random.Random(7)
    parts = [*range(BASE), BASE + 2, BASE + 10, BASE + 9, BASE + 257]
    for _ in range(800):
        ids = [rng.choice(parts) for _ in range(rng.randint(1, 12))]
        decoder = IncrementalDecoder(kimi)
        streamed = "".join(decoder.push(i) for i in ids)
        whole = kimi.decode(ids)
        assert whole.startswith(streamed), ids
        if not whole.endswith("\ufffd"):
            assert streamed == whole, ids


KIMI_TEMPLATE = (
    "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)


def test_chat_prompt_ids_are_the_rendered_text_encoded_with_its_markers(tmp_path):
    """The published K2 apply_chat_template renders the jinja template and encodes the text with special-token
    text as the special ids, adding no BOS; catches markers encoded as plain text, a BOS added, or the
    template's text changed on the way."""
    from nonstop.engine.chat_template import chat_prompt

    tok = Tokenizer.load(_write(tmp_path / "k", {"chat_template": KIMI_TEMPLATE}), BASE + 258)
    messages = [{"role": "user", "content": "中文 the 12345 can'T 🙂"}]
    text = "<|im_user|>user<|im_middle|>中文 the 12345 can'T 🙂<|im_end|><|im_assistant|>assistant<|im_middle|>"
    ids = chat_prompt(tok, messages)
    assert ids == _reference().encode(text, allowed_special="all")
    assert ids[0] == BASE + 3 and ids[-1] == BASE + 5
