"""Untrusted text made literal for each output format: plain text, Markdown, the terminal.

Repo ids, revisions, file and tensor names, card text, policy and task names and the error
messages that quote them all reach human-readable outputs. Each format has one escaper here,
applied where that format renders: the report's Markdown, the email and report templates'
`finalize` (`template_value`; HTML is then escaped by Jinja's autoescape), the webhook's
annotations, the terminal's console. Machine data (the JSON of reports and webhooks, labels,
numbers) keeps the exact values.

- `plain_text`: every control character (C0, DEL, C1: ANSI escapes, carriage returns, line
  breaks), the Unicode line and paragraph separators and the bidirectional controls (which
  reorder what a reader sees, `\\u202e`) become visible escapes such as `\\x1b`, `\\n` and
  `\\u202e`, so a value stays on its line, shows what it holds and cannot restyle the screen;
- `terminal_text`: the same, except line breaks and tabs, which the console's own multi-line
  output uses (rich markup is off in the console itself, `monitor/commands/terminal.py`);
- `markdown_text`: `plain_text`, then what CommonMark (and GFM's tables and strikethrough) give
  a meaning to is backslash-escaped, so the value renders as the literal text it is: no link,
  image, HTML, heading, emphasis, entity, list or table cell arises from it, nor a GFM
  autolink of a bare URL or `www.` name (a bare e-mail address may still be linked by GFM,
  with its true address as the text); `markdown_code`
  puts a value in a code span whose fence is longer than any run of backticks in it.
"""

from __future__ import annotations

import re
from typing import Any

# The bidirectional controls (Unicode's Bidi_Control property): they reorder the text around
# them, so `exe.txt` can be made to read as `txt.exe`.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
LINE_SEPARATORS = "\u2028\u2029"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(char: str) -> str:
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


_NEUTRAL = [chr(c) for c in (*range(0x00, 0x20), *range(0x7f, 0xa0))] + list(BIDI_CONTROLS + LINE_SEPARATORS)
_PLAIN = str.maketrans({char: _visible(char) for char in _NEUTRAL})
_TERMINAL = str.maketrans({char: _visible(char) for char in _NEUTRAL if char not in "\n\t"})

# What CommonMark (and GFM's tables and strikethrough) give a meaning to anywhere in a line,
# backslash-escaped (any ASCII punctuation may be): `\` itself, the code span's backtick,
# emphasis `*` `_`, links and images `[ ]` (without them `( )` and `!` are inert), raw HTML and
# autolinks `< >`, entities `&`, table cells `|`, strikethrough `~`, and `#` (a heading's
# closing sequence). An `_` between two letters or digits (`at_risk`, `my_model`) can neither
# open nor close emphasis and is left, as is the rest of ASCII punctuation, so names stay
# readable in the raw Markdown (a report's email text is its Markdown).
_MARKDOWN_ACTIVE = re.compile(r"([\\`*\[\]<>&|~#]|(?<![^\W_])_|_(?![^\W_]))")
# What is active only where the value starts a block (`- {value}` is a list item whose text
# would start a nested list, a thematic break or a heading): a bullet `-` `+`, an ordered-list
# marker `1.` / `1)`, or leading spaces (four of them open a code block), written as `&#32;`.
_BLOCK_START = re.compile(r"^([-+]|\d+[.)])")
# GFM's extended autolinks (GitHub and most chat renderers turn bare URLs into links, which
# CommonMark does not): a scheme's `:` (`https:`, `http:`, `ftp:`, `mailto:`, `xmpp:`) and the
# `.` of a leading `www.` are backslash-escaped, which breaks the pattern the extension scans
# for while the text renders the same (checked with GitHub's cmark-gfm). A bare e-mail address
# cannot be kept from GFM's autolink by any escape (the extension rescans the merged text), so
# it may still render as a mailto: link whose text is the true address. Both patterns are
# linear (a fixed word before the punctuation).
_AUTOLINK_SCHEME = re.compile(r"(?i)\b(https?|ftp|mailto|xmpp):")
_AUTOLINK_WWW = re.compile(r"(?i)\b(www)\.")
_LEADING_SPACES = re.compile(r"^ +")


def plain_text(value: Any) -> str:
    """`value` as one line of plain text with its control characters made visible."""
    return str(value).translate(_PLAIN)


def terminal_text(value: Any) -> str:
    """`value` for a terminal: control characters (ANSI escapes above all) and bidirectional
    controls made visible; line breaks and tabs kept for the console's own layout."""
    return str(value).translate(_TERMINAL)


def template_value(value: Any) -> Any:
    """Jinja's `finalize` for text and HTML templates: each string a template prints is its
    `plain_text` (autoescape then escapes it for HTML); a string already marked safe HTML and
    anything not a string (numbers, None) are left to the template."""
    if isinstance(value, str) and not hasattr(value, "__html__"):
        return plain_text(value)
    return value


def html_environment(template_dir: Any) -> Any:
    """The Jinja environment of a self-contained HTML page (the governance and the lab reports):
    templates from `template_dir`, HTML autoescaped, an undefined value an error, and every
    string passed through `template_value` (control and bidi characters made visible)."""
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir)),
                              autoescape=jinja2.select_autoescape(["html", "html.j2"]),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              finalize=template_value)


def markdown_code(value: Any) -> str:
    """`value` as a Markdown code span (for paths and file names outside tables, where a `|`
    needs no escape): fenced by one backtick more than its longest run of them, padded with a
    space (which CommonMark strips) where it starts or ends with a backtick or a space."""
    text = plain_text(value)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    if not text.strip(" "):   # CommonMark strips nothing from spaces alone; an empty span is none
        return f"{fence}{text}{fence}" if text else ""
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_text(value: Any) -> str:
    """`value` as inline Markdown that renders as exactly its `plain_text`."""
    escaped = _MARKDOWN_ACTIVE.sub(r"\\\1", plain_text(value))
    escaped = _AUTOLINK_SCHEME.sub(r"\1\\:", escaped)
    escaped = _AUTOLINK_WWW.sub(r"\1\\.", escaped)
    escaped = _BLOCK_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], escaped)
    return _LEADING_SPACES.sub(lambda m: "&#32;" * len(m.group(0)), escaped)


__all__ = ["BIDI_CONTROLS", "plain_text", "terminal_text", "template_value", "markdown_code", "markdown_text"]
