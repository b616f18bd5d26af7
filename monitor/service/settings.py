"""The daemon's one configuration: `RunSettings`, validated from flags, environment and file together.

Every setting of `lstar run` is a field here, read (pydantic-settings) from, in order of
precedence: its command-line flag, its environment variable (`LSTAR_` + the field name in
capitals, e.g. `LSTAR_POLL_EVERY`), the optional config file (`--config FILE`, YAML or TOML,
keys as the field names, e.g. `poll_every: 15m`), and its default. Durations are written
`30s`/`15m`/`1h30m`, sizes `512M`/`16G`. A bad value, from whichever source, is refused as
one line naming the field as that source spells it (`'--poll-every'`, `LSTAR_POLL_EVERY
(environment)`, `poll_every in lstar.yaml (config file)`) and what to give instead.

`RunSettings.daemon_config()` turns the validated settings into the `DaemonConfig` the daemon
runs with (seconds, bytes, the scoring template). The `lstar run` command's flags are
generated from these fields (`monitor.commands.run`), so a setting, its default, its range
and its help are written once.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

if sys.version_info >= (3, 11):
    import tomllib
else:   # pragma: no cover - the tomli backport has the same API
    import tomli as tomllib

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic_settings import (BaseSettings, EnvSettingsSource, InitSettingsSource, NoDecode,
                               PydanticBaseSettingsSource, SettingsConfigDict)

from monitor.constants import (DAY_S, DEFAULT_CORPUS_DIR, DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES, DEVICE_PATTERN, MAX_BATCH,
                               MAX_RESAMPLES, DTypeChoice)
from monitor.errors import LstarError, PolicyError
from monitor.events import LOG_FORMATS
from monitor.files import FileKind, read_bounded_bytes

if TYPE_CHECKING:
    from monitor.service.daemon import DaemonConfig

ENV_PREFIX = "LSTAR_"
MAX_CONFIG_BYTES = 1 << 20    # a config file is a page of settings, not a data set
# An error quotes at most this much of a value (a value may be a megabyte of file, or a list
# its aliases expanded): the message stays one readable line.
MAX_QUOTED_CHARS = 80
CONFIG_FILE = FileKind("config file", "config files", "YAML or TOML")
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def quoted(value: Any) -> str:
    """`repr(value)`, shortened to `MAX_QUOTED_CHARS` for an error message."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS - 3] + "..."


def _clipped_name(name: str) -> str:
    """A variable's name as written, shortened like `quoted` but without the quotes."""
    text = repr(name)[1:-1]
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS - 3] + "..."


class SettingError(LstarError):
    """A setting of `lstar run` refused: `where` names it as its source spells it."""

    def __init__(self, where: str, problem: str) -> None:
        # A last bound on what any message quotes (the value parsers' own messages included).
        if len(problem) > 4 * MAX_QUOTED_CHARS:
            problem = problem[:4 * MAX_QUOTED_CHARS - 3] + "..."
        super().__init__(f"invalid value for {where}: {problem}")
        self.where = where
        self.problem = problem


# -- value parsers (also used by the other commands' flags) ---------------------------------------
def parse_seconds(value: Any, *, low: float = 1.0) -> float:
    """A duration (`30s`, `15m`, `1h30m`) in seconds, at least `low` (at most 100 years)."""
    from monitor.policy import format_duration, parse_duration

    delta = parse_duration(value)   # ValueError names the value and the units
    if delta.total_seconds() < low:
        raise ValueError(f"{quoted(value)} is not allowed; give a duration of at least "
                         f"{format_duration(timedelta(seconds=low))}")
    return delta.total_seconds()


def parse_size(value: Any, *, low: int, high: int) -> int:
    """A size (`512M`, `16G`, `1.5T`, or bytes) in bytes, within [low, high]."""
    text = str(value).strip().lower().removesuffix("ib").removesuffix("b")
    try:
        number = float(text[:-1]) * _SIZE_UNITS[text[-1]] if text and text[-1] in _SIZE_UNITS else float(text)
    except ValueError:
        raise ValueError(f"{quoted(value)} is not a size (e.g. 8G, 512M)") from None
    if not (math.isfinite(number) and low <= number <= high):
        raise ValueError(f"{quoted(value)} is not allowed; give a size from {_size(low)} to {_size(high)}")
    return int(number)


