"""Regular expressions written by users (policy and silence matchers, watch-rule branch and
tag patterns, corpus slice-rule globs), compiled in this one place with RE2.

Python's `re` backtracks: `(a+)+$` against a 50,000-character name the Hub controls, or a
glob of a few `*` against a long file name, takes hours while holding the GIL, so one hostile
string would hang the daemon. RE2 runs every pattern in time linear in the text (no
backtracking) and bounds the memory one pattern may use. The price is its syntax: no
backreferences (`\\1`, `(?P=name)`), no lookaround (`(?=`, `(?!`, `(?<=`, `(?<!`), no atomic
groups or possessive quantifiers, `\\z` for `\\Z`; `\\d`, `\\w`, `\\s` and `\\b` are ASCII
(`\\pL` is any letter). A pattern RE2 refuses is refused when it is read (a policy is
loaded, a silence is added), with `PatternError` saying why, never when it is matched.

Shell globs (watch rules' `name_glob`, corpus slice rules' `glob`) are translated here to RE2
(`compile_glob`) in one pass over the glob, so neither translating nor matching one can take
more than linear time (`fnmatch` rescans the rest of the glob from every unclosed `[`, and
matches on Python's backtracking `re`).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

# Bytes RE2 may use for one pattern (its program and its DFA cache). A label or ref pattern
# needs a few KiB; at the bound a pattern is refused at compile time ("pattern too large"),
# and a match whose DFA cache fills falls back to RE2's NFA, still linear in the text.
MAX_PATTERN_MEMORY = 1 << 20
# What an error quotes of a pattern: it may be a megabyte of a file or a request.
_QUOTED_CHARS = 80
UNSUPPORTED = "backreferences and lookaround are not supported"


class PatternError(ValueError):
    """A user-supplied pattern RE2 cannot compile; the message quotes it and says why
    (`reason` alone is RE2's word, for callers that name the pattern their own way)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PATTERN_MEMORY
    options.log_errors = False   # the refusal is raised as PatternError, not logged to stderr
    return options


def _quoted(pattern: str) -> str:
    text = repr(pattern)
    return text if len(text) <= _QUOTED_CHARS else text[:_QUOTED_CHARS - 3] + "..."


def _utf8(text: str) -> bytes:
    """`text` as UTF-8; a lone surrogate (JSON allows `"\\ud800"`) becomes '?' rather than
    raising in the middle of a match."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


class LinearPattern:
    """A compiled user-supplied pattern; `fullmatches` and `searches` take linear time."""

    __slots__ = ("text", "_regexp")

    def __init__(self, text: str, regexp: Any) -> None:
        self.text = text
        self._regexp = regexp

    def fullmatches(self, text: str) -> bool:
        """True when the pattern matches the whole of `text` (Python's `re.fullmatch`)."""
        return self._regexp.fullmatch(_utf8(text)) is not None

    def searches(self, text: str) -> bool:
        """True when the pattern matches somewhere in `text` (Python's `re.search`)."""
        return self._regexp.search(_utf8(text)) is not None

    def __repr__(self) -> str:
        return f"LinearPattern({self.text!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Copied and pickled as its text, compiled again on the other side.
        return (compile_linear, (self.text,))


@lru_cache(maxsize=1024)   # a pattern is compiled once however often it is read or matched
def compile_linear(pattern: str) -> LinearPattern:
    """Compile a user-supplied regular expression with RE2, or raise PatternError: one line
    quoting at most 80 characters of it, saying what RE2 does not support and its reason."""
    try:
        encoded = pattern.encode("utf-8")
    except UnicodeEncodeError:
        reason = "it holds a lone surrogate, which is not text"
        raise PatternError(f"{_quoted(pattern)} is not a regular expression: {reason}", reason) from None
    try:
        regexp = re2.compile(encoded, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        reason = " ".join(str(reason).split())[:_QUOTED_CHARS * 2]
        raise PatternError(f"{_quoted(pattern)} is not a regular expression RE2 accepts "
                           f"({UNSUPPORTED}): {reason}", reason) from None
    return LinearPattern(pattern, regexp)


def escape(text: str) -> str:
    """`text` as an RE2 pattern that matches it literally."""
    return re2.escape(text)


# RE2 reads these specially inside a class (`[:alpha:]` is a POSIX class there).
_CLASS_SPECIAL = {c: "\\" + c for c in "\\-[]^"}
_ANY = "[\\x00-\\x{10FFFF}]"       # every character, newlines too (fnmatch's `[!]`-like empty complement)
_NOTHING = "[^\\x00-\\x{10FFFF}]"   # no character (fnmatch's `(?!)`: RE2 has no lookahead)


@lru_cache(maxsize=1024)
def compile_glob(glob: str, *, paths: bool = False) -> LinearPattern:
    """Compile a shell glob to an RE2 pattern matched with `fullmatches`; raises PatternError.

    `paths=False`: the rules of `fnmatch.fnmatchcase` exactly: `*` is any run of characters,
    `?` any one, `[...]` a class (`[!...]` its complement, a leading `]` a member, a range
    written backwards `[z-a]` matches nothing), an unclosed `[` a literal `[`.
    `paths=True` (corpus slice rules): `*` and `?` stay within a folder, `**/` spans zero or
    more folders and `**` anything; a class may also be negated with `^`, and a backwards
    range is refused (PatternError) rather than left to match nothing.
    """
    return compile_linear(_glob_regex(glob, paths=paths))


def _glob_regex(glob: str, *, paths: bool) -> str:
    out: list[str] = []
    n, i = len(glob), 0
    last_close = glob.rfind("]")   # a '[' whose class would end after it is a literal '['
    while i < n:
        char = glob[i]
        if char == "*":
            if paths and glob.startswith("**/", i):
                out.append("(?:.*/)?")
                i += 3
                continue
            if paths and glob.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            if not paths:
                while i + 1 < n and glob[i + 1] == "*":   # `**` is `*` to fnmatch
                    i += 1
            out.append("[^/]*" if paths else ".*")
        elif char == "?":
            out.append("[^/]" if paths else ".")
        elif char == "[":
            j = i + 1
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            # Found at most once per class, and each class is consumed: linear in the glob.
            end = glob.find("]", j) if j <= last_close else -1
            if end < 0:
                out.append("\\[")
            else:
                out.append(_glob_class(glob, i + 1, end, paths=paths))
                i = end
        else:
            out.append(escape(char))
        i += 1
    body = "".join(out)
    return body if paths else f"(?s:{body})"


def _glob_class(glob: str, start: int, end: int, *, paths: bool) -> str:
    """The class `glob[start:end]` (between '[' and ']'), as `fnmatch.translate` splits it:
    the hyphens that make ranges kept, the others and RE2's specials escaped."""
    negate = glob[start] == "!" or (paths and glob[start] == "^")
    first = start + 1 if negate else start
    chunks: list[str] = []
    i, k = first, first + 1
    while True:   # split at the hyphens that make ranges (a leading one is a member)
        k = glob.find("-", k, end)
        if k < 0:
            break
        chunks.append(glob[i:k])
        i, k = k + 1, k + 3
    chunk = glob[i:end]
    if chunk:
        chunks.append(chunk)
    elif chunks:
        chunks[-1] += "-"
    if not paths:   # fnmatch drops a backwards range, so `[z-a]` matches nothing
        for k in range(len(chunks) - 1, 0, -1):
            if chunks[k - 1] and chunks[k] and chunks[k - 1][-1] > chunks[k][0]:
                chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
                del chunks[k]
    members = "-".join("".join(_CLASS_SPECIAL.get(c, c) for c in part) for part in chunks)
    if not members:
        return _ANY if negate else _NOTHING
    return f"[{'^' if negate else ''}{members}]"


__all__ = ["MAX_PATTERN_MEMORY", "LinearPattern", "PatternError", "UNSUPPORTED", "compile_glob", "compile_linear",
           "escape"]
