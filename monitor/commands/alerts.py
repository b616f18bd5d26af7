"""`lstar alerts list|show|retry|test|evaluate|dispatch|enable`: the alert outbox.

While `lstar run` holds the database, `list`, `show` and `retry` ask the daemon's API
instead, with the same output.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import typer
from rich.table import Table
from rich.text import Text

from monitor.commands.options import (DB_OPTION, JSON_OPTION, MAX_ID, NOW_OPTION, POLICY_NAME_OPTION, STATE_OPTION,
                                      add_columns, db_file, id_column, int_argument)
from monitor.commands.paging import CURSOR_OPTION, limit_option, page_of, print_more, title
from monitor.commands.policy import expand_policy_paths
from monitor.commands.terminal import echo, name_column, plain_console, print_table
from monitor.commands.through_daemon import change_through_daemon, through_daemon
from monitor.errors import DeliveryError, PolicyError

POLICIES_OPTION = typer.Option(..., "--policy", help="Policy file (repeat for several; a folder: its *.yaml).")


def _as_dict(row: Any) -> dict[str, Any] | None:
    """A row as the dict the daemon's API answers with (None stays None)."""
    return None if row is None else row.as_dict()


def _policies(paths: list[Path]) -> list[Any]:
    from monitor.policy import load_policies

    return load_policies(expand_policy_paths(paths))


def test_message(policy: Any, receiver: str, now: Any) -> Any:
    """A synthetic notification for `lstar alerts test` (never stored)."""
    from monitor.alerts import Outgoing, build_body

    labels = {"alertname": "LstarTest", "policy": policy.name, "receiver": receiver, "severity": "info"}
    alert = {"status": "firing", "labels": labels, "starts_at": now, "ends_at": None,
             "annotations": {"summary": f"test notification from lstar-monitor to {receiver}",
                             "description": "Sent by `lstar alerts test`; no action needed."},
             "numbers": {"test": True}, "fingerprint": uuid.uuid4().hex[:16]}
    body = build_body(policy=policy.name, receiver=receiver, group_key=f"test/{policy.name}/{receiver}",
                      group_labels={"alertname": "LstarTest"}, alerts=[alert],
                      external_url=policy.external_url)
    return Outgoing(id=f"msg_test_{uuid.uuid4().hex[:24]}", policy=policy.name, receiver=receiver, body=body)


def _on_the_state(state: Path, db: Path | None, policies: list[Path], now_text: str | None,
                  job: Callable[..., Any]) -> Any:
    """`job(store, policies, now=...)` on the state opened for writing, with the policies loaded
    and --now parsed (what `alerts evaluate` and `alerts dispatch` share)."""
    from monitor.alerts.state_ops import parse_now
    from monitor.store import Store

    db_path = db_file(state, db)
    loaded = _policies(policies)
    with Store.open(db_path) as store:
        return job(store, loaded, now=parse_now(now_text))


def register(app: typer.Typer) -> None:
    alerts = typer.Typer(help="Alerts and their deliveries (the outbox).", no_args_is_help=True)

    for add_command in (_list_command, _show_command, _retry_command, _test_command, _evaluate_command,
                        _dispatch_command, _enable_command):
        add_command(alerts)

    app.add_typer(alerts, name="alerts")


