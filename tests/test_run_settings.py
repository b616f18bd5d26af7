"""`lstar run`'s one configuration (monitor.service.settings.RunSettings): flags, the LSTAR_*
environment and a --config file validated together, flag > environment > file > default, and
a bad value from any source refused in one line naming the field as that source spells it."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from monitor.cli import main
from monitor.commands.options import CommandLineError, OptionError
from monitor.service import DaemonConfig
from monitor.service.settings import RunSettings, SettingError, load_run_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("LSTAR_") and name.removeprefix("LSTAR_").lower() in RunSettings.model_fields:
            monkeypatch.delenv(name)


def _parsed(args: list[str]):
    """`lstar run`'s real command-line parsing, then its settings, without starting the daemon."""
    import typer.main

    from monitor.cli import app
    from monitor.commands.run import run_settings_from

    run = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    with run.make_context("run", list(args)) as ctx:
        return run_settings_from(ctx, ctx.params["config"])


def test_flag_beats_environment_beats_file_beats_default(tmp_path, monkeypatch):
    config = tmp_path / "lstar.yaml"
    config.write_text("policies: /from/file\npoll_every: 1h\napi_workers: 4\nscoring_workers: 2\n"
                      "api_allowed_host: [lstar]\n")
    monkeypatch.setenv("LSTAR_POLL_EVERY", "30m")
    monkeypatch.setenv("LSTAR_API_WORKERS", "6")
    monkeypatch.setenv("LSTAR_API_ALLOWED_HOST", "lstar.internal,Monitor")
    settings = _parsed(["--config", str(config), "--poll-every", "2m"])
    assert settings.poll_every == 120.0            # flag
    assert settings.api_workers == 6               # environment over file
    assert settings.api_allowed_host == ["lstar.internal", "monitor"]   # environment, comma-separated
    assert settings.scoring_workers == 2           # file over default
    assert settings.policies == Path("/from/file")
    assert settings.report_every == 300.0          # default (5m)
    daemon = settings.daemon_config()
    assert (daemon.poll_interval, daemon.api_workers, daemon.scoring_workers) == (120.0, 6, 2)
    assert daemon.api_allowed_hosts == ("lstar.internal", "monitor")


def test_a_toml_file_reads_the_same(tmp_path):
    config = tmp_path / "lstar.toml"
    config.write_text('policies = "/p"\npoll_every = "45m"\ncache_keep = "all"\nworker_max_rss = "8G"\n')
    settings = load_run_settings({}, config_file=config)
    assert (settings.poll_every, settings.cache_keep, settings.worker_max_rss) == (2700.0, None, 8 << 30)


def test_defaults_are_the_daemons_defaults():
    """Without any source, the settings give the DaemonConfig its own defaults (written apart)."""
    got = load_run_settings({"policies": "p"}).daemon_config()
    want = DaemonConfig(policies_dir=Path("p"), state_dir=Path("state"))
    for f in fields(DaemonConfig):
        if f.name in ("template", "score_memory"):
            continue
        assert getattr(got, f.name) == getattr(want, f.name), f.name


BAD = [("--poll-every", "LSTAR_POLL_EVERY", "poll_every", "0s", "give a duration of at least 1s"),
       ("--api-workers", "LSTAR_API_WORKERS", "api_workers", "0", None),
       ("--scoring-backend", "LSTAR_SCORING_BACKEND", "scoring_backend", "slurm",
        "'slurm' is not a scoring backend; use one of: local, ray"),
       ("--cache-max-bytes", "LSTAR_CACHE_MAX_BYTES", "cache_max_bytes", "12", "give a size from 1M to 1024T"),
       ("--device", "LSTAR_DEVICE", "device", "gpu", "give auto, cpu, cuda or cuda:N")]


@pytest.mark.parametrize("flag,env,key,value,said", BAD, ids=[b[2] for b in BAD])
@pytest.mark.parametrize("source", ["flag", "environment", "file"])
def test_a_bad_value_names_its_field_and_source(source, flag, env, key, value, said, tmp_path, monkeypatch, capsys):
    argv = ["run", "--policies", str(tmp_path / "none"), "--state", str(tmp_path / "state"), "--once"]
    config = tmp_path / "lstar.yaml"
    config.write_text("poll_every: 20m\n")   # a valid file, whatever the source under test
    argv += ["--config", str(config)]
    if source == "flag":
        argv += [flag, value]
        where = f"'{flag}'"
    elif source == "environment":
        monkeypatch.setenv(env, value)
        where = f"{env} (environment)"
    else:
        config.write_text(f"{key}: '{value}'\n")
        where = f"'{key}' in {config.resolve()} (config file)"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: Invalid value for {where}: "), err
    assert said is None or said in err, err
    assert not (tmp_path / "state").exists()   # nothing started


def test_file_problems_are_one_line_naming_the_file(tmp_path, capsys):
    base = ["run", "--policies", str(tmp_path), "--state", str(tmp_path / "state")]
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("poll_evry: 5m\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("poll_every: [5m\n")
    listed = tmp_path / "list.yaml"
    listed.write_text("- 5m\n")
    for path, said in ((unknown, "'poll_evry' in"), (broken, "is not valid YAML"),
                       (listed, "must hold a mapping"), (tmp_path / "missing.yaml", "cannot read it"),
                       (tmp_path, "is not a file")):
        assert main([*base, "--config", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "state").exists()


def test_cross_field_rules_name_the_source_too(tmp_path, monkeypatch):
    monkeypatch.setenv("LSTAR_RAY_ADDRESS", "127.0.0.1:6379")
    with pytest.raises(SettingError) as caught:
        load_run_settings({"policies": "p"})
    assert caught.value.where == "LSTAR_RAY_ADDRESS (environment)"
    assert "--ray-address is only used with --scoring-backend ray" in caught.value.problem
    monkeypatch.setenv("LSTAR_SCORING_BACKEND", "ray")
    assert load_run_settings({"policies": "p"}).ray_address == "127.0.0.1:6379"


def test_help_shows_one_grouped_configuration(capsys):
    assert main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for panel in ("Configuration", "Policies and state", "Local API", "Schedule", "Hub and cache", "Scoring spec"):
        assert panel in out
    for name, info in RunSettings.model_fields.items():
        flag = info.json_schema_extra["flag"]
        assert len(re.findall(rf"{re.escape(flag)}(?![\w-])", out)) >= 1, flag
        env = "LSTAR_" + name.upper()
        assert env in out.replace("│", "").replace("\n", "").replace(" ", ""), env


def test_one_hierarchy_for_command_line_errors():
    """Every module raises the package's own command-line errors, never click's or typer's own."""
    assert issubclass(OptionError, CommandLineError)
    import typer

    assert issubclass(OptionError, typer.BadParameter)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "monitor").rglob("*.py")
                 if re.search(r"\b(click|typer)\.(BadParameter|UsageError)\(", p.read_text())]
    assert offenders == []