def _size(n: int) -> str:
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n} bytes"


def _seconds(low: float) -> Any:
    return BeforeValidator(lambda v: v if v is None else parse_seconds(v, low=low))


def _size_or(words: tuple[str, ...], *, low: int, high: int) -> Any:
    """A size, or one of `words` (None)."""
    def check(value: Any) -> int | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in words):
            return None
        return parse_size(value, low=low, high=high)
    return BeforeValidator(check)


def _one_of(choices: tuple[str, ...], what: str) -> Any:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"{quoted(value)} is not {what}; use one of: {', '.join(choices)}")
        return value
    return BeforeValidator(check)


def _api_host(value: Any) -> str:
    from monitor.service.api import API_HOSTS

    if value not in API_HOSTS:
        raise ValueError(f"{quoted(value)} is not allowed; use 127.0.0.1 (this machine only) or 0.0.0.0 "
                         "(every interface, in a container)")
    return value


def _allowed_hosts(value: Any) -> list[str]:
    """Host names, from a list or a comma-separated string (an environment variable)."""
    items = value.split(",") if isinstance(value, str) else list(value or [])
    names = []
    for item in items:
        name = str(item).strip().lower()
        if not _HOST_NAME.fullmatch(name):
            raise ValueError(f"{quoted(item)} is not a host name; give a name such as lstar or lstar.internal "
                             "(no port, scheme or wildcard)")
        names.append(name)
    return names


def _cache_keep(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("all", "none", "off")):
        return None
    try:
        keep = int(value)
    except (TypeError, ValueError):
        keep = -1
    if isinstance(value, bool) or not 0 <= keep <= 1_000_000:
        raise ValueError(f"{quoted(value)} is not allowed; give a count of checkpoints from 0 to 1,000,000, or 'all'")
    return keep


def _score_memory(value: Any) -> str:
    """auto, none/off, N% of the machine's memory, or a size (kept as written: `auto` is
    resolved with the device in `daemon_config`)."""
    from monitor.scoring import physical_memory

    text = str(value).strip().lower()
    if text in ("auto", "none", "off"):
        return text
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise ValueError(f"{quoted(value)} is not a share of memory between 0% and 100%")
        if physical_memory() is None:
            raise ValueError("this machine's memory size is unknown; give a size (e.g. 16G)")
        return text
    parse_size(text, low=256 << 20, high=64 << 40)
    return text


def _device(value: Any) -> str:
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"{quoted(value)} is not allowed; give auto, cpu, cuda or cuda:N")
    return value


def _setting(default: Any, flag: str, panel: str, help: str, **kwargs: Any) -> Any:
    """A field with its flag, its panel in `lstar run --help` and its help line."""
    return Field(default, description=help, json_schema_extra={"flag": flag, "panel": panel}, **kwargs)


PATHS, API, SCHEDULE, HUB, SCORING, SPEC, RUN = ("Policies and state", "Local API", "Schedule", "Hub and cache",
                                                 "Scoring", "Scoring spec", "Run mode and logs")

# The config file's values while `load_run_settings` validates (read once, by `_file_values`).
_config_values: ContextVar[dict[str, Any] | None] = ContextVar("lstar_config_values", default=None)


