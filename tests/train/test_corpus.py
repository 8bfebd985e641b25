"""Tests for the corpus builder and the reStructuredText cleaner (no network needed)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from nonstop.train import corpus
from nonstop.train.corpus import (
    DOC_SEPARATOR,
    CorpusError,
    Document,
    build_corpus,
    format_documents,
    is_heldout,
    iter_documents,
    load_heldout_sample,
    looks_like_prose,
    split_documents,
)
from nonstop.train.rst_clean import clean_inline, clean_rst

# ---------------------------------------------------------------- cleaner


def test_inline_roles_links_and_emphasis():
    text = (
        "Call :func:`len` or :meth:`~collections.deque.append`, see :pep:`8` and "
        "`the tutorial <https://example.org/tut>`_ for *more* **details** on ``x = [1]``."
    )
    assert clean_inline(text) == ("Call len() or append(), see PEP 8 and the tutorial for more details on x = [1].")


def test_inline_literals_keep_their_markup_characters():
    assert clean_inline("Use ``*args`` and ``:func:`x``` here.") == "Use *args and :func:`x` here."


def test_inline_titled_role_footnote_and_escape():
    text = "A :term:`file object <file-like object>` [#f1]_ uses \\*stars\\* and a\\ b."
    assert clean_inline(text) == "A file object uses *stars* and ab."


def test_headings_comments_index_and_options_are_removed():
    rst = """\
.. _intro:

************
Introduction
************

.. index:: single: spam

.. This is a comment
   spanning two lines.

Spam Section
============

.. function:: spam(eggs, *, ham=None)
   :noindex:

   Return spam made from *eggs*.

   .. versionadded:: 3.2

   .. versionchanged:: 3.4
      The *ham* argument was added.
"""
    text = clean_rst(rst)
    assert text.split("\n\n") == [
        "Introduction",
        "Spam Section",
        "spam(eggs, *, ham=None)",
        "Return spam made from eggs.",
        "New in version 3.2.",
        "Changed in version 3.4: The ham argument was added.",
    ]


def test_tables_are_dropped_and_surrounding_prose_kept():
    rst = """\
Before the tables.

+------+-------+
| a    | b     |
+======+=======+
| 1    | 2     |
+------+-------+

=====  =====
col1   col2
=====  =====
x      y
z      w
=====  =====

.. list-table::
   :header-rows: 1

   * - one
     - two

After the tables.
"""
    assert clean_rst(rst) == "Before the tables.\n\nAfter the tables."


def test_admonitions_lists_and_paragraph_unwrapping():
    rst = """\
This paragraph is
wrapped over three
lines.

.. note::
   Notes keep their text.

* first item
  continues here
* second item

#. numbered
"""
    assert clean_rst(rst).split("\n\n") == [
        "This paragraph is wrapped over three lines.",
        "Note: Notes keep their text.",
        "- first item continues here",
        "- second item",
        "1. numbered",
    ]


def test_literal_blocks_short_kept_long_dropped():
    long_code = "\n".join(f"   line{i} = {i}" for i in range(20))
    rst = f"""\
Short example::

   >>> 1 + 1
   2

Long example::

{long_code}

Trailing prose.
"""
    text = clean_rst(rst, max_code_lines=8)
    assert text == "Short example:\n\n    >>> 1 + 1\n    2\n\nTrailing prose."
    assert "line19" in clean_rst(rst, max_code_lines=None)
    assert ">>>" not in clean_rst(rst, max_code_lines=0)


def test_ref_labels_resolve_to_section_titles():
    rst = """\
.. _tut-intro:

An Informal Introduction
========================

See :ref:`tut-intro` and :ref:`other <tut-intro>`.
"""
    assert clean_rst(rst).split("\n\n")[1] == "See An Informal Introduction and other."


def test_substitutions_and_footnotes():
    rst = """\
.. |tool| replace:: the ``spam`` tool

