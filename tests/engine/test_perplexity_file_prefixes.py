"""``nonstop perplexity --max-tokens`` reads a file by prefixes (``commands.perplexity.FilePrefixes``): it read
and decoded the whole file first (a 300 MB file with --max-tokens 50 peaked near 1 GB; a corpus of gigabytes
was killed for memory), though only a prefix is tokenized. The prefixes must be exactly the whole file's text
cut (``read_text``'s decoding: a byte-order mark dropped, multi-byte characters across chunk ends), and a
bad byte must be named at its offset in the file."""

from __future__ import annotations

import random

import pytest

from nonstop.cli import main
from nonstop.commands import perplexity as command
from nonstop.engine.perplexity import leading_token_ids

ALPHABET = "ab \n\r\té€𝄞中"  # 1-, 2-, 3- and 4-byte characters


@pytest.mark.parametrize("seed", range(6))
def test_prefixes_are_the_whole_texts_cut(tmp_path, monkeypatch, seed):
    """Catches a character split between two chunks (decoded as two replacement characters or an error), a BOM
    kept, a prefix past the end marked not whole, or characters lost between reads."""
    rng = random.Random(seed)
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", rng.choice([1, 2, 3, 5, 7]))
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 60)))
    f = tmp_path / "t.txt"
    f.write_bytes((b"\xef\xbb\xbf" if seed % 2 else b"") + text.encode())
    assert command.read_text(f) == text  # the reference decoding
    read = command.FilePrefixes(f)
    sizes = [rng.randrange(0, len(text) + 3) for _ in range(8)]
    for n in sorted(sizes) + [None]:  # leading_token_ids asks for growing prefixes, then maybe all
        prefix, whole = read(n)
        assert prefix == (text if n is None else text[:n])
        assert whole == (n is None or n >= len(text)), (n, len(text))


def test_a_prefix_reads_no_more_of_the_file_than_it_needs(tmp_path, monkeypatch):
    """Catches the whole file read for a prefix: 40 chunks of text, a prefix of 3 chunks' characters reads 4."""
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", 1000)
    f = tmp_path / "t.txt"
    f.write_text("x" * 40_000)
    read = command.FilePrefixes(f)
    prefix, whole = read(3000)
    assert prefix == "x" * 3000 and not whole
    assert read.offset <= 4000


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"])
@pytest.mark.parametrize("chunk", [1, 4, 1 << 20])
def test_a_bad_byte_is_named_at_its_offset_in_the_file(tmp_path, monkeypatch, bom, chunk):
    """Catches the offset counted from the chunk or past the byte-order mark (read_text named byte 2 for the
    bad byte at offset 5 of a file starting with a BOM)."""
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", chunk)
    f = tmp_path / "t.txt"
    data = bom + "héllo wörld".encode() + b"\xff" + b"tail" * 10
    f.write_bytes(data)
    at = data.index(b"\xff")
    with pytest.raises(ValueError, match=f"at byte {at}\\)"):
        command.read_text(f)
    with pytest.raises(ValueError, match=f"at byte {at}\\)"):
        command.FilePrefixes(f)(len(data))


def test_leading_ids_of_a_file_read_by_prefixes_are_the_texts(tmp_path, monkeypatch):
    """The ids ``leading_token_ids`` finds reading a file by prefixes are those it finds in the text."""
    monkeypatch.setattr(command, "PREFIX_CHUNK_BYTES", 3)
    rng = random.Random(7)
    text = "".join(rng.choice(ALPHABET) for _ in range(20_000))
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")

    def encode(t):
        return [ord(c) for c in t]

    for count in (1, 700, 19_999, 20_000, 50_000):
        assert leading_token_ids(encode, command.FilePrefixes(f), count) == leading_token_ids(encode, text, count)


def test_max_tokens_scores_a_file_with_a_bad_byte_past_what_it_reads(tmp_path, capsys):
    """With --max-tokens only a prefix is read: bytes that are not UTF-8 far past it are never decoded (the
    file is scored, as its prefix is), while without --max-tokens the whole file must be text."""
    from tests.engine.tiny_models import synth_checkpoint

    model = synth_checkpoint("llama", tmp_path / "m")
    f = tmp_path / "t.txt"
    f.write_bytes(b"the quick brown fox " * 60_000 + b"\xff")  # past the first chunk read (1 MiB)
    argv = ["perplexity", "-m", str(model), str(f), "--tokenizer", "bytes", "--context", "32"]
    assert main([*argv, "--max-tokens", "40"]) == 0
    assert "tokens scored: 40" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2 and f"at byte {1_200_000})" in capsys.readouterr().err
