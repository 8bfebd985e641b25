"""``FilePrefixes`` (``nonstop perplexity --max-tokens``) refuses the same bytes ``read_text`` refuses, at the
same offset: a character cut by a chunk boundary and then broken, and a character cut by the end of the
file. ``read_text`` (``bytes.decode``) is the reference."""

from __future__ import annotations

import pytest

from nonstop.commands import perplexity as command


def _read_text_error(f) -> str:
    with pytest.raises(ValueError) as refused:
        command.read_text(f)
    return str(refused.value)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
def test_a_broken_character_cut_by_a_chunk_is_named_where_it_starts(tmp_path, monkeypatch, chunk, bom):
    """Catches the offset of a bad byte counted without the bytes of a character the previous chunk cut
    (E4 B8 at offsets 3-4, then 'x': the character at byte 3 is broken; a count from the chunk says 5)."""
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", chunk)
    f = tmp_path / "t.txt"
    f.write_bytes(bom + b"abc\xe4\xb8xyz")
    want = _read_text_error(f)
    assert f"at byte {len(bom) + 3})" in want
    read = command.FilePrefixes(f)
    with pytest.raises(ValueError) as refused:
        for n in range(12):  # growing prefixes, as leading_token_ids asks for them
            read(n)
    assert str(refused.value) == want


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_a_character_cut_by_the_end_of_the_file_is_refused(tmp_path, monkeypatch, chunk):
    """Catches the last chunk decoded as not final: a file ending in E4 B8 (a 3-byte character cut short)
    is not UTF-8 text for ``read_text``; read by prefixes it must be refused as well, not scored with the
    broken character silently dropped."""
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", chunk)
    f = tmp_path / "t.txt"
    f.write_bytes(b"ok\xe4\xb8")
    want = _read_text_error(f)
    assert "at byte 2)" in want
    with pytest.raises(ValueError) as refused:
        command.FilePrefixes(f)(None)
    assert str(refused.value) == want
    with pytest.raises(ValueError):
        command.FilePrefixes(f)(10)
