"""`lstar run` (the daemon) and `lstar status` (asks it, or reads the database read-only)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.table import Table

from monitor.engine import ScoreRequest

STATE_OPTION = typer.Option(Path("state"), "--state", help="State directory (database, lock, API info).")


def _seconds(value: str, flag: str) -> float:
    from monitor.policy import parse_duration

    try:
        return parse_duration(value).total_seconds()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def _bytes(value: str | None) -> int | None:
    if value is None:
        return None
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if text and text[-1] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a size (e.g. 8G, 512M)", param_hint="--score-memory") from None


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        policies: Path = typer.Option(..., "--policies", help="Folder of policy files (*.yaml), re-read on change."),
        state: Path = STATE_OPTION,
        endpoint: str = typer.Option(None, "--endpoint", help="Hub endpoint (default: $HF_ENDPOINT or the Hub)."),
        api_port: int = typer.Option(8787, "--api-port", min=0, max=65535,
                                     help="Port of the local API on 127.0.0.1 (0: any free port)."),
        once: bool = typer.Option(False, "--once", help="Run every job once, then exit."),
        cache_dir: Path = typer.Option(None, "--cache-dir", help="Hub download cache (default: the HF cache)."),
        poll_every: str = typer.Option("15m", "--poll-every", help="Hub poll interval."),
        score_every: str = typer.Option("1m", "--score-every", help="How often the queue is checked."),
        outbox_every: str = typer.Option("30s", "--outbox-every", help="Evaluate and dispatch interval."),
        reload_every: str = typer.Option("10s", "--reload-every", help="Policy-file change check interval."),
        report_every: str = typer.Option("5m", "--report-every", help="How often due reports are checked."),
        watchdog_every: str = typer.Option("10s", "--watchdog-every", help="Watchdog interval."),
        stuck_after: str = typer.Option("2h", "--stuck-after", help="A job running longer is reported stuck."),
        score_timeout: str = typer.Option("1h", "--score-timeout", help="Scoring child time limit."),
        score_memory: str = typer.Option(None, "--score-memory", help="Scoring child memory limit (e.g. 16G)."),
        lease: str = typer.Option(None, "--lease", help="Queue lease (default: score timeout + 10m)."),
        drain: str = typer.Option("1m", "--drain", help="How long SIGTERM waits for running jobs."),
        hub_max_wait: str = typer.Option("1m", "--hub-max-wait",
                                         help="Longer Hub rate-limit waits end the job instead of sleeping."),
        hub_cooldown: str = typer.Option("5m", "--hub-cooldown", help="Circuit-breaker cool-down."),
        hub_circuit_threshold: int = typer.Option(
            5, "--hub-circuit-threshold", min=1,
            help="Consecutive Hub failures that open the circuit (and raise one outage alert)."),
        retention: str = typer.Option("90d", "--retention",
                                      help="Hub polls and delivery attempts older than this are pruned (at least 1d)."),
        prune_every: str = typer.Option("6h", "--prune-every", help="How often old log rows are pruned."),
        webhook_secret_file: Path = typer.Option(None, "--webhook-secret-file",
                                                 help="Hub webhook secret (else $LSTAR_HUB_WEBHOOK_SECRET)."),
        corpus: Path = typer.Option(ScoreRequest.corpus_dir, "--corpus", help="Calibration corpus folder."),
        docs: int = typer.Option(None, "--docs", min=1, help="Score only the first N documents."),
        max_context: int = typer.Option(None, "--max-context", min=2, help="Scoring window (tokens)."),
        device: str = typer.Option("auto", "--device", help="cpu, cuda, or auto."),
        batch_size: int = typer.Option(8, "--batch-size", min=1),
        n_boot: int = typer.Option(1000, "--n-boot", min=0, help="Bootstrap resamples for the SE."),
    ) -> None:
        """Run the watcher: poll, gate, fetch, score, evaluate, alert and report on schedule."""
        from monitor.daemon import DAY_S, DaemonConfig, run_daemon

        retention_s = _seconds(retention, "--retention")
        if retention_s < DAY_S:  # rate limits and repeat intervals read recent attempts
            raise click.BadParameter(f"{retention!r} is shorter than a day", param_hint="--retention")

        template = ScoreRequest(corpus_dir=corpus, docs=docs, max_context=max_context, device=device,
                                batch_size=batch_size, n_boot=n_boot, progress=False)
        config = DaemonConfig(
            policies_dir=policies, state_dir=state, endpoint=endpoint, api_port=api_port, once=once,
            cache_dir=cache_dir, poll_interval=_seconds(poll_every, "--poll-every"),
            score_interval=_seconds(score_every, "--score-every"),
            outbox_interval=_seconds(outbox_every, "--outbox-every"),
            reload_interval=_seconds(reload_every, "--reload-every"),
            report_interval=_seconds(report_every, "--report-every"),
            watchdog_interval=_seconds(watchdog_every, "--watchdog-every"),
            stuck_after=_seconds(stuck_after, "--stuck-after"),
            score_timeout=_seconds(score_timeout, "--score-timeout"), score_memory=_bytes(score_memory),
            lease=_seconds(lease, "--lease") if lease else None, drain=_seconds(drain, "--drain"),
            hub_max_wait=_seconds(hub_max_wait, "--hub-max-wait"),
            hub_cooldown=_seconds(hub_cooldown, "--hub-cooldown"),
            hub_circuit_threshold=hub_circuit_threshold,
            retention=retention_s, prune_interval=_seconds(prune_every, "--prune-every"),
            webhook_secret_file=webhook_secret_file, template=template)
        raise typer.Exit(run_daemon(config))

    @app.command("status")
    def status(state: Path = STATE_OPTION,
               as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        """What the daemon is doing (asks it), or what the database holds when it is not running."""
        data = read_status(state)
        if as_json:
            print(json.dumps(data, indent=2, default=str))
            return
        console = Console()
        if data["daemon"] is None:
            console.print(f"no daemon running on {state}; read {data['db']} read-only")
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


def read_status(state: Path) -> dict:
    """The daemon's /status when one runs on `state`, else counts from a read-only open."""
    from monitor.daemon import DB_NAME
    from monitor.daemon_api import api_get, live_daemon_url
    from monitor.store import Store

    url = live_daemon_url(state)
    if url is not None:
        data = api_get(url, "/status")
        data["daemon"] = {"pid": data["pid"], "started_at": data["started_at"], "url": url}
        return data
    db = state / DB_NAME
    with Store.open(db, read_only=True) as store:
        counts = store.checkpoint_counts()
    return {"daemon": None, "db": str(db), "checkpoints": counts}
