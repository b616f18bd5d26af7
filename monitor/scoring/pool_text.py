"""Plain text out of documentation and dictionary packages, deterministically.

Two readers, chosen by a file's path inside the package:

- dictd dictionaries (`usr/share/dictd/NAME.dict[.dz]` with `NAME.index`): one unit per
  entry, in file order. Dropped: the `00-database-*` header entries, lines that only cite the
  entry's source (`[1913 Webster]`, `[WordNet 1.5]`, `[PJC]`), the braces that mark
  cross-references, and the syllabified headword (`\\Ben`e*fi"ci*a*ry\\`). Indentation and runs
  of spaces are collapsed to single spaces.
- Sphinx reST sources (`usr/share/doc/*/html/_sources/**/*.rst.txt`): one unit per section,
  with the markup stripped: code and literal blocks, doctest blocks, tables, comments, targets
  and bookkeeping directives are dropped; directive headers are dropped and their bodies kept;
  inline roles, literals, emphasis and links keep only their text.

Units then go through `clean_text` (NFC, no control characters but tab and newline, no
trailing spaces, at most one blank line in a row).
"""

from __future__ import annotations

import gzip
import io
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from monitor.errors import CorpusError

MAX_DICT_BYTES = 256 * 2**20  # a decompressed dictionary
_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_VALUE = {c: i for i, c in enumerate(_B64)}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


@dataclass(frozen=True)
class Unit:
    """A piece of text in source order: documents are packed from consecutive units of one
    `group` (a dictionary, or one reST file)."""

    slice: str
    group: str
    origin: str
    text: str


def clean_text(text: str) -> str:
    """NFC, LF line ends, control and invisible format characters removed (tab kept only as
    a space), trailing spaces stripped, runs of blank lines reduced to one, ends stripped."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = text.replace("\t", "    ")
    text = _CONTROL.sub("", text)
    lines = [line.rstrip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    return "\n".join(out).strip()


def decode_text(data: bytes, where: str) -> str:
    """UTF-8 (strict), else Latin-1: dictionary and documentation files predate UTF-8 in places."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


# -- dictd dictionaries ------------------------------------------------------------------------
def _b64_number(text: str, where: str) -> int:
    value = 0
    for c in text:
        if c not in _B64_VALUE:
            raise CorpusError(f"{where}: {text!r} is not a dictd base64 number")
        value = value * 64 + _B64_VALUE[c]
    return value


