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


def _alias_bomb(levels: int, width: int, size: int) -> str:
    """A setting's value `[&a ["x", ...], &b [*a, *a, ...], ...]`: width ** levels strings,
    padded to `size` bytes."""
    lines = ["poll_every:", "- &a [" + ",".join(['"x"'] * width) + "]"]
    for prev, name in zip("abcdefghijklmnop", "bcdefghijklmnop"[:levels - 1]):
        lines.append(f"- &{name} [" + ",".join([f"*{prev}"] * width) + "]")
    text = "\n".join(lines) + "\n"
    return text + "#" * (size - len(text) - 1) + "\n"


@pytest.mark.parametrize("levels,width,size", [(9, 9, 342), (10, 10, 438)])
def test_an_alias_bomb_config_is_refused_at_once(levels, width, size, tmp_path, capsys):
    """342 bytes once cost 43 s, 578 MB and a 28 MB error line quoting the expanded value;
    438 bytes ran past 300 s at 2.3 GB."""
    import time
    import tracemalloc

    config = tmp_path / "bomb.yaml"
    config.write_text(_alias_bomb(levels, width, size))
    assert config.stat().st_size == size
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code = main(["run", "--policies", str(tmp_path), "--state", str(tmp_path / "state"), "--once",
                     "--config", str(config)])
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and len(err) < 300, err
    assert "aliases expand to more than 10,000 nodes" in err and str(config) in err, err
    assert seconds < 2.0 and peak < 20 << 20, (seconds, peak)
    assert not (tmp_path / "state").exists()


def test_an_error_never_quotes_a_whole_value(tmp_path, monkeypatch, capsys):
    """A value within the alias budget (729 bad host names), a 200 kB string, a 200 kB key or
    environment value: each error is one short line."""
    base = ["run", "--policies", str(tmp_path), "--state", str(tmp_path / "state"), "--once"]
    config = tmp_path / "lstar.yaml"
    long = "z" * 200_000
    cases = [
        "h: &h [" + ",".join(["'not a host!'"] * 9) + "]\ng: &g [" + ",".join(["*h"] * 9) + "]\n"
        "api_allowed_host: [" + ",".join(["*g"] * 9) + "]\n",
        f"poll_every: '{long}'\n",
        f"{long}: 1\n",
        f"api_allowed_host: ['{long}']\n",
    ]
    for text in cases:
        config.write_text(text)
        assert main([*base, "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and len(err) < 300 + len(str(config)), err[:400]
    monkeypatch.setenv("LSTAR_POLL_EVERY", long)
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 300, err[:400]


def test_an_unknown_lstar_variable_is_warned_about_with_the_closest_name(tmp_path, monkeypatch, capsys):
    """A misspelt LSTAR_* variable was silently ignored. Known: the settings' variables, the
    package's own, and the secrets the policies' receivers name (the example policy's)."""
    import shutil

    from monitor.service.settings import environment_warnings

    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copy(ROOT / "policies" / "example.yaml", policies / "example.yaml")
    environ = {"LSTAR_POL_EVERY": "5m", "lstar_api_prot": "1", "LSTAR_POLL_EVERY": "5m", "LSTAR_FAILPOINT": "",
               "LSTAR_WEBHOOK_SECRET": "s", "LSTAR_SMTP_PASSWORD": "p", "LSTAR_QQQ": "1", "PATH": "/bin"}
    assert environment_warnings(environ, policies) == [
        "environment variable LSTAR_POL_EVERY is not a setting of lstar run and is ignored "
        "(did you mean LSTAR_POLL_EVERY?)",
        "environment variable LSTAR_QQQ is not a setting of lstar run and is ignored",
        "environment variable lstar_api_prot is not a setting of lstar run and is ignored "
        "(did you mean LSTAR_API_PORT?)"]
    # without the policies, their secrets are unknown too
    assert len(environment_warnings(environ, None)) == 5
    # `lstar run` prints it once, before the error the misspelling may have caused
    monkeypatch.setenv("LSTAR_POLICY", str(policies))
    assert main(["run", "--state", str(tmp_path / "state"), "--once"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("warning: environment variable LSTAR_POLICY is not a setting of lstar run and is ignored "
                      "(did you mean LSTAR_POLICIES?)")
    assert len(err) == 2 and "'--policies'" in err[1], err


def test_every_lstar_variable_the_package_reads_is_known():
    """Each `LSTAR_NAME` the package's source spells is a setting's or in OWN_VARIABLES, so
    reading a new one without listing it fails here rather than warning its users."""
    from monitor.service.settings import OWN_VARIABLES, env_of

    known = {env_of(name) for name in RunSettings.model_fields} | set(OWN_VARIABLES)
    spelt = {m for p in (ROOT / "monitor").rglob("*.py")
             for m in re.findall(r"[\"'](LSTAR_[A-Z0-9_]*[A-Z0-9])[\"']", p.read_text(encoding="utf-8"))}
    assert spelt and spelt <= known, spelt - known


def test_a_toml_config_is_read_once_bounded_and_regular_only(tmp_path):
    """The size and kind checks of `--config` hold at the read itself: a TOML file swapped for a
    FIFO after those checks is refused at once (pydantic-settings' reader skipped it silently, so
    the start-up went on without the file's settings), and one grown
    past the bound is refused without being read whole."""
    import os
    import threading

    from monitor.service import settings as run_settings

    fifo = tmp_path / "swapped.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            run_settings._file_values(fifo)
        except BaseException as exc:   # the error is the outcome under test
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():   # unblock the old reader so the thread ends, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("reading a FIFO named as the TOML config blocked")
    assert outcome and isinstance(outcome[0], run_settings.SettingError), outcome
    assert "named pipe (FIFO)" in str(outcome[0]) and str(fifo) in str(outcome[0])

    big = tmp_path / "grown.toml"
    big.write_text("poll_every = '1h'\n" + "# padding\n" * (run_settings.MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(run_settings.SettingError, match="limited to 1,048,576 bytes"):
        run_settings._file_values(big)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 200_000)
    with pytest.raises(run_settings.SettingError, match="is not valid TOML"):
        run_settings._file_values(deep)
