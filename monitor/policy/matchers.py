"""Label matchers as in Alertmanager (`name=value`, `!=`, `=~`, `!~`), used by routes and silences."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from monitor.patterns import LinearPattern, PatternError, compile_linear
from monitor.yamlio import clip

# -- matchers and silences ---------------------------------------------------------------------
# Matched against the stripped text, the value stripped after: a lazy value followed by `\s*`
# tried every split of a run of spaces (quadratic in a hostile silence or route).
_MATCHER_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)(.*)', re.S)


@dataclass(frozen=True)
class Matcher:
    """A label matcher as in Alertmanager: name, op (=, !=, =~, !~) and value.

    Regular expressions are anchored (they must match the whole label value) and run on RE2
    (`monitor.patterns`): label values come from the Hub, so matching must take time linear
    in them whatever the pattern. A pattern RE2 refuses is refused here, when the policy or
    the silence is read. A label that is absent matches as the empty string.
    """

    name: str
    op: Literal["=", "!=", "=~", "!~"]
    value: str

    def __post_init__(self) -> None:
        # The compiled pattern is an attribute, not a field: it takes no part in equality,
        # hashing or the pydantic schema of the policies that hold matchers.
        pattern: LinearPattern | None = None
        if self.op in ("=~", "!~"):
            try:
                pattern = compile_linear(self.value)
            except PatternError as exc:
                raise ValueError(f"value {exc}") from None
        object.__setattr__(self, "_pattern", pattern)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        hit = self._pattern is not None and self._pattern.fullmatches(actual)   # set for =~ and !~
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value)}"


def parse_matcher(text: str) -> Matcher:
    """Parse `KEY=VALUE`, `KEY!=VALUE`, `KEY=~REGEX` or `KEY!~REGEX` (value optionally "quoted")."""
    match = _MATCHER_RE.fullmatch(text.strip())
    value = match.group(3).strip() if match is not None else ""
    if match is None or "\n" in value:
        raise ValueError(f"value {clip(repr(text), 80)} is not a matcher (write KEY=VALUE, KEY!=VALUE, "
                         "KEY=~REGEX or KEY!~REGEX)")
    name, op = match.group(1), match.group(2)
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"value {clip(repr(text), 80)} has a badly quoted value") from None
    return Matcher(name, op, value)  # type: ignore[arg-type]


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    """True when every matcher matches (an empty list matches everything)."""
    return all(m.matches(labels) for m in matchers)