def _gunzip_bounded(data: bytes, where: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            out = f.read(MAX_DICT_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise CorpusError(f"{where}: not a valid gzip/dictzip file ({exc})") from None
    if len(out) > MAX_DICT_BYTES:
        raise CorpusError(f"{where}: decompresses to more than {MAX_DICT_BYTES // 2**20} MiB")
    return out


_SOURCE_TAG = re.compile(r"^\[[^\[\]]{1,40}\]$")
# \Ben`e*fi"ci*a*ry\ after a headword. Every pattern below runs over hostile text (a .deb's
# files): each is linear in the line, never two unbounded quantifiers over overlapping
# characters side by side (a leading `\s*` here cost O(n^2) on a line of n spaces, since
# every space restarted the scan). Spaces around what a pattern removes are collapsed after.
_PRONUNCIATION = re.compile(r"\\[^\\\n]{1,80}\\")


def _dict_entry_text(raw: str) -> str:
    lines = []
    for line in raw.split("\n"):
        line = _PRONUNCIATION.sub("", line.replace("{", "").replace("}", ""))  # markup, not words
        line = " ".join(line.split())
        if _SOURCE_TAG.match(line):
            continue
        lines.append(line)
    return clean_text("\n".join(lines))


def dictd_units(dict_path: str, dict_data: bytes, index_data: bytes, slice_: str) -> Iterator[Unit]:
    """The entries of a dictd dictionary, in the order they are stored, each once."""
    body = _gunzip_bounded(dict_data, dict_path) if dict_path.endswith(".dz") else dict_data
    index_text = decode_text(index_data, dict_path)
    spans: dict[int, tuple[int, str]] = {}
    for lineno, line in enumerate(index_text.split("\n"), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 3:
            raise CorpusError(f"{dict_path} index line {lineno}: expected headword, offset, length")
        where = f"{dict_path} index line {lineno}"
        start, length = _b64_number(parts[1], where), _b64_number(parts[2], where)
        if start + length > len(body):
            raise CorpusError(f"{where}: entry {parts[0]!r} runs past the end of the dictionary")
        if start not in spans or length > spans[start][0]:
            spans[start] = (length, parts[0])
    for start in sorted(spans):
        length, headword = spans[start]
        if headword.startswith("00-database") or headword.startswith("00database"):
            continue
        text = _dict_entry_text(decode_text(body[start:start + length], dict_path))
        if text:
            yield Unit(slice=slice_, group=dict_path, origin=f"{dict_path}@{start}+{length}", text=text)


# -- reST ---------------------------------------------------------------------------------------
# directives whose whole block (header and body) is code, data or bookkeeping
_DROP_BLOCK = {
    "code-block", "sourcecode", "code", "doctest", "testcode", "testoutput", "testsetup",
    "testcleanup", "productionlist", "literalinclude", "include", "toctree", "index", "raw",
    "csv-table", "list-table", "table", "image", "figure", "tabularcolumns", "highlight",
    "module", "currentmodule", "moduleauthor", "sectionauthor", "autosummary", "only",
    "audit-event", "audit-event-table", "opcode", "c:macro", "c:var", "c:type", "c:member",
    "limited-api-list", "availability", "rubric", "impl-detail-ignored", "program",
    "option", "cmdoption", "envvar", "pdbcommand", "2to3fixer", "glossary-ignored",
    "literal-block", "parsed-literal", "math", "graphviz", "miscnews", "changelog",
}
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([A-Za-z0-9_:+-]+)::(.*)$")
_COMMENT = re.compile(r"^(\s*)\.\.(\s|$)")
_ADORNMENT = re.compile(r"^\s*([=\-~^\"'`#*+:._<>|])\1{2,}\s*$")
_TABLE_LINE = re.compile(r"^\s*[+|].*[+|]\s*$|^\s*(=+\s+)+=+\s*$")
# A role's name is a few short parts (`:ref:`, `:py:meth:`, `:external+python:py:func:`), each
# bounded, so a line of colons is not rescanned to its end from each one.
_ROLE = re.compile(r":(?:[A-Za-z0-9_+-]{1,40}:){1,4}`([^`]*)`")
# The text before `<target>` is taken whole and right-stripped in code (`_link_text`): a lazy
# text followed by `\s*` tried every split of a run of spaces.
_LINK = re.compile(r"`([^`<]*)<[^`>]*>`_{1,2}")
_REF = re.compile(r"`([^`]+)`_{1,2}")
_LITERAL = re.compile(r"``([^`]+)``")
_INTERPRETED = re.compile(r"`([^`]+)`")
_STRONG = re.compile(r"\*\*([^*\n]+)\*\*")
_EMPH = re.compile(r"(?<![\w*])\*([^*\s][^*\n]*?)\*(?![\w*])")
_SUBST = re.compile(r"\|([A-Za-z0-9_ -]+)\|_?")


def _role_text(match: re.Match[str]) -> str:
    inner = match.group(1)
    # `title <target>`: the title (found by hand: a lazy regex then `\s*` is quadratic in spaces)
    start = inner.rfind("<")
    if inner.endswith(">") and start >= 0 and ">" not in inner[start + 1:-1] and inner[:start].rstrip():
        return inner[:start].rstrip()
    return inner.lstrip("~!")


def _link_text(match: re.Match[str]) -> str:
    return match.group(1).rstrip()


def rest_inline(line: str) -> str:
    """Inline markup of one line reduced to its text."""
    line = _ROLE.sub(_role_text, line)
    line = _LITERAL.sub(r"\1", line)
    line = _LINK.sub(_link_text, line)
    line = _REF.sub(r"\1", line)
    line = _INTERPRETED.sub(r"\1", line)
    line = _STRONG.sub(r"\1", line)
    line = _EMPH.sub(r"\1", line)
    line = _SUBST.sub(r"\1", line)
    return line.replace("\\ ", "").replace("\\", "")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _skip_block(lines: list[str], i: int, base: int) -> int:
    """Index of the first line after the block that starts after line i-1: blank lines and
    lines indented deeper than `base`."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        i += 1
    return i


def rest_sections(text: str) -> list[tuple[int, str]]:
    """(first line number, plain text) of each section of a reST file, markup stripped."""
    lines = text.expandtabs(8).split("\n")
    sections: list[tuple[int, list[str]]] = [(1, [])]
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            sections[-1][1].append("")
            i += 1
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            base, name = len(directive.group(1)), directive.group(2).lower()
            if name in _DROP_BLOCK or name.startswith("code") or name.endswith("-table"):
                i = _skip_block(lines, i + 1, base)
                sections[-1][1].append("")
                continue
            i += 1  # the header: its argument, continuation lines and :option: lines go
            while i < len(lines) and lines[i].strip() and (
                    lines[i - 1].rstrip().endswith("\\") or lines[i].strip().startswith(":")):
                i += 1
            continue
        if _COMMENT.match(line):  # comment, target or footnote: drop with its body
            i = _skip_block(lines, i + 1, _indent(line))
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _ADORNMENT.match(nxt) and not _ADORNMENT.match(line) and len(nxt.strip()) >= len(stripped) - 2:
            sections.append((i + 1, [rest_inline(stripped), ""]))  # a title opens a section
            i += 2
            continue
        if _ADORNMENT.match(line) or _TABLE_LINE.match(line):
            i += 1
            continue
        if stripped.startswith(">>>"):  # doctest block: to the next blank line
            while i < len(lines) and lines[i].strip():
                i += 1
            sections[-1][1].append("")
            continue
        # a paragraph: its lines up to a blank line; a trailing '::' opens a literal block
        para: list[str] = []
        base = _indent(line)
        while i < len(lines) and lines[i].strip() and not _DIRECTIVE.match(lines[i]) \
                and not _TABLE_LINE.match(lines[i]):
            para.append(lines[i].strip())
            i += 1
        if para and para[-1].endswith("::"):
            last = para[-1][:-2].rstrip()
            para[-1] = (last + ":") if last and not last.endswith(":") else last
            if not para[-1]:
                para.pop()
            i = _skip_block(lines, i, base)
        if para:
            sections[-1][1].append(rest_inline("\n".join(para)))  # roles may span lines
        sections[-1][1].append("")
    return [(start, clean_text("\n".join(body))) for start, body in sections]


def rest_units(path: str, data: bytes, slice_: str) -> Iterator[Unit]:
    """The sections of one reST source file, markup stripped, in file order."""
    for start, text in rest_sections(decode_text(data, path)):
        if text:
            yield Unit(slice=slice_, group=path, origin=f"{path}:L{start}", text=text)


def is_prose(text: str, *, min_words: int = 12, min_letter_share: float = 0.6) -> bool:
    """Whether a unit is mostly words: enough of them, and letters (with spaces) make up most
    of its characters (code, tables and lists of symbols fail)."""
    words = re.findall(r"[^\W\d_]{2,}", text)
    if len(words) < min_words:
        return False
    letters = sum(1 for c in text if c.isalpha() or c == " ")
    return letters / max(1, len(text)) >= min_letter_share
