"""The calibration-gaming rule end to end (public and private corpus scores in the store →
prediction → alert), and which scores a policy's watch rules let through."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.alerts.prediction_eval import watches
from monitor.cli import main
from monitor.policy.load import load_policy, parse_policy
from monitor.store import Store
from support.scores import CALIB_V0_ALT_SHA256 as PRIVATE
from support.scores import CALIB_V0_SHA256 as PUBLIC
from support.scores import record_fake_score

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
REF_A, REF_B = "1" * 40, "2" * 40


def write_policy(tmp: Path, refs: str = f"[ref/a@{REF_A}, ref/b@{REF_B}]", watch: str = "") -> Path:
    path = tmp / "gaming.yaml"
    path.write_text(f"""\
name: governance
corpora: {{public: {PUBLIC}, private: {PRIVATE}}}
calibration_gaming:
  k: 3
  reference_checkpoints: {refs}
  labels: {{team: governance}}
route:
  receiver: log
  group_wait: 0s
receivers:
  - name: log
    file: {{path: alerts.jsonl}}
{watch}
""")
    return path


def both(store: Store, repo: str, sha: str, public: tuple[float, float] | None,
         private: tuple[float, float] | None, at: datetime = T0) -> None:
    if public is not None:
        record_fake_score(store, repo=repo, sha=sha, lstar=public[0], se=public[1], finished_at=at,
                          corpus_sha256=PUBLIC)
    if private is not None:
        record_fake_score(store, repo=repo, sha=sha, lstar=private[0], se=private[1], finished_at=at,
                          corpus_sha256=PRIVATE)


def sent(tmp: Path) -> list[dict]:
    path = tmp / "alerts.jsonl"
    return [json.loads(x)["message"] for x in path.read_text().splitlines()] if path.exists() else []


def test_a_checkpoint_better_on_the_public_corpus_is_flagged(tmp_path: Path) -> None:
    policy = load_policy(write_policy(tmp_path))
    with Store.open(tmp_path / "s.duckdb") as store:
        # references: offsets −0.10 and −0.06, mean −0.08
        both(store, "ref/a", REF_A, (-2.10, 0.03), (-2.00, 0.04))
        both(store, "ref/b", REF_B, (-2.05, 0.03), (-1.99, 0.04))
        both(store, "org/honest", "h" * 40, (-2.28, 0.03), (-2.20, 0.04))    # at the usual offset
        both(store, "org/gamed", "g" * 40, (-2.50, 0.03), None)               # private not scored yet
        report = evaluate_pending(store, [policy], now=T0)
        assert report.predictions == 3 and report.alerts == 0   # ref/a, ref/b, honest; gamed waits
        both(store, "org/gamed", "g" * 40, None, (-2.20, 0.04), at=T0 + timedelta(minutes=1))
        report = evaluate_pending(store, [policy], now=T0 + timedelta(minutes=1))
        assert report.predictions == 1 and report.alerts == 1   # gamed, now that both scores exist
        Dispatcher(store, [policy]).run_once(T0 + timedelta(minutes=1))
        rows = {r["repo"]: r for r in store.query(
            "SELECT repo, state, detail FROM predictions WHERE task = 'calibration_gaming'")}
    assert rows["org/honest"]["state"] == "clear" and rows["org/gamed"]["state"] == "flagged"
    [message] = sent(tmp_path)
    [alert] = message["alerts"]
    assert alert["labels"]["alertname"] == "LstarCalibrationGaming"
    assert alert["labels"]["repo"] == "org/gamed" and alert["labels"]["team"] == "governance"
    [numbers] = message["lstar"]["alerts"]
    # hand-worked: diff −0.30, expected −0.08, SE of the difference 0.05, z = 4.4
    assert numbers["diff"] == pytest.approx(-0.30)
    assert numbers["expected_offset"] == pytest.approx(-0.08)
    assert numbers["se_diff"] == pytest.approx(0.05)
    assert numbers["z"] == pytest.approx(4.4)
    assert numbers["corpus_public"] == PUBLIC and numbers["corpus_private"] == PRIVATE
    assert "possible calibration gaming" in alert["annotations"]["summary"]


def test_missing_reference_scores_hold_the_rule_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_policy(tmp_path)
    with Store.open(tmp_path / "s.duckdb") as store:
        both(store, "ref/a", REF_A, (-2.10, 0.03), (-2.00, 0.04))
        both(store, "org/gamed", "g" * 40, (-2.50, 0.03), (-2.20, 0.04))
    assert main(["alerts", "evaluate", "--policy", str(path), "--db", str(tmp_path / "s.duckdb"),
                 "--json", "--now", T0.isoformat()]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["predictions"] == 0
    assert report["skipped"] == [f"policy governance: calibration_gaming waits for scores of reference "
                                 f"checkpoint(s) on both corpora: ref/b@{REF_B}"]


def test_watch_rules_select_the_scores_a_policy_evaluates(tmp_path: Path) -> None:
    watch = "watch:\n  - {name: eleuther, author: EleutherAI, name_glob: pythia-*}\n"
    policy = load_policy(write_policy(tmp_path, watch=watch))
    assert watches(policy, "EleutherAI/pythia-160m", None)
    assert watches(policy, "eleutherai/pythia-1b", None)       # Hub owners are case-insensitive
    assert not watches(policy, "EleutherAI/gpt-j-6b", None)
    assert not watches(policy, "org/pythia-160m", None)
    assert watches(policy, "org/anything", "eleuther")         # found by the policy's own rule
    open_policy = parse_policy("name: all\nroute: {receiver: r}\nreceivers: [{name: r, file: {path: x}}]\n",
                               "all.yaml").policy
    assert watches(open_policy, "org/anything", None)          # no rules: every score counts