class RunSettings(BaseSettings):
    """Everything `lstar run` is told, validated together (see the module docstring)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", case_sensitive=False,
                                      validate_default=True)

    # -- policies and state
    policies: Path | None = _setting(None, "--policies", PATHS, "Folder of policy files (*.yaml), re-read on change.")
    state: Path = _setting(Path("state"), "--state", PATHS, "State directory (database, lock, API info).")
    webhook_secret_file: Path | None = _setting(None, "--webhook-secret-file", PATHS,
                                                "Hub webhook secret (else $LSTAR_HUB_WEBHOOK_SECRET).")
    # -- local API
    api_port: int = _setting(8787, "--api-port", API, "Port of the local API (0: any free port).", ge=0, le=65535)
    api_host: Annotated[str, AfterValidator(_api_host)] = _setting(
        "127.0.0.1", "--api-host", API,
        "Address the local API listens on: 127.0.0.1, or 0.0.0.0 in a container whose port is published "
        "(every read but /health and /metrics then needs the API token).")
    api_allowed_host: Annotated[list[str], NoDecode, BeforeValidator(_allowed_hosts)] = _setting(
        [], "--api-allowed-host", API,
        "A Host name the API accepts beside 127.0.0.1 and localhost (repeatable; comma-separated in the "
        "environment), e.g. a container's service name.")
    api_idle_timeout: Annotated[float, _seconds(0.1)] = _setting(
        "15s", "--api-idle-timeout", API,
        "A request to the local API must arrive whole within this; idle connections are closed after it.")
    api_workers: int = _setting(8, "--api-workers", API, "Requests the local API serves at once (more get "
                                "503, /health and /metrics excepted).", ge=1, le=256)
    api_max_connections: int = _setting(
        4096, "--api-max-connections", API, "Connections the local API holds open at once; at the bound a new one "
        "closes the one that has waited longest for its request.", ge=16, le=65536)
    api_connection_lifetime: Annotated[float, _seconds(1.0)] = _setting(
        "1m", "--api-connection-lifetime", API,
        "A connection to the local API is closed this long after it opened, however busy.")
    # -- run mode and logs
    once: bool = _setting(False, "--once", RUN, "Run every job once, wait for the alerts raised to be sent "
                          "(see --once-wait), print a summary, then exit.")
    once_wait: Annotated[float, _seconds(0.0)] = _setting(
        "60s", "--once-wait", RUN, "With --once: the longest wait for pending alerts to be sent (0s: do not wait).")
    log_format: Annotated[str, _one_of(LOG_FORMATS, "a log format")] = _setting(
        "text", "--log-format", RUN, "Log lines as text, or json (one JSON object per line).")
    drain: Annotated[float, _seconds(0.0)] = _setting("1m", "--drain", RUN,
                                                      "How long SIGTERM waits for running jobs (0s: not at all).")
    # -- schedule
    poll_every: Annotated[float, _seconds(1.0)] = _setting("15m", "--poll-every", SCHEDULE, "Hub poll interval.")
    score_every: Annotated[float, _seconds(1.0)] = _setting("1m", "--score-every", SCHEDULE,
                                                            "How often the queue is checked.")
    outbox_every: Annotated[float, _seconds(1.0)] = _setting("30s", "--outbox-every", SCHEDULE,
                                                             "Evaluate and dispatch interval.")
    reload_every: Annotated[float, _seconds(1.0)] = _setting("10s", "--reload-every", SCHEDULE,
                                                             "Policy-file change check interval.")
    report_every: Annotated[float, _seconds(1.0)] = _setting("5m", "--report-every", SCHEDULE,
                                                             "How often due reports are checked.")
    watchdog_every: Annotated[float, _seconds(1.0)] = _setting("10s", "--watchdog-every", SCHEDULE,
                                                               "Watchdog interval.")
    stuck_after: Annotated[float, _seconds(1.0)] = _setting("2h", "--stuck-after", SCHEDULE,
                                                            "A job running longer is reported stuck.")
    prune_every: Annotated[float, _seconds(1.0)] = _setting("6h", "--prune-every", SCHEDULE,
                                                            "How often old log rows are pruned.")
    # Rate limits and repeat intervals read recent delivery attempts: keep at least a day.
    retention: Annotated[float, _seconds(DAY_S)] = _setting(
        "90d", "--retention", SCHEDULE, "Hub polls and delivery attempts older than this are pruned (at least 1d).")
    # -- hub and cache
    endpoint: str | None = _setting(None, "--endpoint", HUB, "Hub endpoint (default: $HF_ENDPOINT or the Hub).")
    hub_cache_dir: Path | None = _setting(None, "--cache-dir", HUB, "Hub download cache (default: the HF cache).")
    cache_keep: Annotated[int | None, BeforeValidator(_cache_keep)] = _setting(
        str(DEFAULT_KEEP_LAST), "--cache-keep", HUB,
        "Finished checkpoints kept in the Hub cache after scoring ('all': never prune). "
        "Pending jobs' files are never pruned.")
    cache_max_bytes: Annotated[int | None, _size_or(("none",), low=1 << 20, high=1 << 50)] = _setting(
        f"{DEFAULT_MAX_BYTES >> 30}G", "--cache-max-bytes", HUB,
        "Prune finished checkpoints further while the cache holds more than this (or 'none').")
    hub_max_wait: Annotated[float, _seconds(0.0)] = _setting(
        "1m", "--hub-max-wait", HUB, "Longer Hub rate-limit waits end the job instead of sleeping (0s: never sleep).")
    hub_cooldown: Annotated[float, _seconds(1.0)] = _setting("5m", "--hub-cooldown", HUB,
                                                             "Circuit-breaker cool-down.")
    hub_circuit_threshold: int = _setting(5, "--hub-circuit-threshold", HUB, "Consecutive Hub failures that open "
                                          "the circuit (and raise one outage alert).", ge=1, le=1000)
    # -- scoring
    scoring_backend: Annotated[str, _one_of(("local", "ray"), "a scoring backend")] = _setting(
        "local", "--scoring-backend", SCORING,
        "Where scoring runs: local (child processes beside the daemon, see --scoring-workers) or ray (tasks on "
        'a Ray cluster; needs pip install -e ".\\[ray]").')
    scoring: Annotated[str, _one_of(("full", "sequential"), "a scoring mode")] = _setting(
        "full", "--scoring", SCORING,
        "full: every document of the corpus selection; sequential: score blocks of a pinned document order and "
        "stop once every task of every policy watching the repo is settled (a partial score, marked so in its "
        "alerts).")
    scoring_workers: int = _setting(1, "--scoring-workers", SCORING,
                                    "Local backend: scoring children kept warm between jobs (torch imported, "
                                    "tokenizers and baselines cached), each scoring one job at a time; 0: a fresh "
                                    "child per job.", ge=0, le=64)
    worker_max_jobs: int = _setting(20, "--worker-max-jobs", SCORING,
                                    "A warm scoring worker is replaced by a fresh one after this many jobs.",
                                    ge=1, le=100_000)
    worker_max_rss: Annotated[int | None, _size_or(("auto",), low=64 << 20, high=1 << 50)] = _setting(
        "auto", "--worker-max-rss", SCORING,
        "A warm scoring worker is replaced once its resident memory passes this (a size, e.g. 8G; auto: half of "
        "--score-memory, or of the machine's memory without a limit).")
    score_timeout: Annotated[float, _seconds(1.0)] = _setting("1h", "--score-timeout", SCORING,
                                                              "Scoring child time limit.")
    score_memory: Annotated[str, AfterValidator(_score_memory)] = _setting(
        "auto", "--score-memory", SCORING,
        "Scoring child address-space limit: auto (75% of memory; none on a GPU host), a size (16G), a share "
        "(50%), or none. A limit too small to load torch is refused at start.")
    lease: Annotated[float | None, _seconds(1.0)] = _setting(None, "--lease", SCORING,
                                                             "Queue lease (default: score timeout + 10m).")
    ray_address: str | None = _setting(None, "--ray-address", SCORING,
                                       "Ray cluster to score on with --scoring-backend ray (default: $RAY_ADDRESS, "
                                       "else a Ray instance started on this machine).")
    ray_gpu_memory: Annotated[int | None, _size_or((), low=1 << 30, high=1 << 44)] = _setting(
        None, "--ray-gpu-memory", SCORING,
        "Memory of one GPU of the Ray cluster (e.g. 80G): a CUDA job whose estimate is larger asks for several "
        "GPUs of one node and is spread over them (device_map auto).")
    # -- scoring spec
    corpus: Path = _setting(DEFAULT_CORPUS_DIR, "--corpus", SPEC, "Calibration corpus folder.")
    docs: int | None = _setting(None, "--docs", SPEC, "Score only the first N documents.", ge=1)
    max_context: int | None = _setting(None, "--max-context", SPEC, "Scoring window (tokens).", ge=2)
    device: Annotated[str, AfterValidator(_device)] = _setting("auto", "--device", SPEC, "auto, cpu, cuda or cuda:N.")
    dtype: DTypeChoice = _setting("auto", "--dtype", SPEC, "auto: bf16 on a GPU of compute capability 8 or "
                                  "later, float32 elsewhere; resolved once, recorded with each score.")
    batch_size: int = _setting(8, "--batch-size", SPEC, "Windows per forward pass.", ge=1, le=MAX_BATCH)
    n_boot: int = _setting(1000, "--n-boot", SPEC, "Bootstrap resamples for the SE.", ge=2, le=MAX_RESAMPLES)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (passed as init values) > environment > the config file; no .env or secrets dir."""
        values = _config_values.get()
        return (init_settings, env_settings) + \
            ((InitSettingsSource(settings_cls, init_kwargs=values),) if values is not None else ())

    def daemon_config(self) -> DaemonConfig:
        """The `DaemonConfig` these settings describe (seconds, bytes, the scoring template)."""
        # the daemon's and the scoring stage's modules load when the daemon is configured, not
        # when `lstar run --help` reads these settings' fields
        from monitor.scoring import ScoreRequest
        from monitor.service.daemon import DaemonConfig

        template = ScoreRequest(corpus_dir=self.corpus, docs=self.docs, max_context=self.max_context,
                                device=self.device, dtype=self.dtype, batch_size=self.batch_size,
                                n_boot=self.n_boot, progress=False)
        assert self.policies is not None   # load_run_settings refuses settings without it
        return DaemonConfig(
            policies_dir=self.policies, state_dir=self.state, endpoint=self.endpoint, api_port=self.api_port,
            api_host=self.api_host, api_allowed_hosts=tuple(self.api_allowed_host),
            api_idle_timeout=self.api_idle_timeout, api_workers=self.api_workers,
            api_connection_lifetime=self.api_connection_lifetime, api_max_connections=self.api_max_connections,
            once=self.once, once_wait=self.once_wait,
            log_format=self.log_format, cache_dir=self.hub_cache_dir, poll_interval=self.poll_every,
            score_interval=self.score_every, outbox_interval=self.outbox_every,
            reload_interval=self.reload_every, report_interval=self.report_every,
            watchdog_interval=self.watchdog_every, stuck_after=self.stuck_after, score_timeout=self.score_timeout,
            score_memory=self.score_memory_bytes(), cache_keep=self.cache_keep,
            cache_max_bytes=self.cache_max_bytes, lease=self.lease, drain=self.drain,
            hub_max_wait=self.hub_max_wait, hub_cooldown=self.hub_cooldown,
            hub_circuit_threshold=self.hub_circuit_threshold, retention=self.retention,
            prune_interval=self.prune_every, webhook_secret_file=self.webhook_secret_file, template=template,
            scoring_backend=self.scoring_backend, ray_address=self.ray_address, scoring_mode=self.scoring,
            scoring_workers=self.scoring_workers, worker_max_jobs=self.worker_max_jobs,
            worker_max_rss=self.worker_max_rss, ray_gpu_bytes=self.ray_gpu_memory)

    def score_memory_bytes(self) -> int | None:
        """`score_memory` in bytes: auto is a share of this machine's memory (none on a GPU host)."""
        from monitor.scoring import default_memory_limit, physical_memory

        text = self.score_memory
        if text == "auto":
            return default_memory_limit(self.device)
        if text in ("none", "off"):
            return None
        if text.endswith("%"):
            return int((physical_memory() or 0) * float(text[:-1]) / 100)
        return parse_size(text, low=256 << 20, high=64 << 40)


