"""Turn Sphinx-flavoured reStructuredText into plain prose for LM training.

This is not a full reStructuredText parser.  It is a small, line-based
converter that understands the constructs used by the CPython documentation
well enough to keep the English prose and drop the markup noise:

* section titles keep their text, adornment lines (``=====``) are dropped;
* comments, hyperlink targets, substitution definitions, index entries,
  tables (grid, simple and ``list-table``) and bookkeeping directives
  (``module``, ``toctree``, ``audit-event`` ...) are dropped;
* admonitions keep their body, prefixed with a label (``Note: ...``), and
  version notes read as Sphinx renders them (``Changed in version 3.2: ...``);
* object descriptions (``.. function:: f(x)``) keep the signature line and the
  description body;
* inline markup is reduced to its text: ``:func:`len``` becomes ``len()``,
  ```text <url>`_`` becomes ``text``, ``*emphasis*`` becomes ``emphasis``;
* paragraphs are unwrapped onto a single line; code blocks keep their lines,
  indented by four spaces, and can be dropped by length.

The entry point is :func:`clean_rst`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Block", "clean_inline", "clean_rst", "collect_labels", "parse_rst", "render_blocks"]


@dataclass(frozen=True)
class Block:
    """One output unit: ``kind`` is ``"prose"``, ``"title"``, ``"signature"`` or ``"code"``."""

    kind: str
    text: str


# --------------------------------------------------------------------------
# Directive tables

#: Directives dropped together with their whole body.
DROPPED_DIRECTIVES = frozenset(
    """
    index toctree module currentmodule moduleauthor sectionauthor codeauthor
    highlight include literalinclude image figure tabularcolumns list-table
    csv-table table raw contents audit-event audit-event-table availability
    limited-api-list miscnews program default-role role testsetup
    testcleanup productionlist autosummary autofunction autoclass automodule
    """.split()
)

#: Directives whose body is a block of code.
CODE_DIRECTIVES = frozenset("code-block sourcecode code doctest testcode testoutput parsed-literal".split())

#: Admonitions: the body is kept, prefixed by the label.
ADMONITION_LABELS = {
    "note": "Note:",
    "warning": "Warning:",
    "important": "Important:",
    "caution": "Caution:",
    "tip": "Tip:",
    "hint": "Hint:",
    "attention": "Attention:",
    "danger": "Danger:",
    "error": "Error:",
    "seealso": "See also:",
    "impl-detail": "CPython implementation detail:",
}

#: Directives whose body is kept as-is, without any label.
TRANSPARENT_DIRECTIVES = frozenset(
    "epigraph hlist centered only container glossary compound highlights pull-quote".split()
)

#: Directives whose argument is a title followed by a body.
TITLED_DIRECTIVES = frozenset("topic sidebar admonition rubric".split())

#: Version notes, rendered the way Sphinx renders them.
VERSION_LABELS = {
    "versionadded": "New in version {0}",
    "versionchanged": "Changed in version {0}",
    "deprecated": "Deprecated since version {0}",
    "deprecated-removed": "Deprecated since version {0}, will be removed in version {1}",
}

#: Object descriptions (any directive with a domain prefix such as ``c:`` counts too).
OBJECT_DIRECTIVES = frozenset(
    """
    function method class attribute data exception decorator decoratormethod
    classmethod staticmethod abstractmethod coroutinefunction coroutinemethod
    awaitablefunction awaitablemethod describe object opcode pdbcommand
    cmdoption option envvar 2to3fixer property type
    """.split()
)

# --------------------------------------------------------------------------
# Line-level patterns

_DIRECTIVE_RE = re.compile(r"^\.\.\s+([A-Za-z0-9][\w:.+-]*)::(?:\s+(.*))?$")
_FOOTNOTE_RE = re.compile(r"^\.\.\s+\[([^\]]+)\](?:\s+(.*))?$")
_SUBST_DEF_RE = re.compile(r"^\.\.\s+\|([^|]+)\|\s+([\w-]+)::\s*(.*)$")
_OPTION_RE = re.compile(r"^:[\w][\w .-]*:(\s|$)")
_FIELD_RE = re.compile(r"^:([^:`]+):(?:\s+(.*))?$")
_BULLET_RE = re.compile(r"^([-*+\u2022])(\s+)(\S.*)$")
_ENUM_RE = re.compile(r"^(\d+|#)\.(\s+)(\S.*)$")
_GRID_BORDER_RE = re.compile(r"^\+([-=]+\+)+$")
_SIMPLE_TABLE_BORDER_RE = re.compile(r"^=+( +=+)+$")
_ADORNMENT_CHARS = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_adornment(stripped: str) -> bool:
    """True for a line such as ``=====`` or ``-----`` (three or more of one char)."""
    return len(stripped) >= 3 and stripped[0] in _ADORNMENT_CHARS and stripped == stripped[0] * len(stripped)


def _block_end(lines: list[str], start: int, indent: int) -> int:
    """Index of the first non-blank line at or after ``start`` indented ``<= indent``."""
    j = start
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
        j += 1
    return j


def _dedent(lines: list[str]) -> list[str]:
    """Remove the common leading indentation; blank lines become empty."""
    indents = [_indent(line) for line in lines if line.strip()]
    cut = min(indents) if indents else 0
    return [line[cut:].rstrip() if line.strip() else "" for line in lines]


def _skip_simple_table(lines: list[str], i: int) -> int:
    """Skip a simple table starting at border line ``i``; return the next index.

    The table ends at a border line that is followed by a blank line (or the
    end of input); borders followed by text are header separators.
    """
    j = i + 1
    while j < len(lines):
        stripped = lines[j].strip()
        if _SIMPLE_TABLE_BORDER_RE.match(stripped) or (stripped and set(stripped) == {"="}):
            if j + 1 >= len(lines) or not lines[j + 1].strip():
                return j + 1
        j += 1
    return j


# --------------------------------------------------------------------------
# Inline markup

_LITERAL_RE = re.compile(r"``(.+?)``")
_ESCAPE_BASE = 0xF0000  # private-use plane used to protect escaped characters
_ESCAPED_RE = re.compile("[\U000f0000-\U000ffffd]")
_ROLE_RE = re.compile(r"(?<![\w`]):((?:[\w.+-]+:)*[\w.+-]+):`([^`]*)`")
_TITLED_TARGET_RE = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.S)
_LINK_RE = re.compile(r"`([^`]*?)\s*<([^<>`]*)>`_{1,2}")
_NAMED_REF_RE = re.compile(r"`([^`]+)`_{1,2}")
_DEFAULT_ROLE_RE = re.compile(r"`([^`]+)`")
_FOOTNOTE_REF_RE = re.compile(r"\s?\[(?:#[\w-]*|\*|\d+|[A-Za-z][\w.-]*)\]_")
_STRONG_RE = re.compile(r"(?<![\w*])\*\*(?=\S)(.+?)(?<=\S)\*\*(?![\w*])")
_EMPHASIS_RE = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_WORD_REF_RE = re.compile(r"(?<![\w])([A-Za-z][\w-]*[A-Za-z0-9])_{1,2}(?![\w])")
_SUBST_REF_RE = re.compile(r"(?<![\w|])\|([\w][\w .-]*?)\|(?:_{1,2})?(?![\w|])")
_SAMP_VAR_RE = re.compile(r"\{([^{}]*)\}")
_SPACES_RE = re.compile(r"\s+")

_CALLABLE_ROLES = frozenset({"func", "meth"})


def _protect_escapes(text: str) -> str:
    """Apply backslash escapes: ``\\ `` vanishes, ``\\x`` becomes a protected ``x``."""
    text = re.sub(r"\\[ \n]", "", text)

    def protect(match: re.Match[str]) -> str:
        char = match.group(1)
        return chr(_ESCAPE_BASE + ord(char)) if ord(char) < 0xFFFD else char

    return re.sub(r"\\(.)", protect, text)


def _restore_escapes(text: str) -> str:
    return _ESCAPED_RE.sub(lambda m: chr(ord(m.group(0)) - _ESCAPE_BASE), text)


def _role_text(role: str, content: str, labels: dict[str, str]) -> str:
    """The text a reader sees for ``:role:`content```.

    ``labels`` maps ``:ref:`` targets to the titles they point at.
    """
    name = role.rsplit(":", 1)[-1].lower()
    titled = _TITLED_TARGET_RE.match(content)
    if titled and titled.group(1).strip():
        return titled.group(1)
    text = titled.group(2) if titled else content
    if name == "ref":
        return labels.get(text.strip().lower(), text)
    if name == "doc":
        return text.rstrip("/").rsplit("/", 1)[-1]
    text = text.lstrip("!")
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    if name == "pep":
        return "PEP " + text.split("#")[0]
    if name == "rfc":
        return "RFC " + text.split("#")[0]
    if name in ("issue", "bpo"):
        return "bpo-" + text
    if name == "gh":
        return "gh-" + text
    if name in ("samp", "file"):
        return _SAMP_VAR_RE.sub(r"\1", text)
    if name in _CALLABLE_ROLES and not text.endswith(")"):
        return text + "()"
    return text


def _clean_markup(text: str, substitutions: dict[str, str], labels: dict[str, str]) -> str:
    """Strip inline markup from text that contains no ````literal```` spans."""
    text = _protect_escapes(text)
    text = _SUBST_REF_RE.sub(lambda m: substitutions.get(m.group(1), m.group(1)), text)
    text = _ROLE_RE.sub(lambda m: _role_text(m.group(1), m.group(2), labels), text)
    text = _LINK_RE.sub(lambda m: m.group(1) or m.group(2), text)
    text = _NAMED_REF_RE.sub(r"\1", text)
    text = _DEFAULT_ROLE_RE.sub(r"\1", text)
    text = _FOOTNOTE_REF_RE.sub("", text)
    text = _STRONG_RE.sub(r"\1", text)
    text = _EMPHASIS_RE.sub(r"\1", text)
    text = _WORD_REF_RE.sub(r"\1", text)
    return _restore_escapes(text)


def clean_inline(
    text: str,
    substitutions: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    """Reduce one paragraph of reST inline markup to plain text on one line.

    ``substitutions`` maps ``|name|`` references to text; ``labels`` maps
    ``:ref:`label``` targets (lower case) to section titles.
    """
    subs = substitutions or {}
    refs = labels or {}
    pieces: list[str] = []
    pos = 0
    for match in _LITERAL_RE.finditer(text):
        pieces.append(_clean_markup(text[pos : match.start()], subs, refs))
        pieces.append(match.group(1))
        pos = match.end()
    pieces.append(_clean_markup(text[pos:], subs, refs))
    return _SPACES_RE.sub(" ", "".join(pieces)).strip()


# --------------------------------------------------------------------------
# Block parser


def _collect_substitutions(lines: list[str]) -> dict[str, str]:
    """Read ``.. |name| replace:: text`` (and ``unicode::``) definitions."""
    subs: dict[str, str] = {}
    for line in lines:
        match = _SUBST_DEF_RE.match(line.strip())
        if not match:
            continue
        name, kind, value = match.groups()
        if kind == "replace":
            subs[name] = clean_inline(value)
        elif kind == "unicode":
            chars = []
            for code in value.split():
                code = code.lower().removeprefix("u+").removeprefix("0x")
                try:
                    chars.append(chr(int(code, 16)))
                except ValueError:
                    break
            subs[name] = "".join(chars)
    return subs


class _Parser:
    """Recursive line-based parser producing :class:`Block` objects."""

    def __init__(self, substitutions: dict[str, str], labels: dict[str, str]):
        self.subs = substitutions
        self.labels = labels

    # -- helpers -----------------------------------------------------------

    def _prose(self, text: str, kind: str = "prose") -> list[Block]:
        cleaned = clean_inline(text, self.subs, self.labels)
        if not any(ch.isalnum() for ch in cleaned):
            return []
        return [Block(kind, cleaned)]

    @staticmethod
    def _code(lines: list[str]) -> list[Block]:
        body = _dedent(lines)
        while body and not body[-1]:
            body.pop()
        while body and not body[0]:
            body.pop(0)
        return [Block("code", "\n".join(body))] if body else []

    # -- main loop ---------------------------------------------------------

    def parse(self, lines: list[str]) -> list[Block]:
        """Parse lines whose base indentation is column 0."""
        blocks: list[Block] = []
        literal_next = False
        i, n = 0, len(lines)
        while i < n:
            line = lines[i]
            stripped = line.strip()
            if not stripped:
                i += 1
                continue
            if _indent(line) > 0:
                end = _block_end(lines, i, 0)
                body = lines[i:end]
                blocks.extend(self._code(body) if literal_next else self.parse(_dedent(body)))
                literal_next = False
                i = end
                continue
            literal_next = False
            if stripped == ".." or stripped.startswith(".. "):
                end = _block_end(lines, i + 1, 0)
                blocks.extend(self._explicit(stripped, lines[i + 1 : end]))
                i = end
            elif _GRID_BORDER_RE.match(stripped):
                while i < n and lines[i].strip():
                    i += 1
            elif _SIMPLE_TABLE_BORDER_RE.match(stripped):
                i = _skip_simple_table(lines, i)
            elif _is_adornment(stripped):
                i = self._overlined_title(lines, i, blocks)
            elif _BULLET_RE.match(stripped) or _ENUM_RE.match(stripped):
                i = self._list_item(lines, i, blocks)
            elif _FIELD_RE.match(stripped):
                i = self._field(lines, i, blocks)
            elif stripped.startswith("| ") or stripped == "|":
                blocks.extend(self._prose(stripped[1:]))  # line block: one line each
                i += 1
            elif stripped.startswith(">>>"):
                end = i
                while end < n and lines[end].strip():
                    end += 1
                blocks.extend(self._code(lines[i:end]))
                i = end
            else:
                i, literal_next = self._paragraph(lines, i, blocks)
        return blocks

    def _overlined_title(self, lines: list[str], i: int, blocks: list[Block]) -> int:
        """Handle a title with an overline, or skip a transition line."""
        n = len(lines)
        if i + 2 < n and lines[i + 1].strip() and lines[i + 2].strip() == lines[i].strip():
            blocks.extend(self._prose(lines[i + 1].strip(), "title"))
            return i + 3
        return i + 1

    def _paragraph(self, lines: list[str], i: int, blocks: list[Block]) -> tuple[int, bool]:
        """Gather a paragraph (or title, or definition-list term) starting at ``i``."""
        n = len(lines)
        first = lines[i].strip()
        if i + 1 < n and _is_adornment(lines[i + 1].strip()) and _indent(lines[i + 1]) == 0:
            blocks.extend(self._prose(first, "title"))
            return i + 2, False
        para = [first]
        j = i + 1
        while j < n and lines[j].strip() and _indent(lines[j]) == 0:
            para.append(lines[j].strip())
            j += 1
        if j < n and lines[j].strip() and _indent(lines[j]) > 0:
            # Definition list: the last line is the term, the indented block its definition.
            term = para.pop()
            if para:
                blocks.extend(self._prose(" ".join(para)))
            blocks.extend(self._prose(term))
            end = _block_end(lines, j, 0)
            blocks.extend(self.parse(_dedent(lines[j:end])))
            return end, False
        text = " ".join(para)
        literal_next = False
        if text.endswith("::"):
            literal_next = True
            text = text[:-3] if text.endswith(" ::") else text[:-1]
            text = text.rstrip()
        if text:
            blocks.extend(self._prose(text))
        return j, literal_next

    def _list_item(self, lines: list[str], i: int, blocks: list[Block]) -> int:
        """A bullet or enumerated item; its first paragraph keeps a ``- `` / ``N. `` marker."""
        stripped = lines[i].strip()
        match = _BULLET_RE.match(stripped) or _ENUM_RE.match(stripped)
        assert match is not None
        marker, gap, rest = match.groups()
        text_col = len(marker) + (1 if _ENUM_RE.match(stripped) else 0) + len(gap)
        end = _block_end(lines, i + 1, text_col - 1)
        body = self.parse(_dedent([" " * text_col + rest] + lines[i + 1 : end]))
        label = "-" if marker in "-*+\u2022" else ("1." if marker == "#" else marker + ".")
        if body and body[0].kind == "prose":
            body[0] = Block("prose", f"{label} {body[0].text}")
        blocks.extend(body)
        return end

    def _field(self, lines: list[str], i: int, blocks: list[Block]) -> int:
        """A field list entry such as ``:Author: Jane Doe`` becomes ``Author: Jane Doe``."""
        match = _FIELD_RE.match(lines[i].strip())
        assert match is not None
        name, value = match.group(1), match.group(2) or ""
        end = _block_end(lines, i + 1, 0)
        body = _dedent(lines[i + 1 : end])
        text = " ".join([value] + [line for line in body if line]).strip()
        if text:
            blocks.extend(self._prose(f"{name}: {text}"))
        return end

    # -- explicit markup -----------------------------------------------------

    def _explicit(self, first: str, body_lines: list[str]) -> list[Block]:
        """Comments, targets, footnotes, substitution definitions and directives."""
        if first.startswith(".. _") or first.startswith(".. |"):
            return []
        footnote = _FOOTNOTE_RE.match(first)
        if footnote:
            rest = footnote.group(2) or ""
            return self.parse([rest] + _dedent(body_lines) if rest else _dedent(body_lines))
        directive = _DIRECTIVE_RE.match(first)
        if not directive:
            return []  # a comment
        return self._directive(directive.group(1).lower(), (directive.group(2) or "").strip(), body_lines)

    def _directive(self, name: str, argument: str, body_lines: list[str]) -> list[Block]:
        body = _dedent(body_lines)
        head: list[str] = []  # non-option lines before the first blank line
        k = 0
        while k < len(body) and body[k]:
            if not _OPTION_RE.match(body[k]):
                head.append(body[k])
            k += 1
        content = body[k:]
        base = name.split(":")[-1]

        if name in DROPPED_DIRECTIVES:
            return []
        if name in CODE_DIRECTIVES:
            return self._code(content if any(content) else head)
        if name in VERSION_LABELS:
            return self._version_note(name, argument, head, content)
        if name in ADMONITION_LABELS:
            blocks = self.parse([argument] + head + content if argument else head + content)
            return _prefix_first(blocks, ADMONITION_LABELS[name])
        if name in TITLED_DIRECTIVES:
            title = self._prose(" ".join([argument] + head), "title")
            return title + self.parse(content)
        if name in OBJECT_DIRECTIVES or (":" in name and base not in DROPPED_DIRECTIVES):
            return _signatures([argument] + head) + self.parse(content)
        # TRANSPARENT_DIRECTIVES and unknown directives: keep whatever prose they hold.
        return self.parse(head + content)

    def _version_note(self, name: str, argument: str, head: list[str], content: list[str]) -> list[Block]:
        parts = argument.split(None, 2 if name == "deprecated-removed" else 1)
        versions = parts[: 2 if name == "deprecated-removed" else 1]
        while len(versions) < VERSION_LABELS[name].count("{"):
            versions.append("?")
        label = VERSION_LABELS[name].format(*versions)
        explanation = " ".join(parts[len(versions) :] + head).strip()
        blocks = self.parse([explanation] + [""] + content) if explanation else self.parse(content)
        if blocks and blocks[0].kind == "prose":
            return [Block("prose", f"{label}: {blocks[0].text}")] + blocks[1:]
        return [Block("prose", label + ".")] + blocks


def _signatures(lines: list[str]) -> list[Block]:
    """One block per object signature; a trailing backslash continues a line."""
    joined: list[str] = []
    carry = ""
    for line in lines:
        line = carry + line.strip()
        if line.endswith("\\"):
            carry = line[:-1].rstrip() + " "
            continue
        carry = ""
        if line:
            joined.append(_SPACES_RE.sub(" ", line))
    if carry.strip():
        joined.append(_SPACES_RE.sub(" ", carry).strip())
    return [Block("signature", sig) for sig in joined]


def _prefix_first(blocks: list[Block], label: str) -> list[Block]:
    """Prefix the first prose block with ``label`` (or emit the label alone)."""
    if blocks and blocks[0].kind == "prose":
        return [Block("prose", f"{label} {blocks[0].text}")] + blocks[1:]
    return [Block("prose", label)] + blocks if blocks else []


# --------------------------------------------------------------------------
# Public API


_TARGET_RE = re.compile(r"^\.\.\s+_([^:`][^:]*):\s*$")


def collect_labels(text: str) -> dict[str, str]:
    """Map each ``.. _label:`` placed just before a section title to that title.

    Sphinx renders ``:ref:`label``` as the title of the section the label
    precedes; collecting these over a whole document set lets
    :func:`clean_rst` do the same.  Keys are lower case.
    """
    lines = [line.rstrip() for line in text.expandtabs(8).splitlines()]
    labels: dict[str, str] = {}
    pending: list[str] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        target = _TARGET_RE.match(stripped)
        if target:
            pending.append(target.group(1).strip().lower())
            continue
        if not stripped or not pending:
            continue
        title = None
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if _is_adornment(stripped) and i + 2 < len(lines) and lines[i + 2].strip() == stripped:
            title = nxt
        elif _is_adornment(nxt) and not _is_adornment(stripped):
            title = stripped
        if title:
            for label in pending:
                labels.setdefault(label, clean_inline(title))
        pending = []
    return labels


def parse_rst(text: str, labels: dict[str, str] | None = None) -> list[Block]:
    """Parse reStructuredText into a list of :class:`Block` objects.

    ``labels`` resolves ``:ref:`` targets (see :func:`collect_labels`); by
    default only the labels defined in ``text`` itself are known.
    """
    lines = [line.rstrip() for line in text.expandtabs(8).splitlines()]
    known = collect_labels(text) if labels is None else labels
    return _Parser(_collect_substitutions(lines), known).parse(lines)


_LEAD_IN_MAX = 60  # characters


def render_blocks(
    blocks: list[Block],
    *,
    max_code_lines: int | None = 8,
    keep_signatures: bool = True,
) -> str:
    """Join blocks into text: one block per paragraph, separated by blank lines.

    Code blocks longer than ``max_code_lines`` lines are dropped (``0`` drops all
    code, ``None`` keeps all); kept code is indented by four spaces.  A short
    lead-in such as ``Decoding JSON:`` that only introduced a dropped code block
    is dropped with it.
    """
    out: list[str] = []
    for block in blocks:
        if block.kind == "code":
            code_lines = block.text.split("\n")
            if max_code_lines is not None and len(code_lines) > max_code_lines:
                if out and out[-1].endswith(":") and len(out[-1]) <= _LEAD_IN_MAX:
                    out.pop()
                continue
            out.append("\n".join("    " + line if line else "" for line in code_lines))
        elif block.kind == "signature":
            if keep_signatures:
                out.append(block.text)
        else:
            out.append(block.text)
    return "\n\n".join(out)


def clean_rst(
    text: str,
    *,
    labels: dict[str, str] | None = None,
    max_code_lines: int | None = 8,
    keep_signatures: bool = True,
) -> str:
    """Convert a reStructuredText document into plain prose (see module docstring)."""
    blocks = parse_rst(text, labels)
    return render_blocks(blocks, max_code_lines=max_code_lines, keep_signatures=keep_signatures)