Use |tool| daily [#]_.

.. [#] Footnotes keep
       their prose.
"""
    assert clean_rst(rst).split("\n\n") == ["Use the spam tool daily.", "Footnotes keep their prose."]


# ---------------------------------------------------------------- split


def _docs(n: int) -> list[Document]:
    return [Document(f"library/page{i}", f"text {i}") for i in range(n)]


def test_split_is_deterministic_disjoint_and_about_two_percent():
    docs = _docs(5000)
    train_a, heldout_a = split_documents(docs)
    train_b, heldout_b = split_documents(list(reversed(docs)))
    ids_a = {d.doc_id for d in heldout_a}
    assert ids_a == {d.doc_id for d in heldout_b}
    assert ids_a.isdisjoint({d.doc_id for d in train_a})
    assert len(train_a) + len(heldout_a) == len(docs)
    assert 0.01 < len(heldout_a) / len(docs) < 0.03
    assert all(is_heldout(doc_id) for doc_id in ids_a)


def test_documents_round_trip_through_the_file_format(tmp_path: Path):
    docs = [Document("a", "First doc.\n\nSecond paragraph."), Document("b", "Another doc.")]
    path = tmp_path / "train.txt"
    path.write_text(format_documents(docs), encoding="utf-8")
    assert list(iter_documents(path)) == [d.text for d in docs]
    assert path.read_text(encoding="utf-8").count(DOC_SEPARATOR) == 2


# ---------------------------------------------------------------- package handling


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _ar(members: dict[str, bytes]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in members.items():
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out += header.encode("ascii") + data + (b"\n" if len(data) % 2 else b"")
    return bytes(out)


def _fake_deb(path: Path, pages: dict[str, str]) -> Path:
    data = {
        f"usr/share/doc/python3.11/html/_sources/{doc_id}.rst.txt": (
            f"{title}\n{'=' * len(title)}\n\n" + f"This page about {title} explains things in plain English. " * 12
        ).encode()
        for doc_id, title in pages.items()
    }
    licence = b"PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2\n...\nBEOPEN.COM LICENSE AGREEMENT\n"
    data["usr/share/doc/python3.11-doc/copyright"] = licence
    control = b"Package: python3.11-doc\nVersion: 3.11.2-6\nSource: python3.11\nHomepage: https://www.python.org/\n"
    path.write_bytes(
        _ar({"debian-binary": b"2.0\n", "control.tar.xz": _tar_xz({"control": control}), "data.tar.xz": _tar_xz(data)})
    )
    return path


def test_build_corpus_from_a_local_deb(tmp_path: Path):
    heldout_id = next(f"library/p{i}" for i in range(10_000) if is_heldout(f"library/p{i}"))
    train_id = next(f"library/p{i}" for i in range(10_000) if not is_heldout(f"library/p{i}"))
    deb = _fake_deb(tmp_path / "python3.11-doc_3.11.2-6_all.deb", {heldout_id: "Held Out", train_id: "Trained"})
    out = tmp_path / "corpus"
    stats = build_corpus(out, deb=deb, cache_dir=tmp_path / "cache")
    assert stats["train_documents"] == 1 and stats["heldout_documents"] == 1
    assert list(iter_documents(out / "heldout.txt"))[0].startswith("Held Out\n\nThis page about Held Out")
    source = (out / "SOURCE.md").read_text(encoding="utf-8")
    assert "python3.11-doc" in source and "3.11.2-6" in source and "PSF" in source
    assert (out / "COPYRIGHT").is_file()
    # Idempotent: a second run gives identical files.
    first = (out / "train.txt").read_bytes()
    build_corpus(out, deb=deb, cache_dir=tmp_path / "cache")
    assert (out / "train.txt").read_bytes() == first


def test_missing_apt_get_gives_manual_instructions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(CorpusError, match="--deb PATH"):
        corpus.download_deb("python3.11-doc", tmp_path / "empty-cache")
    assert corpus.main(["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "empty-cache")]) == 1


def test_cached_deb_is_reused_without_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cached = tmp_path / "python3.11-doc_3.11.2-6_all.deb"
    cached.write_bytes(b"!<arch>\n")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert corpus.download_deb("python3.11-doc", tmp_path) == cached


# ---------------------------------------------------------------- committed sample


def test_heldout_sample_is_plain_english_prose():
    sample = load_heldout_sample()
    assert 20_000 <= len(sample.encode("utf-8")) <= 40_000
    paragraphs = sample.strip().split("\n\n")
    assert len(paragraphs) > 30
    assert all(looks_like_prose(p) for p in paragraphs)
    assert DOC_SEPARATOR not in sample and "``" not in sample and ":func:" not in sample