# -- where a value came from ----------------------------------------------------------------------
def flag_of(name: str) -> str:
    """The command-line flag of field `name` (e.g. --poll-every)."""
    return str(RunSettings.model_fields[name].json_schema_extra["flag"])  # type: ignore[index]


def env_of(name: str) -> str:
    return ENV_PREFIX + name.upper()


@dataclass(frozen=True)
class Sources:
    """The values each source gave (flags, environment, file), to name the source of an error."""

    flags: Mapping[str, Any]
    env: Mapping[str, Any]
    file: Mapping[str, Any]
    file_path: Path | None

    def where(self, name: str) -> str:
        """Field `name` as the source that set it spells it (the highest in precedence)."""
        if name not in RunSettings.model_fields:   # an unknown key: only a file can hold one
            return f"{quoted(name)} in {self.file_path} (config file)"
        if name in self.flags:
            return f"'{flag_of(name)}'"
        if name in self.env:
            return f"{env_of(name)} (environment)"
        if name in self.file:
            return f"{quoted(name)} in {self.file_path} (config file)"
        return f"'{flag_of(name)}' (default)"


def _read_config_file(path: Path) -> Path:
    """The config file, resolved (symlinks too) and bounded, or a SettingError saying why not."""
    where = f"--config {path}"
    try:
        real = Path(path).expanduser().resolve(strict=True)
        size = real.stat().st_size
    except OSError as exc:
        raise SettingError(where, f"cannot read it ({exc.strerror or exc}); give an existing YAML or TOML file")
    if not real.is_file():
        raise SettingError(where, "is not a file; give a YAML or TOML file")
    if size > MAX_CONFIG_BYTES:
        raise SettingError(where, f"is {size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a config file may have")
    if real.suffix.lower() not in (".yaml", ".yml", ".toml"):
        raise SettingError(where, "is neither .yaml/.yml nor .toml; name the file by its format")
    return real


