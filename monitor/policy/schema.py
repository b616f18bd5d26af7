"""The policy schema: what to watch, which task curves apply, and whom to tell.

Loading lives in `monitor.policy.load`. A policy is YAML, read defensively and validated strictly:

1. read by `monitor.files`: a regular file of at most 1 MiB (policy files are small;
   a huge one, a FIFO or a device is a mistake or an attack);
2. composed into a node tree by `monitor.yamlio`, which refuses any tag beyond plain
   strings, numbers, booleans, null, lists and mappings (so `!!python/object` never
   reaches a constructor), aliases that expand beyond a small budget (alias bombs),
   duplicate keys (YAML silently keeps the last one), and nesting or node counts no
   configuration needs (checked while composing, before anything recurses deeply);
3. validated by strict pydantic models (unknown keys are errors, no type coercion);
4. cross-checked like Alertmanager's config: every receiver a route names exists, every
   curve file exists and loads, names are unique.

Any other failure while loading a file (RecursionError, MemoryError, an OSError, ...) is a
PolicyError naming that file too: one bad file never stops the others from loading.

Every error names the file, the line, the key path and the offending value, e.g.
``policies/bad.yaml:12: tasks[0].margin: value 'x' is not a number``; the line comes from
the node tree, so it points at the key the user has to edit.

The vocabulary of routes follows Prometheus Alertmanager (receiver, group_by, group_wait,
group_interval, repeat_interval, matchers, continue) with the same defaults.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator,
                      model_validator)

from monitor.errors import PolicyError
from monitor.hub import WatchRule
from monitor.policy.matchers import Matcher, parse_matcher
from monitor.yamlio import clip

DEFAULT_GROUP_BY = ("policy", "repo", "commit")
GROUP_BY_ALL = "..."
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- durations -------------------------------------------------------------------------------
# ASCII digits, at most 15 of them per unit: int() never sees a 4,300-digit string.
_DURATION_UNITS = ("y", "w", "d", "h", "m", "s", "ms")
_DURATION_RE = re.compile("^" + "".join(f"(?:([0-9]{{1,15}}){unit})?" for unit in _DURATION_UNITS) + "$")
_DURATION_UNITS_S = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
# Far beyond any interval that makes sense, far below what timedelta can hold.
MAX_DURATION_S = 100 * 365 * 86400


def parse_duration(value: Any) -> timedelta:
    """Parse a Prometheus-style duration ("30s", "5m", "4h", "1d", "1h30m") into a timedelta."""
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str) or not value or (match := _DURATION_RE.match(value)) is None:
        raise ValueError(f"value {clip(repr(value), 80)} is not a duration (write it with units: 30s, 5m, 4h, 1d)")
    seconds = sum(int(part) * unit for part, unit in zip(match.groups(), _DURATION_UNITS_S) if part)
    if seconds > MAX_DURATION_S:
        raise ValueError(f"value {clip(repr(value), 80)} is longer than 100 years; write a shorter duration")
    return timedelta(seconds=seconds)


def format_duration(delta: timedelta) -> str:
    """The shortest Prometheus-style spelling of a duration (inverse of `parse_duration`)."""
    total_ms = round(delta.total_seconds() * 1000)
    if total_ms == 0:
        return "0s"
    out = ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, total_ms = divmod(total_ms, size)
        if count:
            out += f"{count}{unit}"
    return out


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _matcher_from(value: Any) -> Matcher:
    if isinstance(value, Matcher):
        return value
    if not isinstance(value, str):
        raise ValueError(f"value {value!r} is not a matcher (write KEY=VALUE, KEY!=VALUE, "
                         "KEY=~REGEX or KEY!~REGEX)")
    return parse_matcher(value)


MatcherField = Annotated[Matcher, BeforeValidator(_matcher_from)]


def _string_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# -- tasks and the calibration-gaming rule -----------------------------------------------------
EVALUATE_TRIGGERS = ("clear", "at_risk", "emerged")


class Evaluate(_Strict):
    """How to check a task's prediction by running the task (an active evaluation).

    kind:   `multiple_choice` (the built-in evaluator of `lstar eval` on a JSON-lines file) or
            `lm_eval` (an lm-evaluation-harness task through its Python API; needs the `bench`
            extra, refused at load without it)
    file:   the multiple-choice task file, relative to the policy file
    task:   the lm-evaluation-harness task name (kind lm_eval)
    metric: the observed metric compared with the curve (`acc` for multiple choice)
    on:     the predicted states that call for an evaluation (default at_risk and emerged)
    """

    kind: Literal["multiple_choice", "lm_eval"] = "multiple_choice"
    file: str | None = None
    task: str | None = None
    metric: str = Field("acc", pattern=r"^[A-Za-z0-9_.,-]{1,64}$")
    on: list[Literal["clear", "at_risk", "emerged"]] = Field(
        default_factory=lambda: ["at_risk", "emerged"], min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _on_key(cls, data: Any) -> Any:
        # YAML 1.1 reads the bare key `on` as the boolean true; here it can only mean `on`.
        if isinstance(data, dict) and True in data and "on" not in data:
            return {("on" if key is True else key): value for key, value in data.items()}
        return data

    @model_validator(mode="after")
    def _source(self) -> "Evaluate":
        if self.kind == "multiple_choice":
            if not self.file:
                raise ValueError("kind multiple_choice needs file (a JSON-lines task file, as `lstar eval` reads)")
            if self.task is not None:
                raise ValueError("task is for kind lm_eval; kind multiple_choice reads file")
            if self.metric != "acc":
                raise ValueError(f"value {self.metric!r}: the multiple-choice evaluator observes acc")
        else:
            if not self.task:
                raise ValueError("kind lm_eval needs task (an lm-evaluation-harness task name)")
            if self.file is not None:
                raise ValueError("file is for kind multiple_choice; kind lm_eval reads task")
        if len(set(self.on)) != len(self.on):
            raise ValueError(f"value {self.on!r} names a state twice")
        return self


class Evaluations(_Strict):
    """The policy's budget of active evaluations: at most `per_day` started per UTC day."""

    per_day: int = Field(20, ge=0, le=10_000)


