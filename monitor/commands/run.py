"""`lstar run` (the daemon) and `lstar status` (asks it, or reads the database read-only)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import typer
from rich.table import Table

from monitor.commands.options import (DB_OPTION, MAX_BATCH, MAX_RESAMPLES, STATE_OPTION, db_file, device_option,
                                      int_option, seconds, size_bytes)
from monitor.commands.terminal import plain_console
from monitor.commands.through_daemon import through_daemon
from monitor.environment import refuse_hub_offline
from monitor.events import LOG_FORMATS
from monitor.hub import DEFAULT_KEEP_LAST, DEFAULT_MAX_BYTES
from monitor.scoring import ScoreRequest, default_memory_limit, physical_memory
from monitor.scoring.backends import BACKENDS, check_ray_installed
from monitor.scoring.memory_limit import check_score_memory
from monitor.service import DAY_S, DaemonConfig, api_get, run_daemon


def _score_memory(value: str, device: str) -> int | None:
    """`--score-memory`: auto (a share of the machine's memory), none, N% of it, or a size."""
    text = value.strip().lower()
    if text == "auto":
        return default_memory_limit(device)
    if text in ("none", "off"):
        return None
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 < share <= 100:
            raise click.BadParameter(f"{value!r} is not a share of memory between 0% and 100%",
                                     param_hint="'--score-memory'")
        total = physical_memory()
        if total is None:
            raise click.BadParameter("this machine's memory size is unknown; give a size (e.g. 16G)",
                                     param_hint="'--score-memory'")
        return int(total * share / 100)
    return size_bytes(value, "--score-memory", low=256 << 20, high=64 << 40)


def _check_scoring(value: str) -> str:
    """`--scoring`: full or sequential, named in the error otherwise."""
    if value not in ("full", "sequential"):
        raise click.BadParameter(f"{value!r} is not a scoring mode; choose full or sequential",
                                 param_hint="'--scoring'")
    return value


def _check_backend(value: str) -> str:
    """`--scoring-backend`: one of the backends, named in the error otherwise."""
    if value not in BACKENDS:
        raise click.BadParameter(f"{value!r} is not a scoring backend; use one of: {', '.join(BACKENDS)}",
                                 param_hint="'--scoring-backend'")
    return value


def _check_log_format(value: str) -> str:
    """`--log-format`: text or json."""
    if value not in LOG_FORMATS:
        raise click.BadParameter(f"{value!r} is not a log format; use one of: {', '.join(LOG_FORMATS)}",
                                 param_hint="'--log-format'")
    return value


def _check_api_host(value: str) -> str:
    """`--api-host`: loopback, or every interface; nothing else (a named interface would leave
    this machine's own commands unable to reach the daemon)."""
    from monitor.service.api import API_HOSTS

    if value not in API_HOSTS:
        raise click.BadParameter(f"{value!r} is not allowed; use 127.0.0.1 (this machine only) or 0.0.0.0 "
                                 "(every interface, in a container)", param_hint="'--api-host'")
    return value


_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def _allowed_host(value: str) -> str:
    """`--api-allowed-host`: one host name, no port, scheme or wildcard."""
    name = value.strip().lower()
    if not _HOST_NAME.fullmatch(name):
        raise click.BadParameter(f"{value!r} is not a host name; give a name such as lstar or lstar.internal "
                                 "(no port, scheme or wildcard)", param_hint="'--api-allowed-host'")
    return name


def _cache_keep(value: str) -> int | None:
    """`--cache-keep`: a count of finished checkpoints, or all/none/off to never prune."""
    if value.strip().lower() in ("all", "none", "off"):
        return None
    try:
        keep = int(value)
    except ValueError:
        keep = -1
    if not 0 <= keep <= 1_000_000:
        raise click.BadParameter(f"{value!r} is not allowed; give a count of checkpoints from 0 to 1,000,000, "
                                 "or 'all'", param_hint="'--cache-keep'")
    return keep


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        policies: Path = typer.Option(..., "--policies", help="Folder of policy files (*.yaml), re-read on change."),
        state: Path = STATE_OPTION,
        endpoint: str = typer.Option(None, "--endpoint", help="Hub endpoint (default: $HF_ENDPOINT or the Hub)."),
        api_port: int = int_option(8787, "--api-port", low=0, high=65535,
                                   help="Port of the local API (0: any free port)."),
        api_host: str = typer.Option(
            "127.0.0.1", "--api-host", callback=_check_api_host,
            help="Address the local API listens on: 127.0.0.1, or 0.0.0.0 in a container whose port is "
                 "published (every read but /health and /metrics then needs the API token)."),
        api_allowed_host: list[str] = typer.Option(
            [], "--api-allowed-host", callback=lambda values: [_allowed_host(v) for v in values or []],
            help="A Host name the API accepts beside 127.0.0.1 and localhost (repeatable), e.g. a "
                 "container's service name."),
        api_idle_timeout: str = typer.Option("15s", "--api-idle-timeout",
                                             help="A request to the local API must arrive whole within this; "
                                                  "idle connections are closed after it."),
        api_workers: int = int_option(8, "--api-workers", low=1, high=256,
                                      help="Connections the local API serves at once (more get 503, "
                                           "/health and /metrics excepted)."),
        api_connection_lifetime: str = typer.Option(
            "1m", "--api-connection-lifetime",
            help="A connection to the local API is closed this long after it opened, however busy."),
        once: bool = typer.Option(False, "--once",
                                  help="Run every job once, wait for the alerts raised to be sent (see "
                                       "--once-wait), print a summary, then exit."),
        once_wait: str = typer.Option("60s", "--once-wait",
                                      help="With --once: the longest wait for pending alerts to be sent "
                                           "(0s: do not wait)."),
        log_format: str = typer.Option("text", "--log-format", callback=_check_log_format,
                                       help="Log lines as text, or json (one JSON object per line)."),
        cache_dir: Path = typer.Option(None, "--cache-dir", help="Hub download cache (default: the HF cache)."),
        poll_every: str = typer.Option("15m", "--poll-every", help="Hub poll interval."),
        score_every: str = typer.Option("1m", "--score-every", help="How often the queue is checked."),
        outbox_every: str = typer.Option("30s", "--outbox-every", help="Evaluate and dispatch interval."),
        reload_every: str = typer.Option("10s", "--reload-every", help="Policy-file change check interval."),
        report_every: str = typer.Option("5m", "--report-every", help="How often due reports are checked."),
        watchdog_every: str = typer.Option("10s", "--watchdog-every", help="Watchdog interval."),
        stuck_after: str = typer.Option("2h", "--stuck-after", help="A job running longer is reported stuck."),
        score_timeout: str = typer.Option("1h", "--score-timeout", help="Scoring child time limit."),
        score_memory: str = typer.Option(
            "auto", "--score-memory",
            help="Scoring child address-space limit: auto (75% of memory; none on a GPU host), a size "
                 "(16G), a share (50%), or none. A limit too small to load torch is refused at start."),
        cache_keep: str = typer.Option(
            str(DEFAULT_KEEP_LAST), "--cache-keep",
            help="Finished checkpoints kept in the Hub cache after scoring ('all': never prune). "
                 "Pending jobs' files are never pruned."),
        cache_max_bytes: str = typer.Option(
            f"{DEFAULT_MAX_BYTES >> 30}G", "--cache-max-bytes",
            help="Prune finished checkpoints further while the cache holds more than this (or 'none')."),
        lease: str = typer.Option(None, "--lease", help="Queue lease (default: score timeout + 10m)."),
        drain: str = typer.Option("1m", "--drain",
                                  help="How long SIGTERM waits for running jobs (0s: not at all)."),
        hub_max_wait: str = typer.Option("1m", "--hub-max-wait",
                                         help="Longer Hub rate-limit waits end the job instead of sleeping "
                                              "(0s: never sleep)."),
        hub_cooldown: str = typer.Option("5m", "--hub-cooldown", help="Circuit-breaker cool-down."),
        hub_circuit_threshold: int = int_option(
            5, "--hub-circuit-threshold", low=1, high=1000,
            help="Consecutive Hub failures that open the circuit (and raise one outage alert)."),
        retention: str = typer.Option("90d", "--retention",
                                      help="Hub polls and delivery attempts older than this are pruned (at least 1d)."),
        prune_every: str = typer.Option("6h", "--prune-every", help="How often old log rows are pruned."),
        webhook_secret_file: Path = typer.Option(None, "--webhook-secret-file",
                                                 help="Hub webhook secret (else $LSTAR_HUB_WEBHOOK_SECRET)."),
        scoring_backend: str = typer.Option(
            "local", "--scoring-backend", callback=_check_backend,
            help="Where scoring runs: local (child processes beside the daemon, see --scoring-workers) or ray (tasks on a Ray cluster; "
                 'needs pip install -e ".[ray]").'),
        scoring_workers: int = int_option(
            1, "--scoring-workers", low=0, high=64,
            help="Local backend: scoring children kept warm between jobs (torch imported, tokenizers "
                 "and baselines cached), each scoring one job at a time; 0: a fresh child per job."),
        worker_max_jobs: int = int_option(
            20, "--worker-max-jobs", low=1, high=100000,
            help="A warm scoring worker is replaced by a fresh one after this many jobs."),
        worker_max_rss: str = typer.Option(
            "auto", "--worker-max-rss",
            help="A warm scoring worker is replaced once its resident memory passes this (a size, e.g. 8G; "
                 "auto: half of --score-memory, or of the machine's memory without a limit)."),
        ray_address: str = typer.Option(
            None, "--ray-address",
            help="Ray cluster to score on with --scoring-backend ray (default: $RAY_ADDRESS, else a "
                 "Ray instance started on this machine)."),
        ray_gpu_memory: str = typer.Option(
            None, "--ray-gpu-memory",
            help="Memory of one GPU of the Ray cluster (e.g. 80G): a CUDA job whose estimate is larger asks "
                 "for several GPUs of one node and is spread over them (device_map auto)."),
        scoring: str = typer.Option(
            "full", "--scoring", callback=_check_scoring,
            help="full: every document of the corpus selection; sequential: score blocks of a pinned "
                 "document order and stop once every task of every policy watching the repo is settled "
                 "(a partial score, marked so in its alerts)."),
        corpus: Path = typer.Option(ScoreRequest.corpus_dir, "--corpus", help="Calibration corpus folder."),
        docs: int = int_option(None, "--docs", low=1, help="Score only the first N documents."),
        max_context: int = int_option(None, "--max-context", low=2, help="Scoring window (tokens)."),
        device: str = device_option(),
        batch_size: int = int_option(8, "--batch-size", low=1, high=MAX_BATCH, help="Windows per forward pass."),
        n_boot: int = int_option(1000, "--n-boot", low=2, high=MAX_RESAMPLES,
                                 help="Bootstrap resamples for the SE."),
    ) -> None:
        """Run the watcher: poll, gate, fetch, score, evaluate, alert and report on schedule."""
        refuse_hub_offline("lstar run")   # before anything is opened or written
        # Rate limits and repeat intervals read recent delivery attempts: keep at least a day.
        retention_s = seconds(retention, "--retention", low=DAY_S)
        for flag, given in (("--ray-address", ray_address), ("--ray-gpu-memory", ray_gpu_memory)):
            if given is not None and scoring_backend != "ray":
                raise click.BadParameter(f"{flag} is only used with --scoring-backend ray", param_hint=f"'{flag}'")
        if scoring_backend == "ray":
            check_ray_installed()   # a clear error now, not at the first scoring run

        template = ScoreRequest(corpus_dir=corpus, docs=docs, max_context=max_context, device=device,
                                batch_size=batch_size, n_boot=n_boot, progress=False)
        # Intervals and limits are at least 1 s (a clock, not a busy loop); the two waits may be 0.
        config = DaemonConfig(
            policies_dir=policies, state_dir=state, endpoint=endpoint, api_port=api_port, once=once,
            api_host=api_host, api_allowed_hosts=tuple(api_allowed_host),
            once_wait=seconds(once_wait, "--once-wait", low=0.0), log_format=log_format,
            api_idle_timeout=seconds(api_idle_timeout, "--api-idle-timeout", low=0.1), api_workers=api_workers,
            api_connection_lifetime=seconds(api_connection_lifetime, "--api-connection-lifetime", low=1.0),
            cache_dir=cache_dir, poll_interval=seconds(poll_every, "--poll-every"),
            score_interval=seconds(score_every, "--score-every"),
            outbox_interval=seconds(outbox_every, "--outbox-every"),
            reload_interval=seconds(reload_every, "--reload-every"),
            report_interval=seconds(report_every, "--report-every"),
            watchdog_interval=seconds(watchdog_every, "--watchdog-every"),
            stuck_after=seconds(stuck_after, "--stuck-after"),
            score_timeout=seconds(score_timeout, "--score-timeout"),
            score_memory=_score_memory(score_memory, device), cache_keep=_cache_keep(cache_keep),
            cache_max_bytes=(None if cache_max_bytes.strip().lower() == "none"
                             else size_bytes(cache_max_bytes, "--cache-max-bytes", low=1 << 20, high=1 << 50)),
            lease=seconds(lease, "--lease") if lease is not None else None,
            drain=seconds(drain, "--drain", low=0.0),
            hub_max_wait=seconds(hub_max_wait, "--hub-max-wait", low=0.0),
            hub_cooldown=seconds(hub_cooldown, "--hub-cooldown"),
            hub_circuit_threshold=hub_circuit_threshold,
            retention=retention_s, prune_interval=seconds(prune_every, "--prune-every"),
            webhook_secret_file=webhook_secret_file, template=template,
            scoring_backend=scoring_backend, ray_address=ray_address, scoring_mode=scoring,
            scoring_workers=scoring_workers, worker_max_jobs=worker_max_jobs,
            worker_max_rss=(None if worker_max_rss.strip().lower() == "auto"
                            else size_bytes(worker_max_rss, "--worker-max-rss", low=64 << 20, high=1 << 50)),
            ray_gpu_bytes=size_bytes(ray_gpu_memory, "--ray-gpu-memory", low=1 << 30, high=1 << 44))
        if scoring_backend == "local" and score_memory.strip().lower() != "auto":
            # A limit too small to load torch would fail every checkpoint: refuse it now, before
            # anything is written. `auto` is at least min(memory, 4 GiB), far above that need.
            check_score_memory(config.score_memory)
        raise typer.Exit(run_daemon(config))

    @app.command("status")
    def status(state: Path = STATE_OPTION, db: Path | None = DB_OPTION,
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
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
        data = api_get(url, "/status")
        data["daemon"] = {"pid": data["pid"], "started_at": data["started_at"], "url": url}
        return data

    return through_daemon(db, ask, lambda store: {"daemon": None, "db": str(db),
                                                  "checkpoints": store.checkpoint_counts(),
                                                  "not_evaluated": store.not_evaluated_summary(),
                                                  "observations": store.observation_summary()})