def load_run_settings(flags: Mapping[str, Any], *, config_file: Path | None = None) -> RunSettings:
    """The settings from `flags` (only those given on the command line), the `LSTAR_*`
    environment and `config_file`, validated together; SettingError naming the field and
    its source otherwise."""
    path = _read_config_file(config_file) if config_file is not None else None
    sources = Sources(flags=dict(flags), env=_env_values(), file=_file_values(path), file_path=path)
    token = _config_values.set(dict(sources.file) if path is not None else None)
    try:
        try:
            settings = RunSettings(**sources.flags)
        except ValidationError as exc:
            raise _first_problem(exc, sources) from None
    finally:
        _config_values.reset(token)
    _check_together(settings, sources)
    return settings


def _env_values() -> dict[str, Any]:
    try:
        return dict(EnvSettingsSource(RunSettings, env_prefix=ENV_PREFIX, case_sensitive=False)())
    except Exception as exc:  # pydantic-settings' own decoding error, before validation
        raise SettingError("the LSTAR_* environment", " ".join(str(exc).split())[:4 * MAX_QUOTED_CHARS]) from None


def _file_values(path: Path | None) -> dict[str, Any]:
    """The config file's settings. YAML goes through the policy files' bounded loader
    (`monitor.yamlio`: alias budget, nesting and node limits, no tags, no duplicate keys),
    so a few hundred bytes of nested aliases are refused at once, not expanded to gigabytes."""
    from monitor.yamlio import load_yaml_file

    if path is None:
        return {}
    if path.suffix.lower() == ".toml":
        # Read once, bounded and regular-only on the open descriptor (a file swapped for a FIFO
        # or grown after the size check cannot hang or flood this read), then parsed from memory.
        try:
            data = read_bounded_bytes(path, str(path), what=CONFIG_FILE, limit=MAX_CONFIG_BYTES)
        except PolicyError as exc:
            detail = exc.message.removeprefix(f"{path}:").strip()
            raise SettingError(f"--config {path}", f"{detail}; {exc.hint}" if exc.hint else detail) from None
        try:
            return dict(tomllib.loads(data.decode("utf-8")))
        except Exception as exc:   # TOML syntax (line and column), bad UTF-8, nesting too deep
            raise SettingError(f"--config {path}", "is not valid TOML: " +
                               " ".join(str(exc).split())[:4 * MAX_QUOTED_CHARS]) from None
    try:
        document = load_yaml_file(path, str(path), what=CONFIG_FILE)
    except PolicyError as exc:   # "PATH:3: aliases expand to ...", "PATH:1: YAML syntax error: ..."
        raise SettingError(f"--config {path}", _yaml_problem(exc.message, path)) from None
    if document is not None and not isinstance(document, dict):   # a list or a scalar
        raise SettingError(f"--config {path}", "must hold a mapping of settings (key: value)")
    return dict(document or {})