class Task(_Strict):
    """One task curve applied to each new score.

    curve:      path of a curve artifact (JSON, `lstar-curve/1`), relative to the policy file
    margin:     ε; the task counts as emerged when performance reaches b_t + ε (default: the
                margin the curve was fitted with)
    confidence: 1 − δ, the level of the interval [lo, hi] around P̂; it must equal the level
                the curve's band was fitted at (say it here to have that checked)
    labels:     extra alert labels (e.g. severity)
    budget:     the deployment's inference budget (samples per question, majority of k, an
                ordered level); required for a curve fitted with a budget column, and one of
                the levels it was fitted at (no extrapolation)
    evaluate:   how to check its predictions by running the task (optional, `Evaluate`)
    derivatives: how a checkpoint with a matched base (a fine-tune, adapter or quantization
                of a scored base; `monitor.alerts.derivatives`) is judged: `base` (default)
                predicts from the base's coordinate L*(base) and flags the task residual ρ as
                unmeasured; `residual` adds the mean residual of labelled base/derivative pairs
                of the same relation, widening the interval by its uncertainty; `evaluate`
                predicts as `base` and evaluates every derivative directly with the task's
                `evaluate:` (whatever its predicted state), so that ρ is measured
    """

    name: str = Field(pattern=_NAME_PATTERN)
    curve: str
    margin: float | None = Field(None, gt=0.0, le=1.0)
    confidence: float | None = Field(None, gt=0.0, lt=1.0)
    labels: dict[str, str] = Field(default_factory=dict)
    budget: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    evaluate: Evaluate | None = None
    derivatives: Literal["base", "residual", "evaluate"] = "base"

    @model_validator(mode="after")
    def _derivatives_evaluated(self) -> "Task":
        # Direct evaluation of derivatives runs the task's own `evaluate:` on each of them.
        if self.derivatives == "evaluate" and self.evaluate is None:
            raise ValueError("derivatives: evaluate needs an `evaluate:` block (how to run the task)")
        return self


class LineagePolicy(_Strict):
    """What a policy does with checkpoints that declare a base model (`monitor.hub.lineage`).

    score_bases: a derivative's pinned base that no watch rule finds is added to the queue as
                 a reference checkpoint (same gate, budgets and scoring), so that its L*(base)
                 is known; it is never alerted on itself
    """

    score_bases: bool = False


