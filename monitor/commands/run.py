"""`lstar run` (the daemon) and `lstar status` (asks it, or reads the database read-only).

`lstar run`'s options are generated from the daemon's one configuration model
(`monitor.service.settings.RunSettings`): each setting's flag, help, panel, default and rule
are written there once; the flags given on the command line are validated with the
environment and the config file by that model.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import TypeAdapter, ValidationError
from rich.table import Table

from monitor.commands.options import (DB_OPTION, JSON_OPTION, STATE_OPTION, OptionError, bounded_int, db_file,
                                      describe_range)
from monitor.commands.terminal import echo, plain_console
from monitor.commands.through_daemon import through_daemon
from monitor.environment import hub_reachable

if TYPE_CHECKING:
    from monitor.service.settings import RunSettings


def _check_field(name: str) -> Any:
    """A typer callback that checks one flag's value by its field's rule in `RunSettings`
    (the same rule the environment and the config file are held to)."""
    from monitor.service.settings import RunSettings

    info = RunSettings.model_fields[name]
    adapter = TypeAdapter(Annotated[(info.annotation, *info.metadata)]) if info.metadata else \
        TypeAdapter(info.annotation)

    def check(value: Any) -> Any:
        if value is None or value == []:
            return value
        try:
            adapter.validate_python(value)
        except ValidationError as exc:
            raise OptionError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None
        return value

    return check


def _bounds(info: Any) -> tuple[int | None, int | None]:
    low = next((m.ge for m in info.metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in info.metadata if hasattr(m, "le")), None)
    return low, high


def _cli_type(info: Any) -> Any:
    """The Python type typer parses a setting's flag as: ints, flags, repeated names and
    paths as themselves; durations, sizes and choices as text the field's rule reads."""
    base = info.annotation
    if base in (int, int | None) and not any(type(m).__name__ == "BeforeValidator" for m in info.metadata):
        return int | None
    if base is bool:
        return bool | None
    if base in (Path, Path | None):
        return Path | None
    if base == list[str]:
        return list[str] | None
    return str | None


def _option(name: str, info: Any) -> Any:
    """The typer option of one setting: its flag, help (with its environment variable and
    range), default as shown, and panel in --help."""
    from monitor.service.settings import default_shown, env_of

    extra = info.json_schema_extra
    helptext = info.description
    kwargs: dict[str, Any] = {}
    if _cli_type(info) == int | None:
        low, high = _bounds(info)
        kwargs["parser"] = bounded_int(low, high)   # the field's range, checked as typer parses
        helptext += f" ({describe_range(low=low, high=high, integer=True).removeprefix('an ')})"
    else:
        kwargs["callback"] = _check_field(name)
    if _cli_type(info) == list[str] | None:
        kwargs["metavar"] = "HOST"
    # The model's default, as --help shows it; only flags given on the command line are passed
    # to the model (`given_on_command_line`), so the environment and the file are not overridden.
    default = info.default if info.default != [] else None
    return typer.Option(default, extra["flag"], help=f"{helptext} Env {env_of(name)}.", rich_help_panel=extra["panel"],
                        show_default=default_shown(name) is not None, **kwargs)


def _run_signature() -> tuple[inspect.Signature, dict[str, Any]]:
    """The `lstar run` command's parameters: --config, then one option per setting."""
    from monitor.service.settings import settings_fields

    kind = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("ctx", kind, annotation=typer.Context),
              inspect.Parameter("config", kind, annotation=Path | None, default=typer.Option(
                  None, "--config", rich_help_panel="Configuration",
                  help="YAML or TOML file of settings (keys as the options' names with _, e.g. poll_every: 15m); "
                       "flags override the LSTAR_* environment, which overrides the file."))]
    for name, info in settings_fields():
        params.append(inspect.Parameter(name, kind, annotation=_cli_type(info), default=_option(name, info)))
    return inspect.Signature(params), {p.name: p.annotation for p in params}


def given_on_command_line(ctx: Any) -> dict[str, Any]:
    """The settings' flags given on the command line (not typer's placeholders for the rest)."""
    from monitor.service.settings import RunSettings

    out = {}
    for name in RunSettings.model_fields:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            out[name] = ctx.params[name]
    return out


def run_settings_from(ctx: Any, config: Path | None) -> RunSettings:
    """The validated settings of one `lstar run` (flags > environment > file > defaults), after
    a warning for each `LSTAR_*` variable nothing reads (a misspelt one may be why they fail)."""
    from monitor.service.settings import SettingError, env_of, load_run_settings

    given = given_on_command_line(ctx)
    try:
        settings = load_run_settings(given, config_file=config)
    except SettingError as exc:
        _warn_unread_environment(given.get("policies") or os.environ.get(env_of("policies")))
        raise OptionError(exc.problem, param_hint=exc.where) from None
    _warn_unread_environment(settings.policies)
    return settings


