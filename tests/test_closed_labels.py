"""Matchers on labels whose values form a closed set (`state`, `alertname`) that can never
match are refused in routes and silences; `lstar silence add` says how many alerts in force
it matches; `lstar policy routes test` shows where labels are routed, by the routing code."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts import evaluate_pending
from monitor.cli import main
from monitor.errors import PolicyError
from monitor.policy.load import load_policy
from monitor.store import Store
from support.scores import fake_sha, record_fake_score

CURVES = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves"
FULL = Path(__file__).resolve().parent / "fixtures" / "policies" / "good-full.yaml"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
AT_RISK, CLEAR = -2.0, -1.2   # arith's states at these L* (SE 0.02)


def write_policy(tmp: Path, matchers: str = "['task=\"arith\"']") -> Path:
    path = tmp / "policy.yaml"
    path.write_text(f"""\
name: frontier
tasks:
  - name: arith
    curve: {CURVES / "arith.json"}
route:
  receiver: log
  group_wait: 0s
  routes:
    - receiver: pager
      matchers: {matchers}
receivers:
  - name: log
    file: {{path: alerts.jsonl}}
  - name: pager
    file: {{path: pager.jsonl}}
""")
    return path


# -- routes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("matcher", ['state="firing"', 'state=~"fir.*"', 'alertname="LstarEmergence"',
                                     'alertname!~"Lstar.*"', 'state=""'])
def test_a_route_matcher_that_can_never_match_is_an_error(tmp_path: Path, matcher: str, capsys) -> None:
    path = write_policy(tmp_path, json.dumps([matcher]))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    [line] = str(caught.value).splitlines()
    assert line.startswith(f"{path}:10: route.routes[0].matchers[0]: matcher ") and "can never match" in line
    assert main(["policy", "check", str(path)]) == 2
    assert "can never match" in capsys.readouterr().out


@pytest.mark.parametrize("matcher", ['state="at_risk"', 'state=~"at_risk|emerged"', 'state!="clear"',
                                     'alertname="LstarCalibrationGaming"', 'alertname!~"LstarTask.*"',
                                     'severity="page"', 'team=~"x.*"'])
def test_a_route_matcher_that_can_match_loads(tmp_path: Path, matcher: str) -> None:
    load_policy(write_policy(tmp_path, json.dumps([matcher])))


# -- silences --------------------------------------------------------------------------------------
def _state_with_alerts(tmp: Path) -> Path:
    """Two lineages at risk; then one of them clear again (its alert resolved)."""
    policy = load_policy(write_policy(tmp))
    db = tmp / "state.duckdb"
    with Store.open(db) as store:
        for repo in ("org/a", "org/b"):
            record_fake_score(store, repo=repo, sha=fake_sha(repo), lstar=AT_RISK, se=0.02, finished_at=T0)
        evaluate_pending(store, [policy], now=T0)
        record_fake_score(store, repo="org/b", sha=fake_sha("org/b-later"), lstar=CLEAR, se=0.02,
                          finished_at=T0 + timedelta(hours=1))
        evaluate_pending(store, [policy], now=T0 + timedelta(hours=1))
        statuses = sorted((r.repo, r.status) for r in store.list_alerts())
    assert statuses == [("org/a", "firing"), ("org/b", "firing"), ("org/b", "resolved")]
    return db


@pytest.mark.parametrize("matchers, count", [(["task=arith"], 1), (["state=at_risk"], 1), (["repo=org/b"], 0),
                                              (["repo=~org/.*", "state!=emerged"], 1), (["task=other"], 0)])
def test_silence_add_says_how_many_current_alerts_it_matches(tmp_path: Path, capsys, matchers: list[str],
                                                             count: int) -> None:
    db = _state_with_alerts(tmp_path)
    args = [a for m in matchers for a in ("--match", m)]
    now = (T0 + timedelta(hours=2)).isoformat()
    assert main(["silence", "add", *args, "--until", "2h", "--comment", "c", "--db", str(db), "--now", now]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 1  # the id alone on stdout
    assert err == f"matches {count} current alert{'' if count == 1 else 's'}\n"
    assert main(["silence", "add", *args, "--until", "2h", "--comment", "c", "--db", str(db), "--now", now,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches_current"] == count


@pytest.mark.parametrize("matcher", ["state=firing", "state=~fire.*", "alertname=LstarEmergence",
                                     "alertname!~Lstar.*"])
def test_a_silence_that_can_never_match_is_refused(tmp_path: Path, capsys, matcher: str) -> None:
    db = tmp_path / "state.duckdb"
    Store.open(db).close()
    assert main(["silence", "add", "--match", "task=arith", "--match", matcher, "--until", "2h",
                 "--comment", "c", "--db", str(db)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --match {matcher!r}: matcher ") and "can never match" in line
    with Store.open(db) as store:
        assert store.silences() == []


def test_a_silence_on_an_operator_alert_state_is_accepted(tmp_path: Path, capsys) -> None:
    db = tmp_path / "state.duckdb"
    Store.open(db).close()
    assert main(["silence", "add", "--match", "state=hub-outage", "--match", "alertname=LstarDeliveryFailed",
                 "--until", "2h", "--comment", "c", "--db", str(db)]) == 0
    assert capsys.readouterr().err == "matches 0 current alerts\n"


# -- the route tester ------------------------------------------------------------------------------
@pytest.mark.parametrize("labels, receivers", [
    (["state=emerged", "task=arith"], [("mail", "route.routes[0]")]),
    (["state=at_risk", "task=arith"], [("hook", "route")]),
    (["state=emerged", "task=cloze"], [("hook", "route")]),
    ([], [("hook", "route")]),
])
def test_routes_test_names_receivers_and_routes(capsys, labels: list[str], receivers: list[tuple[str, str]]) -> None:
    from monitor.alerts import route_alert

    assert main(["policy", "routes", "test", str(FULL), *labels, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [(t["receiver"], t["route"]) for t in result["receivers"]] == receivers
    given = dict(label.split("=", 1) for label in labels)
    assert [t["receiver"] for t in result["receivers"]] == \
        [t.receiver for t in route_alert(load_policy(FULL).route, given)]
    assert main(["policy", "routes", "test", str(FULL), *labels]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{r}  ({p})" for r, p in receivers]
    wanted = ",".join(r for r, _ in receivers)
    assert main(["policy", "routes", "test", str(FULL), *labels, "--verify-receivers", wanted]) == 0
    capsys.readouterr()
    assert main(["policy", "routes", "test", str(FULL), *labels, "--verify-receivers", "log"]) == 2
    assert "not log" in capsys.readouterr().err


def test_routes_test_continue_reaches_later_siblings(tmp_path: Path, capsys) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nroute:\n  receiver: a\n  routes:\n"
                    "    - {receiver: b, matchers: ['team=x'], continue: true}\n"
                    "    - receiver: a\n      routes:\n        - {receiver: c, matchers: ['severity=~crit.*']}\n"
                    "receivers: [{name: a, file: {path: a.jsonl}}, {name: b, file: {path: b.jsonl}},"
                    " {name: c, file: {path: c.jsonl}}]\n")
    assert main(["policy", "routes", "test", str(path), "team=x", "severity=critical", "--json"]) == 0
    got = [(t["receiver"], t["route"]) for t in json.loads(capsys.readouterr().out)["receivers"]]
    assert got == [("b", "route.routes[0]"), ("c", "route.routes[1].routes[0]")]


@pytest.mark.parametrize("label, message", [("state=firing", "no alert carries it"),
                                            ("novalue", "is not NAME=VALUE")])
def test_routes_test_refuses_labels_no_alert_carries(capsys, label: str, message: str) -> None:
    assert main(["policy", "routes", "test", str(FULL), label]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert message in line
