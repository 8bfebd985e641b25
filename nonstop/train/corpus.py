"""Build an offline English training corpus from the Python documentation.

The corpus comes from Debian's ``python3.11-doc`` package, which ships the
reStructuredText sources of the CPython documentation as
``usr/share/doc/python3.11/html/_sources/**/*.rst.txt``.  The documentation is
licensed under the PSF License Agreement (see ``SOURCE.md`` written next to
the corpus, and the package's own ``copyright`` file, copied as ``COPYRIGHT``).

Pipeline:

1. fetch the ``.deb`` with ``apt-get download`` into a cache directory (or
   use one given with ``--deb``); a cached download is reused;
2. read the reST sources straight out of the package (pure Python: ``ar`` +
   ``tarfile``; ``dpkg-deb`` is only needed for zstd-compressed packages);
3. convert each page to plain prose with :mod:`nonstop.train.rst_clean`;
4. deduplicate (whole pages, and repeated paragraphs of 100+ characters);
5. split by page: a page is held out when a salted SHA-256 of its id falls in
   the lowest ``heldout_permille`` thousandths (2 % by default);
6. write ``train.txt``, ``heldout.txt``, ``manifest.tsv``, ``SOURCE.md`` and
   ``COPYRIGHT`` to the output directory.

In ``train.txt`` and ``heldout.txt`` paragraphs are separated by a blank line
and every document is followed by a line holding only :data:`DOC_SEPARATOR`
(``<|eos|>``, the tokenizer's end-of-sequence token).  :func:`iter_documents`
reads the files back.

Run as ``python -m nonstop.train.corpus --out build/corpus``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nonstop.train.rst_clean import clean_rst, collect_labels

DEFAULT_PACKAGE = "python3.11-doc"
DEFAULT_CACHE = Path("build/cache")
DOC_SEPARATOR = "<|eos|>"
HELDOUT_PERMILLE = 20
SPLIT_SALT = "nonstop-heldout-v1"
MIN_DOC_CHARS = 500
DEDUP_MIN_CHARS = 100
DEFAULT_MAX_CODE_LINES = 8
HELDOUT_SAMPLE_PATH = Path(__file__).resolve().parents[1] / "assets" / "heldout_sample.txt"

_SOURCES_MARKER = "/_sources/"
_SOURCE_SUFFIXES = (".rst.txt", ".txt")


# what a truncated or garbled package raises while its ar members and tar streams are read
UNREADABLE_PACKAGE = (
    tarfile.TarError,
    EOFError,
    ValueError,  # a garbled ar header's size
    zlib.error,
    lzma.LZMAError,
    OSError,  # a cut gzip / bzip2 stream
    subprocess.CalledProcessError,  # dpkg-deb refusing a zstd package
)


class CorpusError(RuntimeError):
    """A corpus build step failed; the message says what to do about it."""


@dataclass(frozen=True)
class Document:
    """One cleaned documentation page."""

    doc_id: str  # path below ``_sources`` without suffix, e.g. ``library/json``
    text: str


@dataclass
class PackageInfo:
    """Provenance of the downloaded package."""

    package: str
    version: str
    source: str
    homepage: str
    maintainer: str
    deb_name: str
    sha256: str
    url: str
    copyright_text: str = ""


def log(message: str) -> None:
    """Print a progress line."""
    print(f"[corpus] {message}", flush=True)


# --------------------------------------------------------------------------
# Download


def manual_download_help(package: str) -> str:
    """Instructions for fetching the package by hand."""
    return (
        f"Download the package manually, then pass its path with --deb PATH:\n"
        f"  * on Debian/Ubuntu: `apt-get update && apt-get download {package}`\n"
        f"  * or from a browser: https://packages.debian.org/bookworm/all/{package}/download\n"
        f"    (the same file is in the pool/main/ directory of every Debian mirror)."
    )


def find_cached_deb(package: str, cache_dir: Path) -> Path | None:
    """Return a previously downloaded ``.deb`` for ``package`` (newest first), if any."""
    candidates = sorted(cache_dir.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


def _apt_uri(package: str) -> str:
    """The archive URL ``apt-get`` would download ``package`` from ('' if unknown)."""
    try:
        result = subprocess.run(
            ["apt-get", "download", "--print-uris", package],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in result.stdout.splitlines():
        if line.startswith("'"):
            return urllib.parse.unquote(line.split("'")[1])
    return ""


def download_deb(package: str, cache_dir: Path) -> Path:
    """Fetch ``package`` with ``apt-get download`` into ``cache_dir`` (reusing a cached file)."""
    cached = find_cached_deb(package, cache_dir)
    if cached is not None:
        log(f"using cached {cached}")
        return cached
    if shutil.which("apt-get") is None:
        raise CorpusError(f"apt-get is not available on this machine.\n{manual_download_help(package)}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading {package} with apt-get into {cache_dir} ...")
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="download-") as tmp:
        try:
            result = subprocess.run(
                ["apt-get", "download", package],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CorpusError(f"apt-get download {package} failed: {exc}\n{manual_download_help(package)}") from exc
        debs = sorted(Path(tmp).glob("*.deb"))
        if result.returncode != 0 or not debs:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise CorpusError(
                f"apt-get download {package} failed (exit code {result.returncode}):\n{detail}\n"
                f"{manual_download_help(package)}"
            )
        target = cache_dir / urllib.parse.unquote(debs[0].name)
        debs[0].replace(target)
    uri = _apt_uri(package)
    if uri:
        target.with_suffix(".url").write_text(uri + "\n", encoding="utf-8")
    log(f"downloaded {target} ({target.stat().st_size:,} bytes)")
    return target


# --------------------------------------------------------------------------
# Reading the package


def _ar_members(blob: bytes) -> dict[str, bytes]:
    """Split a Debian package (an ``ar`` archive) into its members."""
    if not blob.startswith(b"!<arch>\n"):
        raise CorpusError("not a Debian package (missing ar header)")
    members: dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(blob):
        header = blob[pos : pos + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        start = pos + 60
        if start + size > len(blob):
            raise ValueError(f"cut short: its member {name} needs {size} bytes, {len(blob) - start} are there")
        members[name] = blob[start : start + size]
        pos = start + size + (size % 2)
    return members


def _tar_for(members: dict[str, bytes], prefix: str, deb_path: Path) -> tarfile.TarFile:
    """Open the ``control.tar.*`` or ``data.tar.*`` member as a streaming tar file."""
    name = next((n for n in members if n.startswith(prefix)), None)
    if name is None:
        raise CorpusError(f"{deb_path}: no {prefix}* member")
    if name.endswith(".zst"):
        if prefix != "data.tar" or shutil.which("dpkg-deb") is None:
            raise CorpusError(f"{deb_path}: {name} is zstd-compressed; install dpkg-deb (package dpkg) to read it")
        command = ["dpkg-deb", "--fsys-tarfile", str(deb_path)]
        tar_bytes = subprocess.run(command, capture_output=True, check=True).stdout
        return tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r|")
    return tarfile.open(fileobj=io.BytesIO(members[name]), mode="r|*")


def read_deb(deb_path: Path, want: Callable[[str], bool]) -> tuple[dict[str, str], dict[str, bytes]]:
    """Return the package's control fields and the regular files selected by ``want``.

    File names are given without the leading ``./``.
    """
    try:
        blob = deb_path.read_bytes()
    except OSError as exc:
        raise CorpusError(f"cannot read {deb_path}: {exc}") from exc
    try:
        return _read_members(deb_path, _ar_members(blob), want)
    except UNREADABLE_PACKAGE as exc:
        raise CorpusError(f"{deb_path}: not a readable Debian package ({type(exc).__name__}: {exc})") from None


def _read_members(
    deb_path: Path, members: dict[str, bytes], want: Callable[[str], bool]
) -> tuple[dict[str, str], dict[str, bytes]]:
    """``read_deb``'s work on the package's ``ar`` members."""
    control: dict[str, str] = {}
    with _tar_for(members, "control.tar", deb_path) as tar:
        for info in tar:
            if info.isfile() and info.name.lstrip("./") == "control":
                handle = tar.extractfile(info)
                assert handle is not None
                for line in handle.read().decode("utf-8", "replace").splitlines():
                    if ":" in line and not line.startswith(" "):
                        key, value = line.split(":", 1)
                        control[key.strip()] = value.strip()
    files: dict[str, bytes] = {}
    with _tar_for(members, "data.tar", deb_path) as tar:
        for info in tar:
            name = info.name.removeprefix("./")
            if info.isfile() and want(name):
                handle = tar.extractfile(info)
                assert handle is not None
                files[name] = handle.read()
    return control, files


def _pool_url(control: dict[str, str], deb_name: str) -> str:
    """Best-effort Debian archive URL when apt did not tell us."""
    source = control.get("Source", control.get("Package", "")).split()[0]
    prefix = source[:4] if source.startswith("lib") else source[:1]
    return f"https://deb.debian.org/debian/pool/main/{prefix}/{source}/{deb_name}"


def load_package(deb_path: Path) -> tuple[PackageInfo, dict[str, str]]:
    """Read provenance and the reST sources (``doc_id -> text``) from a ``.deb``."""
    log(f"reading {deb_path} ...")

    def wanted(name: str) -> bool:
        is_source = _SOURCES_MARKER in name and name.endswith(_SOURCE_SUFFIXES)
        return is_source or (name.startswith("usr/share/doc/") and name.endswith("/copyright"))

    control, files = read_deb(deb_path, wanted)
    package = control.get("Package", deb_path.name.split("_")[0])
    sources: dict[str, str] = {}
    for name, data in files.items():
        if _SOURCES_MARKER not in name:
            continue
        doc_id = name.split(_SOURCES_MARKER, 1)[1]
        for suffix in _SOURCE_SUFFIXES:
            if doc_id.endswith(suffix):
                doc_id = doc_id[: -len(suffix)]
                break
        sources[doc_id] = data.decode("utf-8", "replace")
    if not sources:
        raise CorpusError(f"{deb_path}: no documentation sources (*{_SOURCES_MARKER}*.rst.txt) found")
    copyright_name = f"usr/share/doc/{package}/copyright"
    copyright_text = files.get(copyright_name, b"").decode("utf-8", "replace")
    url_file = deb_path.with_suffix(".url")
    url = url_file.read_text(encoding="utf-8").strip() if url_file.exists() else _pool_url(control, deb_path.name)
    info = PackageInfo(
        package=package,
        version=control.get("Version", "unknown"),
        source=control.get("Source", package),
        homepage=control.get("Homepage", ""),
        maintainer=control.get("Maintainer", ""),
        deb_name=deb_path.name,
        sha256=hashlib.sha256(deb_path.read_bytes()).hexdigest(),
        url=url,
        copyright_text=copyright_text,
    )
    log(f"{info.package} {info.version}: {len(sources)} source pages, {sum(map(len, sources.values())):,} characters")
    return info, sources


# --------------------------------------------------------------------------
# Cleaning, deduplication and split


def clean_documents(
    sources: dict[str, str],
    *,
    max_code_lines: int | None = DEFAULT_MAX_CODE_LINES,
    keep_signatures: bool = True,
    min_chars: int = MIN_DOC_CHARS,
) -> list[Document]:
    """Clean every page, drop tiny pages, and deduplicate pages and long paragraphs.

    Pages are processed in sorted ``doc_id`` order so the result is
    deterministic; the first occurrence of a repeated paragraph is kept.
    """
    labels: dict[str, str] = {}
    for doc_id in sorted(sources):
        for label, title in collect_labels(sources[doc_id]).items():
            labels.setdefault(label, title)
    seen_paragraphs: set[bytes] = set()
    seen_docs: set[bytes] = set()
    documents: list[Document] = []
    for doc_id in sorted(sources):
        text = clean_rst(sources[doc_id], labels=labels, max_code_lines=max_code_lines, keep_signatures=keep_signatures)
        kept: list[str] = []
        for paragraph in text.split("\n\n"):
            if len(paragraph.strip()) >= DEDUP_MIN_CHARS:
                digest = hashlib.sha1(paragraph.strip().encode("utf-8")).digest()
                if digest in seen_paragraphs:
                    continue
                seen_paragraphs.add(digest)
            kept.append(paragraph)
        text = "\n\n".join(kept).strip()
        digest = hashlib.sha1(text.encode("utf-8")).digest()
        if len(text) < min_chars or digest in seen_docs:
            continue
        seen_docs.add(digest)
        documents.append(Document(doc_id, text))
    return documents


def is_heldout(doc_id: str, permille: int = HELDOUT_PERMILLE) -> bool:
    """Stable split rule: salted SHA-256 of the id, first 4 bytes mod 1000 < ``permille``."""
    digest = hashlib.sha256(f"{SPLIT_SALT}:{doc_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < permille


def split_documents(
    documents: list[Document], permille: int = HELDOUT_PERMILLE
) -> tuple[list[Document], list[Document]]:
    """Split documents into (train, held-out) with :func:`is_heldout`; order is preserved."""
    train = [doc for doc in documents if not is_heldout(doc.doc_id, permille)]
    heldout = [doc for doc in documents if is_heldout(doc.doc_id, permille)]
    return train, heldout


def format_documents(documents: list[Document]) -> str:
    """Serialise documents: text, newline, :data:`DOC_SEPARATOR`, newline, for each."""
    return "".join(f"{doc.text}\n{DOC_SEPARATOR}\n" for doc in documents)


def iter_documents(path: Path) -> Iterator[str]:
    """Yield the document texts of a ``train.txt`` / ``heldout.txt`` file (UTF-8; a ``ValueError`` naming the
    file where it is not, or is no regular file)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise ValueError(f"{path}: not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for chunk in text.split(f"\n{DOC_SEPARATOR}\n"):
        if chunk.strip():
            yield chunk


# --------------------------------------------------------------------------
# Held-out prose sample


_CODE_CHARS = set("()[]{}=_<>*`|\\/#$@%^~")


def looks_like_prose(paragraph: str) -> bool:
    """Heuristic: a long, sentence-final, nearly symbol-free line of words."""
    if "\n" in paragraph or paragraph.startswith(" ") or len(paragraph) < 150:
        return False
    if paragraph[-1] not in ".!?" or len(paragraph.split()) < 20:
        return False
    wordy = sum(ch.isalpha() or ch == " " for ch in paragraph)
    symbols = sum(ch in _CODE_CHARS for ch in paragraph)
    return wordy >= 0.85 * len(paragraph) and symbols <= 0.01 * len(paragraph)


def prose_sample(documents: list[Document], max_bytes: int = 32_000) -> str:
    """Prose paragraphs from ``documents`` (in order), at most ``max_bytes`` of UTF-8."""
    chosen: list[str] = []
    size = 0
    for doc in documents:
        for paragraph in doc.text.split("\n\n"):
            if not looks_like_prose(paragraph):
                continue
            cost = len(paragraph.encode("utf-8")) + 2
            if size + cost > max_bytes:
                return "\n\n".join(chosen) + "\n"
            chosen.append(paragraph)
            size += cost
    return "\n\n".join(chosen) + "\n"


def load_heldout_sample() -> str:
    """The committed held-out English sample (``nonstop/assets/heldout_sample.txt``)."""
    return HELDOUT_SAMPLE_PATH.read_text(encoding="utf-8")


# --------------------------------------------------------------------------
# Provenance


def psf_license_text(copyright_text: str) -> str:
    """Extract the PSF License Agreement section from the package's copyright file."""
    start = copyright_text.find("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2")
    end = copyright_text.find("BEOPEN.COM LICENSE AGREEMENT", start)
    if start < 0 or end < 0:
        return ""
    return copyright_text[start:end].strip() + "\n"


CHANGES_SUMMARY = """\
Summary of changes made to the original documentation (as the PSF License
Agreement, clause 3, asks of derivative works): the reStructuredText sources
were converted to plain text by `nonstop/train/rst_clean.py` -- markup,
comments, index entries, link targets, tables and bookkeeping directives were
removed; roles and links were replaced by their text; paragraphs were unwrapped
onto single lines; code blocks longer than a few lines were dropped; pages
shorter than 500 characters and repeated paragraphs were removed."""


def source_markdown(info: PackageInfo, stats: dict[str, int], permille: int, max_code_lines: int | None) -> str:
    """The ``SOURCE.md`` text describing provenance, licence and split."""
    code_rule = "all kept" if max_code_lines is None else f"blocks of more than {max_code_lines} lines dropped"
    caveat = (
        ""
        if info.package.startswith("python3")
        else f"\n> NOTE: the licence section was written for Debian's python3.x-doc packages;\n"
        f"> check `COPYRIGHT` for the actual terms of `{info.package}`.\n"
    )
    return f"""# Training corpus: Python documentation (Debian `{info.package}`)
{caveat}
## Source

- Debian binary package: `{info.package}`, version `{info.version}` (source package `{info.source}`)
- File: `{info.deb_name}`, SHA-256 `{info.sha256}`
- Downloaded from: {info.url}
- Upstream: {info.homepage or "https://www.python.org/"} (CPython documentation, `Doc/` directory)
- Debian maintainer: {info.maintainer}
- Content used: the reStructuredText sources shipped for the HTML docs,
  `usr/share/doc/python3.11/html/_sources/**/*.rst.txt`

## Licence

The package's `copyright` file (copied next to this file as `COPYRIGHT`)
puts Python and "its associated documentation" under the **Python Software
Foundation License Version 2** (PSF-2.0, a permissive, OSI-approved licence);
it lists no other licence for the documentation sources.  The documentation
itself says (`license.rst`): "Python software and documentation are licensed
under the PSF License Agreement", and, since Python 3.8.6, examples, recipes
and other code in the documentation are dual licensed under the PSF License
Agreement and the Zero-Clause BSD licence.

Copyright notice (from `copyright.rst`): Copyright (c) 2001-2023 Python
Software Foundation. All rights reserved. Copyright (c) 2000 BeOpen.com.
Copyright (c) 1995-2000 Corporation for National Research Initiatives.
Copyright (c) 1991-1995 Stichting Mathematisch Centrum.

{CHANGES_SUMMARY}

## Files and split

- `train.txt`, `heldout.txt`: one document per documentation page; paragraphs
  separated by a blank line; each document followed by a line `{DOC_SEPARATOR}`.
- Held-out rule: a page (id = path below `_sources`, e.g. `library/json`) is
  held out when `int.from_bytes(sha256("{SPLIT_SALT}:" + id)[:4], "big") % 1000 < {permille}`
  (about {permille / 10:g} % of pages).  The rule depends only on the page id.
- Code: {code_rule}; object signatures kept.
- `manifest.tsv`: page id, split, bytes, paragraphs.

## Statistics

- source pages: {stats["source_pages"]}, kept after cleaning and deduplication: {stats["documents"]}
- corpus text: {stats["bytes"]:,} bytes (UTF-8)
- train: {stats["train_documents"]} documents, {stats["train_bytes"]:,} bytes
- held-out: {stats["heldout_documents"]} documents, {stats["heldout_bytes"]:,} bytes

Produced by `python -m nonstop.train.corpus`.
"""


def sample_source_markdown(info: PackageInfo, documents: list[Document]) -> str:
    """Provenance and licence notice for the committed held-out sample."""
    pages = ", ".join(f"`{doc.doc_id}`" for doc in documents)
    return f"""# heldout_sample.txt

Prose paragraphs cut from the held-out split of the training corpus built by
`python -m nonstop.train.corpus` (pages: {pages}), taken from the CPython
documentation as shipped in Debian `{info.package}` {info.version}.

Copyright (c) 2001-2023 Python Software Foundation. All rights reserved.
Licensed under the PSF License Agreement (below).

{CHANGES_SUMMARY} Only long prose paragraphs were kept for this sample.

```
{psf_license_text(info.copyright_text).rstrip()}
```
"""


# --------------------------------------------------------------------------
# Driver


def build_corpus(
    out_dir: Path,
    *,
    deb: Path | None = None,
    cache_dir: Path = DEFAULT_CACHE,
    package: str = DEFAULT_PACKAGE,
    permille: int = HELDOUT_PERMILLE,
    max_code_lines: int | None = DEFAULT_MAX_CODE_LINES,
    keep_signatures: bool = True,
    sample_path: Path | None = None,
    sample_bytes: int = 32_000,
) -> dict[str, int]:
    """Run the whole pipeline and return size statistics."""
    if deb is not None and not deb.is_file():
        raise CorpusError(f"--deb {deb}: no such file.\n{manual_download_help(package)}")
    deb_path = deb if deb is not None else download_deb(package, cache_dir)
    info, sources = load_package(deb_path)
    log("cleaning reStructuredText ...")
    documents = clean_documents(sources, max_code_lines=max_code_lines, keep_signatures=keep_signatures)
    train, heldout = split_documents(documents, permille)
    if not heldout:
        raise CorpusError("the held-out split is empty; raise --heldout-permille")
    out_dir.mkdir(parents=True, exist_ok=True)
    train_text, heldout_text = format_documents(train), format_documents(heldout)
    (out_dir / "train.txt").write_text(train_text, encoding="utf-8")
    (out_dir / "heldout.txt").write_text(heldout_text, encoding="utf-8")
    manifest = ["doc_id\tsplit\tbytes\tparagraphs"]
    for doc in documents:
        split = "heldout" if is_heldout(doc.doc_id, permille) else "train"
        manifest.append(f"{doc.doc_id}\t{split}\t{len(doc.text.encode('utf-8'))}\t{doc.text.count(chr(10) * 2) + 1}")
    (out_dir / "manifest.tsv").write_text("\n".join(manifest) + "\n", encoding="utf-8")
    stats = {
        "source_pages": len(sources),
        "documents": len(documents),
        "bytes": sum(len(doc.text.encode("utf-8")) for doc in documents),
        "train_documents": len(train),
        "train_bytes": len(train_text.encode("utf-8")),
        "heldout_documents": len(heldout),
        "heldout_bytes": len(heldout_text.encode("utf-8")),
    }
    (out_dir / "SOURCE.md").write_text(source_markdown(info, stats, permille, max_code_lines), encoding="utf-8")
    if info.copyright_text:
        (out_dir / "COPYRIGHT").write_text(info.copyright_text, encoding="utf-8")
    log(
        f"wrote {out_dir}: {stats['documents']} documents, {stats['bytes']:,} bytes; "
        f"train {stats['train_documents']} docs / {stats['train_bytes']:,} bytes, "
        f"held-out {stats['heldout_documents']} docs / {stats['heldout_bytes']:,} bytes"
    )
    if sample_path is not None:
        sample = prose_sample(heldout, sample_bytes)
        sample_path.parent.mkdir(parents=True, exist_ok=True)
        sample_path.write_text(sample, encoding="utf-8")
        used = [doc for doc in heldout if any(p in sample for p in doc.text.split("\n\n") if looks_like_prose(p))]
        sample_path.with_suffix(".SOURCE.md").write_text(sample_source_markdown(info, used), encoding="utf-8")
        log(f"wrote held-out prose sample {sample_path} ({len(sample.encode('utf-8')):,} bytes)")
    return stats


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m nonstop.train.corpus",
        description="Build the offline English training corpus from Debian's Python documentation package.",
    )
    parser.add_argument("--out", type=Path, default=Path("build/corpus"), help="output directory")
    parser.add_argument("--deb", type=Path, help="use this already-downloaded .deb instead of apt-get")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache directory")
    parser.add_argument("--package", default=DEFAULT_PACKAGE, help="Debian package to download")
    parser.add_argument("--heldout-permille", type=int, default=HELDOUT_PERMILLE, help="held-out share in 1/1000")
    parser.add_argument(
        "--max-code-lines",
        type=int,
        default=DEFAULT_MAX_CODE_LINES,
        help="drop code blocks longer than this (0 drops all code, -1 keeps all)",
    )
    parser.add_argument("--no-signatures", action="store_true", help="drop API signature lines")
    parser.add_argument("--sample", type=Path, help="also write a held-out prose sample to this file")
    parser.add_argument("--sample-bytes", type=int, default=32_000, help="size limit of --sample")
    args = parser.parse_args(argv)
    if not 0 < args.heldout_permille < 1000:  # both splits must get documents
        parser.error(f"--heldout-permille must be in 1..999, got {args.heldout_permille}")
    if args.sample_bytes < 1:
        parser.error(f"--sample-bytes must be >= 1, got {args.sample_bytes}")
    try:
        build_corpus(
            args.out,
            deb=args.deb,
            cache_dir=args.cache,
            package=args.package,
            permille=args.heldout_permille,
            max_code_lines=None if args.max_code_lines < 0 else args.max_code_lines,
            keep_signatures=not args.no_signatures,
            sample_path=args.sample,
            sample_bytes=args.sample_bytes,
        )
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