def _list_command(alerts: typer.Typer) -> None:
    @alerts.command("list")
    def list_(
        policy: str = POLICY_NAME_OPTION,
        limit: int = limit_option("alerts"),
        cursor: str = CURSOR_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Newest alerts with the state of each delivery (opens the file read-only)."""
        from monitor.service import api_get
        from monitor.store.listings import alerts_page

        page = through_daemon(db_file(state, db),
                              lambda url: page_of(api_get(url, "/alerts", {"policy": policy, "limit": limit,
                                                                           "cursor": cursor})),
                              lambda store: alerts_page(store, policy=policy, limit=limit, cursor=cursor))
        if as_json:
            print(json.dumps(page.as_dict(), indent=2, default=str))
            return
        rows = page.items
        # Eight fields in six columns, no outer border: the table fits 80 columns, and the
        # identifiers (policy, task, repo@commit, receivers) wrap whole instead of being cut.
        table = Table(title=title(page, "alert(s)"), title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("created", no_wrap=True)   # a time is never cut (print_table keeps it whole)
        id_column(table, "policy / task")
        name_column(table, "repo@commit")
        table.add_column("state / status", min_width=7)
        id_column(table, "deliveries")
        for r in rows:
            where = f"{r['repo']}@{r['commit_sha'][:12]}" if r["repo"] else "—"
            deliveries = "\n".join(f"{d['receiver']}:{d['status']}" for d in r["deliveries"])
            table.add_row(str(r["id"]), r["created_at"].strftime("%Y-%m-%d %H:%M"),
                          f"{r['policy']}\n{r['task'] or r['kind']}", where, f"{r['state']}\n{r['status']}",
                          deliveries)
        console = plain_console()
        print_table(console, table)
        print_more(console, page, "alerts")


def _show_command(alerts: typer.Typer) -> None:
    @alerts.command("show")
    def show(
        alert_id: int = int_argument(..., low=1, high=MAX_ID, help="Alert id (from `lstar alerts list`)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """One alert: labels, numbers, deliveries, and every delivery attempt."""
        from monitor.service import api_get, revive_times

        # the daemon answers 404, raised there as the same DeliveryError, when there is none
        detail = through_daemon(db_file(state, db),
                                lambda url: revive_times(api_get(url, f"/alerts/{alert_id}")),
                                lambda store: _as_dict(store.alert_detail(alert_id)))
        if detail is None:
            raise DeliveryError(f"no alert with id {alert_id}", hint="see `lstar alerts list`")
        if as_json:
            print(json.dumps(detail, indent=2, default=str))
            return
        console = plain_console()
        console.print(Text.assemble((f"alert {detail['id']}", "bold"),
                                    f" {detail['status']} ({detail['kind']}) key {detail['alert_key']}"))
        console.print(f"  {detail['annotations'].get('summary', '')}")
        console.print(f"  {detail['annotations'].get('description', '')}")
        console.print("  labels: " + " ".join(f"{k}={v}" for k, v in detail["labels"].items()))
        table = Table(title="deliveries and attempts", title_justify="left")
        add_columns(table, ("receiver", "status", "message", "attempt", "at", "outcome", "code", "error"),
                    ids=("receiver", "message"), whole=("at",))
        by_id = {n["id"]: n for n in detail["notifications"]}
        for d in detail["deliveries"]:
            n = by_id.get(d["notification_id"])
            table.add_row(d["receiver"], d["status"], d["notification_id"] or "—", "", "", "", "",
                          d["reason"] or "")
            for a in (n["attempts_log"] if n else []):
                table.add_row("", "", "", str(a["attempt"]), a["started_at"].isoformat(timespec="seconds"),
                              a["outcome"], str(a["status_code"] or ""), a["error"] or "")
        print_table(console, table)


def _retry_command(alerts: typer.Typer) -> None:
    @alerts.command("retry")
    def retry(
        ident: str = typer.Argument(..., help="Alert id, or a notification id (msg_...)."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
    ) -> None:
        """Give dead-lettered notifications a fresh retry budget (after fixing the cause)."""
        from monitor.alerts.state_ops import parse_now, retry_dead_letters

        now = parse_now(now_text)
        done = change_through_daemon(db_file(state, db), f"/alerts/{quote(ident, safe='')}/retry",
                                     {"now": now.isoformat()}, lambda reply: reply["requeued"],
                                     lambda store: retry_dead_letters(store, ident, now=now))
        for nid in done:
            echo(f"requeued {nid}")


def _test_command(alerts: typer.Typer) -> None:
    @alerts.command("test")
    def test(
        receiver: str = typer.Argument(..., help="Receiver name in the policy."),
        policy_file: Path = typer.Option(..., "--policy", help="Policy file defining the receiver."),
        now_text: str = NOW_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Send a test notification through one receiver now (nothing is stored).

        Exits 0 when it was delivered, 2 otherwise (the error says why).
        """
        from monitor.alerts.state_ops import parse_now
        from monitor.policy import load_policy

        from monitor.alerts import default_senders

        policy = load_policy(policy_file)
        target = policy.receiver(receiver)
        now = parse_now(now_text)
        message = test_message(policy, receiver, now)
        result = default_senders()[target.kind].send(message, target, policy, now=now)
        out = {"receiver": receiver, "kind": target.kind, "id": message.id, "outcome": result.outcome,
               "status_code": result.status_code, "error": result.error}
        if as_json:
            print(json.dumps(out, indent=2))
        else:
            echo(f"{result.outcome}: {receiver} ({target.kind}) {message.id}"
                 + (f" — {result.error}" if result.error else ""))
        if result.outcome != "delivered":
            raise DeliveryError(f"the test notification to {receiver} was not delivered ({result.outcome})"
                                + (f": {result.error}" if result.error else ""))


def _evaluate_command(alerts: typer.Typer) -> None:
    @alerts.command("evaluate")
    def evaluate(
        policies: list[Path] = POLICIES_OPTION,
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Evaluate new scores against the policies and write the outbox (idempotent)."""
        from monitor.alerts import evaluate_pending

        report = _on_the_state(state, db, policies, now_text, evaluate_pending)
        if as_json:
            print(json.dumps(report.as_dict(), indent=2))
            return
        echo(f"{report.predictions} prediction(s), {report.alerts} alert(s), {report.deliveries} delivery row(s)")
        for s in report.skipped:
            echo(f"skipped: {s}")
        for line in report.late:   # recorded, but the lineage's state is its current checkpoint's
            echo(f"earlier checkpoint scored late: {line}")


def _dispatch_command(alerts: typer.Typer) -> None:
    @alerts.command("dispatch")
    def dispatch(
        policies: list[Path] = POLICIES_OPTION,
        evaluate_first: bool = typer.Option(True, "--evaluate/--no-evaluate",
                                            help="Evaluate new scores first."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
        as_json: bool = JSON_OPTION,
    ) -> None:
        """One pass of the outbox: (evaluate,) flush due groups, send what is due, record it."""
        from monitor.alerts import run_pass

        out = _on_the_state(state, db, policies, now_text,
                            lambda store, loaded, now: run_pass(store, loaded, now=now, evaluate=evaluate_first))
        if as_json:
            print(json.dumps(out, indent=2, default=str))
            return
        for s in out["sent"]:
            echo(f"{s['outcome']}: {s['receiver']} {s['id']} attempt {s['attempt']}"
                 + (f" — {s['error']}" if s.get("error") else ""))
        echo(f"{len(out['formed'])} message(s) formed, {len(out['sent'])} send(s), "
             f"{out['silenced']} silenced, {len(out['waiting'])} waiting")


def _enable_command(alerts: typer.Typer) -> None:
    @alerts.command("enable")
    def enable(
        receiver: str = typer.Argument(..., help="Receiver name."),
        policy: str = typer.Option(..., "--policy", help="Policy name."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        now_text: str = NOW_OPTION,
    ) -> None:
        """Re-enable a receiver that was disabled (after HTTP 410) once it is fixed."""
        from monitor.alerts.state_ops import parse_now
        from monitor.store import Store

        db_path = db_file(state, db)
        with Store.open(db_path) as store:
            changed = store.enable_endpoint(policy, receiver, now=parse_now(now_text))
        if not changed:
            raise PolicyError(f"receiver {receiver} of policy {policy} is not disabled")
        echo(f"enabled {policy}/{receiver}")
