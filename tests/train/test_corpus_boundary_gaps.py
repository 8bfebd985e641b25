"""Corpus-building boundaries a second mutation audit found unpinned: a repeated paragraph of exactly
DEDUP_MIN_CHARS characters, a page of exactly min_chars, the newest cached package, and a label defined on
two pages (the first page in sorted order names it)."""

from __future__ import annotations

import os
from pathlib import Path

from nonstop.train import corpus
from nonstop.train.corpus import DEDUP_MIN_CHARS, clean_documents


def test_a_repeated_paragraph_of_exactly_the_dedup_length_is_dropped():
    """Catches dedup applied only to paragraphs longer than DEDUP_MIN_CHARS: a 100-character paragraph seen on
    an earlier page counts as long and is dropped from the later one."""
    repeated = ("Exactly one hundred characters of prose, repeated on two pages, " * 2)[:DEDUP_MIN_CHARS]
    assert len(repeated) == DEDUP_MIN_CHARS and repeated == repeated.strip()
    docs = clean_documents(
        {"a": "Page one opens here.\n\n" + repeated, "b": "Page two opens here.\n\n" + repeated}, min_chars=10
    )
    assert repeated in docs[0].text and docs[1].text == "Page two opens here."


def test_a_page_of_exactly_min_chars_is_kept():
    """Catches pages of exactly min_chars dropped as tiny: only shorter pages are."""
    text = "A page whose cleaned text is exactly as long as the minimum."
    docs = clean_documents({"short": text[:-1], "exact": text}, min_chars=len(text))
    assert [d.doc_id for d in docs] == ["exact"]


def test_the_newest_cached_package_is_used(tmp_path: Path):
    """Catches find_cached_deb returning the oldest download: of two cached packages, the one with the later
    modification time is reused."""
    old = tmp_path / "python3.11-doc_3.11.2-5_all.deb"
    new = tmp_path / "python3.11-doc_3.11.2-6_all.deb"
    for path, mtime in ((new, 2_000_000_000), (old, 1_000_000_000)):
        path.write_bytes(b"!<arch>\n")
        os.utime(path, (mtime, mtime))
    assert corpus.find_cached_deb("python3.11-doc", tmp_path) == new


def test_a_label_defined_on_two_pages_reads_as_the_first_pages_title():
    """Catches the label table keeping the last definition: pages are read in sorted id order and the first
    definition of a label wins, so a reference reads as page "a"'s section title."""
    first = ".. _shared:\n\nAlpha Section Title\n===================\n\nThe first page has its own long body text."
    second = ".. _shared:\n\nBeta Section Title\n==================\n\nThe second page has its own long body text."
    third = "Another page refers to :ref:`shared` in a sentence of its own."
    docs = clean_documents({"a": first, "b": second, "c": third}, min_chars=10)
    text = {d.doc_id: d.text for d in docs}["c"]
    assert "Alpha Section Title" in text and "Beta" not in text