class Corpora(_Strict):
    """Which corpora a policy reads L* on (manifest sha256 of each).

    public:  the corpus the task curves were fitted on; scores on other corpora are ignored
    private: a governance corpus kept off the Hub; with it, `calibration_gaming` can run
    """

    public: str | None = None
    private: str | None = None

    @field_validator("public", "private")
    @classmethod
    def _is_sha256(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_RE.match(value):
            raise ValueError(f"value {value!r} is not a corpus sha256 (64 lowercase hex digits)")
        return value


class CalibrationGaming(_Strict):
    """Flag checkpoints whose L* is suspiciously better on the public corpus than the private one.

    k:                     how many standard errors of the difference count as suspicious
    reference_checkpoints: `repo@sha` of checkpoints trusted not to have seen either corpus;
                           their mean public − private offset is the expected gap
    """

    k: float = Field(3.0, gt=0.0)
    reference_checkpoints: list[str] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("reference_checkpoints")
    @classmethod
    def _refs(cls, value: list[str]) -> list[str]:
        for ref in value:
            repo, _, sha = ref.partition("@")
            if not repo or not sha:
                raise ValueError(f"value {ref!r} is not a checkpoint reference (write repo@commit)")
        return value

    def references(self) -> list[tuple[str, str]]:
        """The reference checkpoints as (repo, sha) pairs."""
        return [tuple(ref.rsplit("@", 1)) for ref in self.reference_checkpoints]  # type: ignore[misc]


# -- routes ----------------------------------------------------------------------------------
class Route(_Strict):
    """A node of the routing tree (Alertmanager's `route`).

    An alert enters at the root; the first child whose matchers all match takes it (and the
    search goes on past that child only with `continue: true`); a node no child took
    handles the alert itself. Unset group_by and timers are inherited from the parent.
    """

    receiver: str | None = None
    matchers: list[MatcherField] = Field(default_factory=list)
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    continue_: bool = Field(False, alias="continue")
    routes: list["Route"] = Field(default_factory=list)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @field_validator("group_by")
    @classmethod
    def _label_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if name != GROUP_BY_ALL and not _LABEL_NAME_RE.match(name):
                raise ValueError(f"value {name!r} is not a label name")
        return value

    def walk(self) -> Iterator[tuple[str, "Route"]]:
        """Every node with its key path below `route` ('' for the root)."""
        yield "", self
        for i, child in enumerate(self.routes):
            for sub, node in child.walk():
                yield f".routes[{i}]{sub}", node


class RootRoute(Route):
    """The root of the routing tree: it must name a receiver and carries the defaults."""

    receiver: str
    group_by: list[str] = Field(default_factory=lambda: list(DEFAULT_GROUP_BY))
    group_wait: Duration = timedelta(seconds=30)
    group_interval: Duration = timedelta(minutes=5)
    repeat_interval: Duration = timedelta(hours=4)


# -- receivers -------------------------------------------------------------------------------
def _one_secret_source(env: str | None, file: str | None, what: str) -> None:
    """A secret comes from an environment variable or a file (never the policy itself)."""
    if env is not None and file is not None:
        raise ValueError(f"give {what}_env or {what}_file, not both")


class WebhookConfig(_Strict):
    """An HTTP endpoint receiving Alertmanager-format JSON, signed per Standard Webhooks.

    secret_env / secret_file: the `whsec_...` signing secret (optional; unsigned without)
    timeout: per request (default 15s); redirects are never followed
    """

    url: str
    secret_env: str | None = None
    secret_file: str | None = None
    timeout: Duration = timedelta(seconds=15)
    max_alerts: int = Field(0, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^\s/]+", value):
            raise ValueError(f"value {value!r} is not an http(s) URL")
        return value

    @model_validator(mode="after")
    def _secret(self) -> "WebhookConfig":
        _one_secret_source(self.secret_env, self.secret_file, "secret")
        return self


class EmailConfig(_Strict):
    """An SMTP server and the mails to send through it.

    tls: `starttls` (upgrade a plain connection; the default on port 587), `ssl` (TLS from
    the first byte; port 465) or `none` (local relays only). Credentials come from the
    environment or a file; the password is never written into the policy.
    """

    to: Annotated[list[str], BeforeValidator(_string_list)] = Field(min_length=1)
    from_: str = Field(alias="from")
    host: str
    port: int = Field(587, ge=1, le=65535)
    tls: Literal["none", "starttls", "ssl"] = "starttls"
    ca_file: str | None = None
    username: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    password_file: str | None = None
    timeout: Duration = timedelta(seconds=30)
    subject_prefix: str = "[lstar]"
    templates: str | None = None

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @field_validator("to")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            if not isinstance(address, str) or "@" not in address:
                raise ValueError(f"value {address!r} is not an email address")
        return value

    @field_validator("from_")
    @classmethod
    def _from_address(cls, value: str) -> str:
        if "@" not in value:
            raise ValueError(f"value {value!r} is not an email address")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> "EmailConfig":
        if self.username is not None and self.username_env is not None:
            raise ValueError("give username or username_env, not both")
        _one_secret_source(self.password_env, self.password_file, "password")
        has_user = self.username is not None or self.username_env is not None
        has_password = self.password_env is not None or self.password_file is not None
        if has_user != has_password:
            raise ValueError("give both a username and a password source, or neither")
        return self


class FileConfig(_Strict):
    """An append-only JSON-lines file (relative paths are relative to the policy file)."""

    path: str


class RateLimit(_Strict):
    """At most `max` notifications per `per` through one receiver; the rest wait."""

    max: int = Field(20, ge=1)
    per: Duration = timedelta(hours=1)


class RetryConfig(_Strict):
    """Full-jitter exponential backoff: attempt n waits U(0, min(max_backoff, initial·2^(n−1)))."""

    max_attempts: int = Field(15, ge=1, le=100)
    initial_backoff: Duration = timedelta(seconds=30)
    max_backoff: Duration = timedelta(hours=6)


class Receiver(_Strict):
    """A named channel: exactly one of webhook, email, file."""

    name: str = Field(pattern=_NAME_PATTERN)
    webhook: WebhookConfig | None = None
    email: EmailConfig | None = None
    file: FileConfig | None = None
    send_resolved: bool | None = None
    rate_limit: RateLimit = RateLimit()
    retry: RetryConfig = RetryConfig()

    @model_validator(mode="after")
    def _one_channel(self) -> "Receiver":
        given = [k for k in ("webhook", "email", "file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of webhook, email, file"
                             + (f" (got {', '.join(given)})" if given else ""))
        return self

    @property
    def kind(self) -> Literal["webhook", "email", "file"]:
        return "webhook" if self.webhook else "email" if self.email else "file"

    @property
    def resolved_notifications(self) -> bool:
        """Whether to send resolved notifications (Alertmanager defaults: webhook yes, email no)."""
        return self.send_resolved if self.send_resolved is not None else self.kind != "email"


# -- reports ---------------------------------------------------------------------------------
class Schedule(_Strict):
    """When a report runs: a crontab line (`0 9 * * MON`) or an interval (`7d`)."""

    cron: str | None = None
    every: Duration | None = None
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _crontab(cls, value: str | None) -> str | None:
        if value is not None:
            from apscheduler.triggers.cron import CronTrigger

            try:
                CronTrigger.from_crontab(value, timezone="UTC")
            except ValueError as exc:
                raise ValueError(f"value {value!r} is not a crontab line: {exc}") from exc
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"value {value!r} is not a time zone name") from exc
        return value

    @model_validator(mode="after")
    def _one(self) -> "Schedule":
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of cron or every")
        return self


class Report(_Strict):
    """A periodic governance summary (the daemon runs it; the policy only says when and to whom)."""

    name: str = Field(pattern=_NAME_PATTERN)
    schedule: Schedule
    receivers: list[str] = Field(min_length=1)
    format: Literal["markdown", "html", "json"] = "markdown"
    window: Duration = timedelta(days=7)


# -- the policy ------------------------------------------------------------------------------
class Policy(_Strict):
    """A whole policy file. `path` is set by `load_policy` (relative paths resolve against it)."""

    name: str = Field(pattern=_NAME_PATTERN)
    description: str = ""
    external_url: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    watch: list[WatchRule] = Field(default_factory=list)
    corpora: Corpora = Corpora()
    tasks: list[Task] = Field(default_factory=list)
    evaluations: Evaluations = Evaluations()
    calibration_gaming: CalibrationGaming | None = None
    lineage: LineagePolicy = LineagePolicy()
    route: RootRoute
    receivers: list[Receiver] = Field(min_length=1)
    meta_receivers: list[str] = Field(default_factory=list)
    reports: list[Report] = Field(default_factory=list)

    _path: Path | None = PrivateAttr(None)
    _source_sha256: str | None = PrivateAttr(None)
    _loaded_at: datetime | None = PrivateAttr(None)
    # evaluate.file as written -> sha256 of the task file this policy validated (at load, or
    # when the observe tick found it changed and valid): what its evaluations run.
    _task_sha256: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def path(self) -> Path | None:
        """The file this policy was loaded from (None when built in code)."""
        return self._path

    @property
    def source_sha256(self) -> str | None:
        """sha256 of the exact text this policy was parsed from (None when built in code): the
        version in force, even after the file on disk has changed since."""
        return self._source_sha256

    @property
    def loaded_at(self) -> datetime | None:
        """When that text was read."""
        return self._loaded_at

    def task_file_sha256(self, file: str) -> str | None:
        """The sha256 of the task file `file` (an `evaluate.file`) as this policy last validated
        it; None when it has not validated that file."""
        return self._task_sha256.get(file)

    def note_task_file(self, file: str, sha256: str) -> None:
        """Record that the task file `file` was validated with content `sha256`."""
        self._task_sha256[file] = sha256

    def receiver(self, name: str) -> Receiver:
        """The receiver called `name` (raises PolicyError when undefined)."""
        for r in self.receivers:
            if r.name == name:
                return r
        raise PolicyError(f"policy {self.name!r} has no receiver {name!r}",
                          hint=f"defined: {', '.join(r.name for r in self.receivers)}")

    def task(self, name: str) -> Task:
        """The task called `name` (raises PolicyError when undefined)."""
        for t in self.tasks:
            if t.name == name:
                return t
        raise PolicyError(f"policy {self.name!r} has no task {name!r}")

    def resolve_path(self, value: str) -> Path:
        """A path from the policy, resolved against the policy file's folder."""
        p = Path(value).expanduser()
        if p.is_absolute() or self.path is None:
            return p
        return self.path.parent / p