def _yaml_problem(message: str, path: Path) -> str:
    """The loader's message without the file (the error names it already), its line spelt out."""
    detail = message.removeprefix(f"{path}:").lstrip()
    line, _, rest = detail.partition(": ")
    if line.isdigit():
        detail = f"line {line}: {rest}"
    if "YAML syntax error: " in detail or "not YAML: " in detail:
        return "is not valid YAML: " + detail.replace("YAML syntax error: ", "").replace("not YAML: ", "")
    return detail


def _first_problem(exc: ValidationError, sources: Sources) -> SettingError:
    err = exc.errors()[0]
    name = str(err["loc"][0]) if err["loc"] else "(top level)"
    if err["type"] == "extra_forbidden":
        return SettingError(sources.where(name), "not a setting of lstar run (see lstar run --help)")
    if err["type"] == "missing":
        return SettingError(sources.where(name), "is required")
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] not in ("value_error",):
        message = f"{quoted(err.get('input'))}: {message}" if "input" in err else message
    return SettingError(sources.where(name), message)


def _check_together(settings: RunSettings, sources: Sources) -> None:
    """Rules between fields, after each is valid on its own."""
    if settings.policies is None:
        raise SettingError("'--policies'", f"missing; give --policies DIR, {env_of('policies')} or "
                           "'policies' in the config file")
    for name in ("ray_address", "ray_gpu_memory"):
        if getattr(settings, name) is not None and settings.scoring_backend != "ray":
            raise SettingError(sources.where(name), f"{flag_of(name)} is only used with --scoring-backend ray")


