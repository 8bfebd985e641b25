"""The README and docs/ point only inside the repository, at files that exist: every relative link, and
every file path written in inline backticks (a bare file name in the package its paragraph describes)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.(?:py|md|json|toml|txt)")


TREES = (ROOT / "nonstop", ROOT / "bench", ROOT / "tests", ROOT / "docs")
FOLDER = re.compile(r"([\w.-]+(?:/[\w.-]+)*)/")


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def _folders(spans: list[str], doc: Path) -> set[Path]:
    """The package folders ``spans`` name: ``server/``, ``nonstop/dist``, or the folder of a path such as
    ``dist/shard.py`` (from the repository, ``nonstop/``, the document, or a sub-package: ``tiling/``)."""
    names = []
    for span in spans:
        if FOLDER.fullmatch(span):
            names.append(span[:-1])
        elif "/" in span and (ROOT / span).is_dir():
            names.append(span)
        names += [p.rsplit("/", 1)[0] for p in PATH.findall(span) if "/" in p]
    out = set()
    for name in names:
        out.update(base / name for base in (ROOT, ROOT / "nonstop", doc.parent) if (base / name).is_dir())
        for tree in TREES:
            out.update(d for d in tree.glob(f"**/{name}") if d.is_dir() and "__pycache__" not in d.parts)
    return out


def _blocks(text: str):
    """(paragraph or table row, the section holding it) of a document's prose."""
    for section in re.split(r"\n(?=#)", text):
        for paragraph in re.split(r"\n\s*\n|\n(?=\|)", section):
            yield paragraph, section


def _bare_file_exists(name: str, paragraph: str, section: str, text: str, doc: Path) -> bool:
    """A bare file name is read relative to its package: the folders its paragraph and section name (else
    those the document names), the top of the package and the document's folder. It must lie directly in
    one of them, so ``chat.py`` in a paragraph about ``server/`` cannot match ``commands/chat.py``."""
    scope = _folders(_spans(paragraph) + _spans(section), doc) or _folders(_spans(text), doc)
    return any((folder / name).is_file() for folder in scope | {ROOT, ROOT / "nonstop", doc.parent})


def _exists(target: str, doc: Path) -> bool:
    """A path from the repository, ``nonstop/``, ``bench/``, the document or a sub-package (``codegen/plan.py``
    in a page about the megakernel)."""
    bases = (ROOT, ROOT / "nonstop", ROOT / "bench", doc.parent)
    return any((base / target).exists() for base in bases) or any((ROOT / "nonstop").glob(f"**/{target}"))


def test_docs_reference_files_that_exist():
    for doc in DOCS:
        text = doc.read_text()
        assert not re.search(r"(?<![\w.])/(work|root|home|tmp)/", text), f"{doc.name}: a path outside the repository"
        plain = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))  # links outside code
        for link in re.findall(r"\]\(([^)#]+)\)", plain):
            if not link.startswith(("http://", "https://")):
                assert (doc.parent / link).exists(), f"{doc.name}: broken link {link}"
        prose = re.sub(r"```.*?```", "", text, flags=re.S)  # commands in code blocks may name outputs
        for paragraph, section in _blocks(prose):
            for span in _spans(paragraph):
                if span.startswith(("~", "$")):  # a path in the user's home or environment, not the repository's
                    continue
                for path in PATH.findall(span):
                    if Path(path).stem.isupper():  # FILE.py in a usage line stands for the user's file
                        continue
                    if "/" in path:
                        assert _exists(path, doc), f"{doc.name}: `{span}` names a file that does not exist"
                    elif path.endswith((".py", ".md")):
                        assert _bare_file_exists(path, paragraph, section, prose, doc), (
                            f"{doc.name}: `{span}` names no file of the package its paragraph describes"
                        )


def test_a_bare_file_name_is_read_in_its_package(tmp_path):
    """``chat.py`` beside ``server/`` is not ``commands/chat.py``; beside ``commands/`` it is."""
    doc = ROOT / "docs" / "architecture.md"
    server = "The server (`server/`) templates chat messages in `chat.py`."
    assert not _bare_file_exists("chat.py", server, server, server, doc)
    commands = server.replace("server/", "commands/")
    assert _bare_file_exists("chat.py", commands, commands, commands, doc)
    assert _bare_file_exists("chat_template.py", "`engine/`", "", "", doc)
