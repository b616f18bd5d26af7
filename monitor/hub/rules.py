"""Watch rules: which Hub repos to follow, which revisions count, and the download budgets.

A watch rule selects repos (author, name glob, search text, pipeline tag, parameter range,
the derivatives a base's model cards name) and which revisions count (`main`, or branches/tags
matching a regex).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from monitor.errors import PolicyError
from monitor.files import FileKind
from monitor.patterns import PatternError, compile_glob, compile_linear
from monitor.yamlio import clip, load_yaml_file

RULES_FILE = FileKind("watch-rules file", "watch-rules files", "YAML")
# The shortest literal part of a name glob that may stand in for `search`: shorter ones
# (`7B`, `-7B`) match a large part of the Hub, so such a poll would list it all.
GLOB_SEARCH_MIN_CHARS = 4
# The longest name_glob a rule may hold: a repo id is at most 96 characters on the Hub.
NAME_GLOB_MAX_CHARS = 256
# A base a rule follows the derivatives of: a Hub repo id (the Hub's limit is 96 characters).
BASE_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$"
# Fields added after watermarks were first keyed: left out of the key while unset, so that
# adding them never restarts an existing rule from scratch.
_LATER_FIELDS = ("derivatives_of", "relation")


def glob_literal(glob: str) -> str:
    """The longest run of a shell glob that every match contains verbatim ('' if none).

    Wildcards (`*`, `?`), character classes (`[...]`) and `/` end a run; a repo id that
    matches the glob contains each run as a substring, so the Hub's substring `search` on
    the longest one returns every repo the glob can match.
    """
    # Scanned by hand: the pattern `\[[^\]]*\]` rescanned the rest of the glob from every
    # unclosed '[' (quadratic in a line of them); here each character is looked at once or twice.
    runs, run, i = [], [], 0
    closes = glob.rfind("]")   # a '[' after the last ']' opens no class: it is a literal
    while i < len(glob):
        char = glob[i]
        end = glob.find("]", i + 1) if char == "[" and i < closes else -1
        if end >= 0 or char in "*?/":
            runs.append("".join(run))
            run, i = [], (end + 1 if end >= 0 else i + 1)
        else:
            run.append(char)
            i += 1
    runs.append("".join(run))
    return max(runs, key=len)


# -- watch rules ---------------------------------------------------------------------------
class RevisionPattern(BaseModel):
    """Which refs of a repo count as checkpoints: branch and/or tag names (full-match regex).

    Pythia-style training runs keep steps as branches: `{branches: "step\\d+"}`. The Hub
    names the refs, so the patterns run on RE2 (`monitor.patterns`, linear in the name):
    one RE2 refuses (a backreference, a lookaround) is refused when the rule is read.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    branches: str | None = None
    tags: str | None = None

    @field_validator("branches", "tags")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_linear(value)
            except PatternError as exc:
                raise ValueError(f"value {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_needed(self) -> "RevisionPattern":
        if self.branches is None and self.tags is None:
            raise ValueError("give `branches` and/or `tags` (a regex), or use revisions: main")
        return self

    def matches(self, kind: Literal["branch", "tag"], name: str) -> bool:
        text = self.branches if kind == "branch" else self.tags
        # compile_linear keeps what it compiled (the validator has checked that it compiles)
        return text is not None and compile_linear(text).fullmatches(name)


class Budgets(BaseModel):
    """Safety limits checked by the gate before any weight byte is downloaded.

    Parameters and bytes come from the safetensors headers (bytes: the larger of the
    declared tensor data and the Hub's file sizes); every config.json field that sizes an
    allocation (layers, hidden size, intermediate size, heads, experts, vocabulary, context
    length) has its own limit, and the parameters the config implies must fit both
    `max_params` and the weights (see `monitor.hub.config_budget`). Defaults admit mainstream
    open models up to ~15B parameters in bf16 and refuse absurd values (a vocabulary of
    10^9, a million layers).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_params: int = Field(15_000_000_000, gt=0)
    max_bytes: int = Field(32 * 1024**3, gt=0)
    max_vocab: int = Field(1_048_576, gt=0)
    max_context: int = Field(16_777_216, gt=0)
    max_layers: int = Field(1024, gt=0)
    max_hidden: int = Field(65_536, gt=0)
    max_intermediate: int = Field(262_144, gt=0)
    max_heads: int = Field(1024, gt=0)
    max_experts: int = Field(1024, gt=0)


class WatchRule(BaseModel):
    """One watch rule: which Hub repos to follow and which of their commits to score.

    Fields:
      name         unique name of the rule (checkpoint rows and watermarks refer to it)
      author       Hub user or organisation (server-side filter)
      name_glob    shell glob on the repo id; without a '/' it matches the part after the
                   owner (`pythia-*`), with one the whole id (`EleutherAI/pythia-*`);
                   `fnmatch` rules, matched with RE2 (linear in the name); at most 256
                   characters
      search       substring of the repo id (server-side filter)
      derivatives_of  a base repo id (`org/base`): the repos whose model card names it as
                   `base_model` (fine-tunes, adapters, quantizations, merges), found with the
                   Hub's `base_model:org/base` search filter (server-side)
      relation     with derivatives_of: only derivatives of this relation (finetune, adapter,
                   quantized, merge; the Hub's `base_model:RELATION:org/base` filter)
      pipeline_tag e.g. `text-generation` (server-side filter)
      min_params / max_params  parameter range; checked from the listing when the Hub
                   reports safetensors totals, else from the safetensors header at the gate
      revisions    `main`, or `{branches: REGEX, tags: REGEX}` (full match on ref names)
      budgets      safety limits of the gate (see `Budgets`)
      scan_limit   the most repos one poll looks at (bounds a rule's first poll)
    At least one of author, search, name_glob, pipeline_tag or derivatives_of is required. Without author
    or search, the longest literal part of name_glob (at least GLOB_SEARCH_MIN_CHARS
    characters, else the rule is refused) is sent as `search`, so a glob never lists the
    whole Hub and filters it locally.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    author: str | None = None
    name_glob: str | None = None
    search: str | None = None
    pipeline_tag: str | None = None
    derivatives_of: str | None = Field(None, pattern=BASE_REPO_PATTERN)
    relation: Literal["finetune", "adapter", "quantized", "merge"] | None = None
    min_params: int | None = Field(None, ge=0)
    max_params: int | None = Field(None, gt=0)
    revisions: Literal["main"] | RevisionPattern = "main"
    budgets: Budgets = Budgets()
    scan_limit: int = Field(1000, ge=1, le=100_000)

    @field_validator("name_glob")
    @classmethod
    def _glob_compiles(cls, value: str | None) -> str | None:
        if value is not None:
            if len(value) > NAME_GLOB_MAX_CHARS:
                raise ValueError(f"a name_glob is at most {NAME_GLOB_MAX_CHARS} characters, this one has "
                                 f"{len(value):,} (a Hub repo id is at most 96)")
            try:
                compile_glob(value)
            except PatternError as exc:
                raise ValueError(f"not a glob: {exc.reason}") from None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "WatchRule":
        if not (self.author or self.search or self.name_glob or self.pipeline_tag or self.derivatives_of):
            raise ValueError("give at least one of author, search, name_glob, pipeline_tag, derivatives_of")
        if self.search and self.search.startswith("base_model:"):
            raise ValueError(f"search {self.search!r} is a substring of repo ids, not the Hub's base_model filter; "
                             "write `derivatives_of: ORG/BASE` (with `relation: adapter` etc. to narrow it)")
        if self.relation is not None and self.derivatives_of is None:
            raise ValueError("relation narrows derivatives_of; give derivatives_of: ORG/BASE with it")
        if self.name_glob and not (self.author or self.search or self.derivatives_of) \
                and len(glob_literal(self.name_glob)) < GLOB_SEARCH_MIN_CHARS:
            raise ValueError(
                f"watch rule {self.name!r}: name_glob {self.name_glob!r} has no literal part of at least "
                f"{GLOB_SEARCH_MIN_CHARS} characters to search the Hub by, so every poll would list the "
                "whole Hub; add `author` or `search`, or a glob with a longer literal part")
        if self.min_params is not None and self.max_params is not None \
                and self.min_params > self.max_params:
            raise ValueError(f"min_params {self.min_params} is above max_params {self.max_params}")
        return self

    def list_params(self) -> dict[str, Any]:
        """Server-side filters for `HfApi.list_models` (`search` derived from name_glob when
        neither author, search nor derivatives_of is given; `filter` the Hub's
        `base_model:[RELATION:]ORG/NAME` tag for derivatives_of)."""
        search = self.search
        if not (self.author or search or self.derivatives_of) and self.name_glob:
            search = glob_literal(self.name_glob)
        params = {"author": self.author, "search": search, "pipeline_tag": self.pipeline_tag,
                  "filter": self.base_model_filter()}
        return {k: v for k, v in params.items() if v}

    def base_model_filter(self) -> str | None:
        """The Hub's search filter for derivatives_of: `base_model:org/base`, or with relation
        `base_model:adapter:org/base` (None without derivatives_of)."""
        if self.derivatives_of is None:
            return None
        return f"base_model:{self.relation + ':' if self.relation else ''}{self.derivatives_of}"

    def matches_name(self, repo_id: str) -> bool:
        """Whether `repo_id` matches name_glob (`fnmatch.fnmatchcase`'s answer, in linear time)."""
        if not self.name_glob:
            return True
        target = repo_id if "/" in self.name_glob else repo_id.split("/", 1)[-1]
        # compile_glob keeps what it compiled (the validator has checked that it compiles)
        return compile_glob(self.name_glob).fullmatches(target)

    def params_in_range(self, n_params: int | None) -> bool:
        """True when `n_params` is inside [min_params, max_params] or unknown."""
        if n_params is None:
            return True
        if self.min_params is not None and n_params < self.min_params:
            return False
        return self.max_params is None or n_params <= self.max_params

    def key(self, endpoint: str) -> str:
        """Watermark key: the name plus a hash of what the rule selects and where.

        Changing what a rule selects (or the Hub it asks) starts it from scratch.
        """
        selection = self.model_dump(mode="json", exclude={"name", "budgets", "scan_limit"})
        for later in _LATER_FIELDS:
            if selection.get(later) is None:
                selection.pop(later, None)
        blob = json.dumps({"endpoint": endpoint.rstrip("/"), **selection}, sort_keys=True)
        return f"{self.name}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _error_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _union_tag(part: Any) -> bool:
    """A part of a pydantic error location naming a union member, not a key."""
    return isinstance(part, str) and ("[" in part or part == RevisionPattern.__name__)


def load_watch_rules(path: str | Path) -> list[WatchRule]:
    """Read a YAML file whose top-level `watch:` is a list of `WatchRule` mappings.

    Read with the policy files' checks (size, UTF-8, no tags, no alias bombs), then strict
    validation; errors name the file, the key path and the offending value.
    """
    path = Path(path)
    try:
        data = load_yaml_file(path, what=RULES_FILE)
    except PolicyError as exc:
        raise PolicyError(f"not valid YAML: {exc.message}", hint=exc.hint) from None
    if not isinstance(data, dict) or "watch" not in data:
        raise PolicyError(f"{path}: expected a mapping with a top-level `watch:` list",
                          hint="see WatchRule in monitor/hub/rules.py for the fields")
    unknown = sorted(set(data) - {"watch"})
    if unknown:
        raise PolicyError(f"{path}: unknown top-level key(s): {', '.join(unknown)}")
    if not isinstance(data["watch"], list):
        raise PolicyError(f"{path}: watch: expected a list of rules, got {type(data['watch']).__name__}")
    rules: list[WatchRule] = []
    for i, item in enumerate(data["watch"]):
        try:
            rules.append(WatchRule.model_validate(item))
        except ValidationError as exc:
            errors = exc.errors()
            # `revisions` is `main` or a mapping: given a mapping, what is wrong in it says more
            # than that it is not the literal `main` (which pydantic lists first).
            err = errors[0]
            if isinstance(err.get("input"), dict) and any(str(p).startswith("literal[") for p in err["loc"]):
                err = next((e for e in errors if not any(str(p).startswith("literal[") for p in e["loc"])), err)
            key = _error_path(["watch", i, *(p for p in err["loc"] if not _union_tag(p))])
            raise PolicyError(f"{path}: {key}: {clip(err['msg'].removeprefix('Value error, '))} (got {clip(repr(err.get('input')), 80)})") from exc
    names = [r.name for r in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PolicyError(f"{path}: duplicate rule name(s): {', '.join(dupes)}")
    return rules
