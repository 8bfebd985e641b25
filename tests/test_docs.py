"""The README and docs/ point only inside the repository, at files that exist: every relative link, and
every file path written in inline backticks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*\.(?:py|md|json|toml|txt)")


def _exists(target: str, doc: Path) -> bool:
    """A path from the repository, ``nonstop/``, ``bench/``, the document or a sub-package (``codegen/plan.py``
    in a page about the megakernel); a bare file name anywhere in the package, ``bench/`` or ``docs/`` (a
    table names a module of the package it describes)."""
    if "/" not in target:
        places = (ROOT / "nonstop", ROOT / "bench", ROOT / "docs", ROOT)
        return any(any(place.rglob(target)) for place in places) or (doc.parent / target).exists()
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
        for span in re.findall(r"`([^`]+)`", prose):
            if span.startswith(("~", "$")):  # a path in the user's home or environment, not the repository's
                continue
            for path in PATH.findall(span):
                placeholder = Path(path).stem.isupper()  # FILE.py in a usage line stands for the user's file
                if ("/" in path or path.endswith((".py", ".md"))) and not placeholder:
                    assert _exists(path, doc), f"{doc.name}: `{span}` names a file that does not exist"