# The package's own LSTAR_* variables beside the settings': fail points of crash tests, the
# API's webhook secret, the scoring model cache, the lab's crash tests.
OWN_VARIABLES = ("LSTAR_FAILPOINT", "LSTAR_HUB_WEBHOOK_SECRET", "LSTAR_CACHE_DIR",
                 "LSTAR_LAB_KILL_AT_STEP", "LSTAR_LAB_KILL_AFTER_LINEAGES")


def environment_warnings(environ: Mapping[str, str], policies: Path | None) -> list[str]:
    """One line per `LSTAR_*` variable that nothing reads (a misspelt setting is otherwise
    silently ignored), naming the closest known name. Known: every setting's variable, the
    package's own (`OWN_VARIABLES`) and the secrets the receivers of `policies` name
    (`secret_env: LSTAR_WEBHOOK_SECRET`)."""
    unknown = sorted(name for name in environ if name.upper().startswith(ENV_PREFIX)
                     and name.upper()[len(ENV_PREFIX):].lower() not in RunSettings.model_fields
                     and name.upper() not in OWN_VARIABLES)
    if unknown and policies is not None:
        named = set(_policy_secret_variables(policies))
        unknown = [name for name in unknown if name not in named]
    # Compared without the prefix every candidate shares (else LSTAR_QQQ "resembles" LSTAR_ONCE).
    known = [env_of(name) for name in RunSettings.model_fields] + list(OWN_VARIABLES)
    suffixes = {name[len(ENV_PREFIX):]: name for name in known}
    lines = []
    for name in unknown:
        close = [suffixes[s] for s in difflib.get_close_matches(name.upper()[len(ENV_PREFIX):], suffixes, n=1)]
        lines.append(f"environment variable {_clipped_name(name)} is not a setting of lstar run and is ignored"
                     + (f" (did you mean {close[0]}?)" if close else ""))
    return lines


def _policy_secret_variables(folder: Path) -> Iterable[str]:
    """The environment variables the receivers of the policies in `folder` read (files that do
    not load are skipped: the daemon reports them)."""
    from monitor.policy import load_policy, policy_files_in
    from monitor.policy.secrets import SECRET_KEYS

    for path in policy_files_in(folder):
        try:
            policy = load_policy(path, check_curves=False)
        except LstarError:
            continue
        for receiver in policy.receivers:
            config = getattr(receiver, receiver.kind, None)
            for key in SECRET_KEYS.get(receiver.kind, ()):
                value = getattr(config, key, None)
                if key.endswith("_env") and isinstance(value, str):
                    yield value


def default_shown(name: str) -> str | None:
    """The default of field `name` as `--help` shows it (None: no default to show)."""
    default = RunSettings.model_fields[name].default
    if default is None or default == [] or default is False:
        return None
    return str(default)


def settings_fields() -> list[tuple[str, Any]]:
    """(name, FieldInfo) of every setting, in declaration order."""
    return list(RunSettings.model_fields.items())


__all__ = ["ENV_PREFIX", "MAX_BATCH", "MAX_RESAMPLES", "OWN_VARIABLES", "RunSettings", "SettingError", "Sources",
           "default_shown", "env_of", "environment_warnings", "flag_of", "load_run_settings", "parse_seconds",
           "parse_size", "quoted", "settings_fields"]
