"""`lstar poll --once`: discover new checkpoints on the Hub and gate them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from monitor.commands.options import (DB_OPTION, JSON_OPTION, STATE_OPTION, CommandLineError, db_file,
                                      endpoint_option, id_column)
from monitor.commands.terminal import plain_console, print_table
from monitor.environment import hub_reachable
from monitor.errors import HubError, PolicyError


def load_rules(policy: Path | None, rule_file: Path | None, policies: Path | None = None) -> list[Any]:
    """The watch rules of a policy file, of every policy file in a folder (as `lstar run
    --policies` reads it), or of a rule file (a YAML with only a `watch:` list)."""
    from monitor.hub import load_watch_rules
    from monitor.policy import load_policy

    if sum(given is not None for given in (policy, policies, rule_file)) != 1:
        raise CommandLineError("give exactly one of --policy FILE, --policies DIR or --rule-file FILE")
    if policies is not None:
        from monitor.policy.files import policy_files_in
        from monitor.policy.readiness import require_policy_folder

        require_policy_folder(policies)
        files = policy_files_in(policies)
        if not files:
            raise PolicyError(f"--policies {policies}: no policy files (*.yaml) there",
                              hint="point it at the folder `lstar run --policies` reads")
        return [rule for file in files for rule in load_policy(file, check_curves=False).watch]
    if policy is not None:
        return list(load_policy(policy, check_curves=False).watch)  # curves are not needed to poll

    return load_watch_rules(rule_file)


def _render(report: dict[str, Any], console: Console) -> None:
    rules = Table(title="watch rules", title_justify="left")
    for col in ("rule", "changed repos", "new rows", "requests", "watermark", "note"):
        if col == "rule":
            id_column(rules, col)
        elif col == "watermark":   # a time: kept whole (print_table wraps the other columns first)
            rules.add_column(col, no_wrap=True)
        else:
            rules.add_column(col, justify="right" if col in ("changed repos", "new rows", "requests") else "left",
                             overflow="fold")
    for r in report["rules"]:
        rules.add_row(r["rule"], str(r["listed"]), str(r["new"]), str(r["requests"]),
                      r["watermark"] or "—",
                      r["error"] or ("scan_limit reached: older changes were not listed"
                                     if r["truncated"] else ""))
    print_table(console, rules)
    if report["gate"]:
        gate = Table(title="gate", title_justify="left")
        for col in ("id", "repo", "sha", "status", "reason"):
            if col in ("repo", "sha"):
                id_column(gate, col)
            else:
                gate.add_column(col)
        for g in report["gate"]:
            gate.add_row(str(g["id"]), g["repo"], g["sha"][:12], g["status"], g["reason"] or "")
        console.print(gate)


def register(app: typer.Typer) -> None:
    @app.command("poll")
    def poll(
        once: bool = typer.Option(False, "--once", help="Poll every rule once, gate, and exit."),
        policy: Path = typer.Option(None, "--policy", help="Policy file whose watch rules to poll."),
        policies: Path = typer.Option(None, "--policies", help="Folder of policy files (as `lstar run "
                                      "--policies`): poll the watch rules of every one."),
        rule_file: Path = typer.Option(None, "--rule-file", help="YAML file with a top-level `watch:` list."),
        state: Path = STATE_OPTION,
        db: Path | None = DB_OPTION,
        endpoint: str = endpoint_option("Hub URL (default: HF_ENDPOINT or the Hub)."),
        cache_dir: Path = typer.Option(None, "--cache-dir", help="Hub cache (default: HF_HUB_CACHE)."),
        gate: bool = typer.Option(True, "--gate/--no-gate", help="Gate what was discovered."),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Discover new (repo, commit) pairs for each watch rule and run the safety gate.

        Costs one listing request per rule when nothing changed. Exits 4 if the Hub failed
        for any rule (the watermark of that rule is kept for the next poll).
        """
        from monitor.hub import HubClient, gate_pending, poll_once
        from monitor.store import Store

        db_path = db_file(state, db)
        if not once:
            raise CommandLineError("only --once is supported here; continuous polling is the daemon's job")
        rules = load_rules(policy, rule_file, policies)
        from monitor.alerts.reference_bases import reference_rules

        # a Hub on this machine whatever HF_HUB_OFFLINE says; another refused before the database is opened
        with hub_reachable("lstar poll", endpoint, verb="poll"), Store.open(db_path) as store:
            client = HubClient(endpoint, store=store)
            polled = poll_once(store, client, rules)
            # a reference base left to gate gets the budgets of the rule that found its derivative
            gated = gate_pending(store, client, [*rules, *reference_rules(rules)], cache_dir=cache_dir) if gate else []
            report = {"endpoint": client.endpoint, "rules": [p.as_dict() for p in polled],
                      "gate": [g.as_dict() for g in gated]}
        if as_json:
            print(json.dumps(report, indent=2, default=str))
        else:
            _render(report, plain_console())
        failed = [f"{r['rule']}: {r['error']}" for r in report["rules"] if r["error"]]
        failed += [f"gate of {g['repo']}@{g['sha'][:12]}: {g['reason']}"
                   for g in report["gate"] if g["status"] == "discovered"]
        if failed:
            raise HubError(f"the Hub failed during the poll ({'; '.join(failed)})")
