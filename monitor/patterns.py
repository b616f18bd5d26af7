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


__all__ = ["MAX_PATTERN_MEMORY", "LinearPattern", "PatternError", "UNSUPPORTED", "compile_linear", "escape"]
