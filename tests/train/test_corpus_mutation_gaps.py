"""Corpus, cleaner and tokenizer behaviours a mutation audit found unpinned: the held-out rule at its boundary,
page and paragraph deduplication, an empty held-out split refused, the prose sample's size limit, odd-sized
members of a .deb, code blocks of exactly --max-code-lines, lead-ins kept when long, signatures dropped on
request, the roles that read as RFC / bpo / gh numbers or keep their own parentheses, unicode substitutions,
and the smallest vocabulary the tokenizer accepts."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from nonstop.train import corpus
from nonstop.train.corpus import CorpusError, Document, build_corpus, clean_documents, is_heldout, prose_sample
from nonstop.train.rst_clean import Block, clean_inline, clean_rst, render_blocks
from nonstop.train.tokenizer import train_tokenizer
from tests.train.test_corpus import _ar, _fake_deb, _tar_xz


def _bucket(doc_id: str) -> int:
    """The split rule as SOURCE.md states it: int.from_bytes(sha256(salt:id)[:4], "big") % 1000."""
    return int.from_bytes(hashlib.sha256(f"nonstop-heldout-v1:{doc_id}".encode()).digest()[:4], "big") % 1000


def test_a_page_in_bucket_permille_is_not_held_out():
    """Held out when the bucket is below permille: bucket 20 is the first one trained on."""
    at = next(f"p{i}" for i in range(100_000) if _bucket(f"p{i}") == 20)
    below = next(f"p{i}" for i in range(100_000) if _bucket(f"p{i}") == 19)
    assert not is_heldout(at, 20) and is_heldout(below, 20)


def test_a_page_identical_to_an_earlier_one_is_dropped():
    page = "\n\n".join(f"Short paragraph number {i} of the page." for i in range(6))  # paragraphs < 100 chars
    docs = clean_documents({"a/one": page, "b/two": page, "c/three": page + "\n\nOne more."}, min_chars=50)
    assert [d.doc_id for d in docs] == ["a/one", "c/three"]


def test_a_long_paragraph_seen_on_an_earlier_page_is_dropped_from_later_ones():
    repeated = "This paragraph is repeated word for word on two pages of the documentation, " * 2
    first = "The first page starts with its own words.\n\n" + repeated
    second = "The second page has other words of its own.\n\n" + repeated
    docs = clean_documents({"a": first, "b": second}, min_chars=10)
    assert repeated.strip() in docs[0].text and repeated.strip() not in docs[1].text
    assert docs[1].text == "The second page has other words of its own."


def test_an_empty_held_out_split_is_refused(tmp_path: Path):
    train_id = next(f"library/p{i}" for i in range(10_000) if not is_heldout(f"library/p{i}"))
    deb = _fake_deb(tmp_path / "python3.11-doc_3.11.2-6_all.deb", {train_id: "Trained"})
    with pytest.raises(CorpusError, match="held-out split is empty"):
        build_corpus(tmp_path / "corpus", deb=deb, cache_dir=tmp_path / "cache")


def test_the_prose_sample_stays_within_max_bytes():
    paragraph = (
        "This paragraph is written as plain English prose so that it looks like prose to the sampler and "
        "is long enough to count as such in every way it checks for."
    )
    docs = [Document(f"d{i}", "\n\n".join([paragraph] * 5)) for i in range(4)]
    sample = prose_sample(docs, max_bytes=1000)
    assert sample.count(paragraph) == 1000 // (len(paragraph) + 2)
    assert len(sample.encode("utf-8")) <= 1000


def test_odd_sized_members_of_a_deb_are_read_past_their_padding(tmp_path: Path):
    """ar pads a member of odd size with one byte: the next header starts after it."""
    control = b"Package: python3.11-doc\nVersion: 1\n"
    data = {"usr/share/doc/python3.11/html/_sources/library/x.rst.txt": b"Title\n=====\n\nSome text.\n"}
    deb = tmp_path / "odd.deb"
    deb.write_bytes(
        _ar(
            {
                "debian-binary": b"2.0\n",
                "odd": b"abc",
                "control.tar.xz": _tar_xz({"control": control}),
                "data.tar.xz": _tar_xz(data),
            }
        )
    )
    fields, files = corpus.read_deb(deb, lambda name: True)
    assert fields["Version"] == "1" and list(files) == list(data)


@pytest.mark.parametrize(("lines", "kept"), [(8, True), (9, False)])
def test_code_blocks_longer_than_max_code_lines_are_dropped(lines, kept):
    code = Block("code", "\n".join(f"x{i} = {i}" for i in range(lines)))
    text = render_blocks([Block("prose", "Some prose."), code], max_code_lines=8)
    assert ("x0 = 0" in text) is kept


def test_only_a_short_lead_in_goes_with_its_dropped_code():
    long_intro = "This sentence introduces the example below and is longer than sixty characters:"
    code = Block("code", "\n".join(f"x{i} = {i}" for i in range(20)))
    assert render_blocks([Block("prose", "Decoding JSON:"), code], max_code_lines=8) == ""
    assert render_blocks([Block("prose", long_intro), code], max_code_lines=8) == long_intro


def test_signatures_are_dropped_when_not_kept():
    rst = ".. function:: dumps(obj, *, indent=None)\n\n   Serialize obj to a JSON formatted string.\n"
    assert "dumps(obj" in clean_rst(rst, keep_signatures=True)
    assert "dumps(obj" not in clean_rst(rst, keep_signatures=False)
    assert "Serialize obj" in clean_rst(rst, keep_signatures=False)


@pytest.mark.parametrize(
    ("markup", "text"),
    [
        (":rfc:`2822#section-3.3`", "RFC 2822"),
        (":issue:`12345`", "bpo-12345"),
        (":gh:`98765`", "gh-98765"),
        (":func:`len()`", "len()"),
        (":meth:`dict.get()`", "dict.get()"),
    ],
)
def test_roles_read_as_sphinx_renders_them(markup, text):
    assert clean_inline(f"See {markup} here.") == f"See {text} here."


def test_unicode_substitutions_read_their_hex_code_points():
    rst = ".. |copy| unicode:: U+000A9\n\nCopyright |copy| 2023 the authors, in a page long enough.\n"
    assert "Copyright \u00a9 2023" in clean_rst(rst)


def test_a_vocabulary_without_room_for_every_byte_and_the_special_tokens_is_refused():
    with pytest.raises(ValueError, match="at least 259"):
        train_tokenizer(["some text"], vocab_size=258)