def _warn_unread_environment(policies: Any) -> None:
    from monitor.service.settings import environment_warnings

    for line in environment_warnings(os.environ, Path(policies) if policies else None):
        echo(f"warning: {line}", err=True)


def register(app: typer.Typer) -> None:
    def run(**values: Any) -> None:
        """Run the watcher: poll, gate, fetch, score, evaluate, alert and report on schedule.

        Every option can also be set in the environment (its Env name, e.g. LSTAR_POLL_EVERY=5m) or in a --config file (poll_every: 5m). A flag wins over the environment, the environment over the file, the file over the default; all are validated together.
        """  # noqa: E501 - one paragraph: --help wraps it
        from monitor.scoring.backends import check_ray_installed
        from monitor.scoring.memory_limit import check_score_memory
        from monitor.service import run_daemon

        ctx, config = values["ctx"], values["config"]
        settings = run_settings_from(ctx, config)
        if settings.scoring_backend == "ray":
            check_ray_installed()   # a clear error now, not at the first scoring run
        daemon_config = settings.daemon_config()
        if settings.scoring_backend == "local" and settings.score_memory != "auto":
            # A limit too small to load torch would fail every checkpoint: refuse it now, before
            # anything is written. `auto` is at least min(memory, 4 GiB), far above that need.
            check_score_memory(daemon_config.score_memory)
        # A Hub on this machine is polled whatever HF_HUB_OFFLINE says (as `lstar demo` does); with
        # it set, any other Hub is refused here, before anything is opened or written.
        with hub_reachable("lstar run", daemon_config.endpoint, verb="poll"):
            raise typer.Exit(run_daemon(daemon_config))

    run.__signature__, run.__annotations__ = _run_signature()  # type: ignore[attr-defined]
    app.command("run")(run)

    @app.command("status")
    def status(state: Path = STATE_OPTION, db: Path | None = DB_OPTION,
               as_json: bool = JSON_OPTION) -> None:
        """What the daemon is doing (asks it), or what the database holds when it is not running."""
        data = read_status(state, db)
        if as_json:
            print(json.dumps(data, indent=2, default=str))
            return
        console = plain_console()
        if data["daemon"] is None:
            console.print(f"no daemon running on {db_file(state, db).parent}; read {data['db']} read-only",
                          soft_wrap=True, markup=False, highlight=False)
        else:
            console.print(f"daemon pid {data['daemon']['pid']} since {data['daemon']['started_at']} "
                          f"({data['daemon']['url']})")
        counts = Table(title="checkpoints", title_justify="left")
        counts.add_column("status")
        counts.add_column("rows", justify="right")
        for name, n in data["checkpoints"].items():
            counts.add_row(name, str(n))
        console.print(counts)
        for name, job in (data.get("jobs") or {}).items():
            line = f"{name:9} runs {job['runs']:>4}  failures {job['failures']:>3}  last ok {job['last_success']}"
            if job.get("last_error"):
                line += f"  error: {job['last_error']}"
            console.print(line, markup=False, highlight=False)
        for path, message in (data.get("policy_errors") or {}).items():
            console.print(f"policy error (last good version kept): {message}", markup=False)
        for reason in data.get("stuck", {}).values():
            console.print(f"STUCK: {reason}", markup=False)
        if (data.get("disk") or {}).get("error"):
            console.print(f"DISK FULL: {data['disk']['error']}", markup=False)
        if (data.get("database") or {}).get("error"):
            console.print(f"DATABASE INVALIDATED: {data['database']['error']}", markup=False)
        for line in data.get("scoring_pins") or []:
            console.print(f"DEGRADED: {line}", markup=False, soft_wrap=True, highlight=False)
        for o in data.get("observations") or []:
            what = (f"{o['observed_state']} ({o['verdict']})" if o["status"] == "done"
                    else o["status"] + (f" ({o['reason']})" if o.get("reason") else ""))
            console.print(f"EVALUATIONS: policy {o['policy']}, task {o['task']}: {o['n']} {what}",
                          markup=False, soft_wrap=True, highlight=False)
        for n in data.get("not_evaluated") or []:
            console.print(f"NOT EVALUATED: policy {n['policy']}, task {n['task']}: {n['checkpoints']} "
                          f"checkpoint(s): {n['reason']}", markup=False, soft_wrap=True, highlight=False)


def read_status(state: Path, db_path: Path | None = None) -> dict:
    """The daemon's /status when one runs on the state directory (the folder of `db_path` when
    given), else counts from a read-only open."""
    db = db_file(state, db_path)

    def ask(url: str) -> dict:
        from monitor.service import api_get

        data = api_get(url, "/status")
        data["daemon"] = {"pid": data["pid"], "started_at": data["started_at"], "url": url}
        return data

    return through_daemon(db, ask, lambda store: {"daemon": None, "db": str(db),
                                                  "checkpoints": store.checkpoint_counts(),
                                                  "not_evaluated": store.not_evaluated_summary(),
                                                  "observations": store.observation_summary()})
