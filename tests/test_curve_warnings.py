"""A curve's own warnings (`curve_warnings`) reach `lstar curves show`, the governance report's
problems and the alerts: one curve artifact per warning (threshold at the edge of the data, ε
below the test set's resolution, logistic disagreement, resamples that never cross), delivered
through a real webhook receiver and a real SMTP server on 127.0.0.1, and a real DuckDB file."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from monitor.alerts import Dispatcher, evaluate_pending
from monitor.curves.artifact import (CurveArtifact, LogisticCheck, Threshold, curve_warnings, load_curve,
                                     save_curve, unresolved_warnings)
from monitor.curves.fit import fit_curve
from monitor.curves.labels import Label
from monitor.curves.validation import resolution_warnings
from monitor.demo.receivers import SmtpReceiver, WebhookReceiver
from monitor.escape import markdown_text
from monitor.policy.load import load_policy
from monitor.reports.report import build_report, to_markdown
from monitor.store import Store
from support.scores import record_fake_score

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "policies" / "curves" / "arith.json"
T0 = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)
SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def variant(curve: CurveArtifact, **update: Any) -> CurveArtifact:
    """The artifact with some fields replaced, renamed by its new content hash (loads cleanly)."""
    changed = curve.model_copy(update=update)
    return changed.model_copy(update={"curve_id": changed.content_id()})


def _threshold(curve: CurveArtifact, **update: Any) -> Threshold:
    return Threshold.model_validate({**curve.threshold.model_dump(), **update})


def _logistic(curve: CurveArtifact, **update: Any) -> LogisticCheck:
    return LogisticCheck.model_validate({**curve.logistic.model_dump(), **update})


# The fixture's curve crosses at η̂ ≈ -1.89 inside L* -4 … -1, interval ≈ [-2.03, -1.63].
KINDS: dict[str, Any] = {
    "threshold_edge": lambda c: variant(c, threshold=_threshold(c, lower=None)),
    "resolution": lambda c: variant(c, warnings=resolution_warnings([40], baseline=0.25, margin=0.05, metric="acc")),
    "logistic": lambda c: variant(c, logistic=_logistic(c, threshold=13.3, threshold_in_range=False)),
    "never_crosses": lambda c: variant(c, threshold=_threshold(c, never_share=0.3)),
}


@pytest.fixture(scope="module")
def clean() -> CurveArtifact:
    return load_curve(FIXTURE)


def test_a_clean_curve_has_no_warnings(clean: CurveArtifact) -> None:
    assert curve_warnings(clean) == []
    assert unresolved_warnings(clean) == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_warning_is_listed_and_marks_the_threshold_unresolved(clean: CurveArtifact, kind: str,
                                                                   tmp_path: Path) -> None:
    curve = load_curve(save_curve(KINDS[kind](clean), tmp_path / "c.json"))  # survives a round trip
    codes = [w.code for w in curve_warnings(curve)]
    assert kind in codes
    assert all(w.unresolved for w in unresolved_warnings(curve)) and unresolved_warnings(curve)


def test_edge_cases_from_real_fits() -> None:
    # A rise that only starts at the most advanced checkpoints: the curve never reaches b + ε.
    rows = [Label(checkpoint=f"c{i}", value=0.25 + (0.05 if i > 10 else 0.0), family="f", task="t",
                  metric="acc", n=2000, lstar=-0.1 * i) for i in range(12)]
    never = fit_curve(rows, task="t", baseline=0.25, margin=0.1, resamples=100, lofo=False)
    assert never.threshold.status == "never"
    assert {"threshold_edge"} <= {w.code for w in curve_warnings(never)}
    # Above the level from the least advanced checkpoint on.
    rows = [r.with_(value=0.9 - 0.01 * i) for i, r in enumerate(rows)]
    before = fit_curve(rows, task="t", baseline=0.25, margin=0.1, resamples=100, lofo=False)
    assert before.threshold.status == "before_range"
    assert any(w.code == "threshold_edge" and "before the data" in w.message for w in curve_warnings(before))


def test_the_logistic_warning_is_not_stored_twice_for_older_artifacts(clean: CurveArtifact) -> None:
    old = variant(clean, warnings=["the logistic check puts the threshold at 13.3, outside the isotonic "
                                   "interval [-2.033, -1.627]"],
                  logistic=_logistic(clean, threshold=13.3, threshold_in_range=False))
    assert [w.code for w in curve_warnings(old)] == ["logistic"]


def test_curves_show_prints_the_warnings(clean: CurveArtifact, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from monitor.cli import main

    path = save_curve(KINDS["logistic"](clean), tmp_path / "c.json")
    assert main(["curves", "show", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threshold_resolved"] is False
    assert any("13.3" in w for w in data["warnings"])
    assert main(["curves", "show", str(path)]) == 0
    assert "warning: the logistic check puts the threshold at 13.3" in capsys.readouterr().err


# -- report problems and alerts ----------------------------------------------------------------
def _world(tmp: Path, curve: CurveArtifact, hook_url: str, smtp_port: int) -> tuple[Store, Any]:
    save_curve(curve, tmp / "curves" / "arith.json")
    (tmp / "policy.yaml").write_text(f"""\
name: watched
tasks:
  - name: arith
    curve: curves/arith.json
route:
  receiver: hook
  group_wait: 0s
  group_interval: 0s
  routes:
    - receiver: mail
      continue: true
      matchers: ['task="arith"']
    - receiver: hook
receivers:
  - name: hook
    webhook: {{url: "{hook_url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
  - name: mail
    email: {{to: [gov@example.org], from: lstar@example.org, host: 127.0.0.1, port: {smtp_port},
             tls: none, timeout: 5s}}
""")
    policy = load_policy(tmp / "policy.yaml")
    store = Store.open(tmp / "state.duckdb")
    record_fake_score(store, repo="org/model", sha="c" * 40, lstar=-2.0, se=0.02, finished_at=T0)
    evaluate_pending(store, [policy], now=T0)
    Dispatcher(store, [policy], rng=random.Random(1), owner="t").run_once(T0)
    return store, policy


@pytest.mark.parametrize("kind", [None, *sorted(KINDS)])
def test_report_and_alerts_state_an_unresolved_threshold(clean: CurveArtifact, kind: str | None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LSTAR_TEST_WEBHOOK_SECRET", SECRET)
    curve = clean if kind is None else KINDS[kind](clean)
    expected = [w.message for w in unresolved_warnings(curve)]
    with WebhookReceiver() as hook, SmtpReceiver() as smtp:
        store, policy = _world(tmp_path, curve, hook.url, smtp.port)
        try:
            data = build_report(store, policy, now=T0 + timedelta(hours=1), period_start=T0 - timedelta(days=1))
        finally:
            store.close()
        [request] = hook.requests
        [mail] = smtp.mails
    body = json.loads(request.body)
    [alert] = body["alerts"]
    [numbers] = body["lstar"]["alerts"]
    text = mail.message.get_body(preferencelist=("plain",)).get_content()
    html = mail.message.get_body(preferencelist=("html",)).get_content()
    markdown = to_markdown(data)
    [task] = data["tasks"]
    assert numbers["state"] == "at_risk"
    if kind is None:
        assert data["problems"] == [] and task["threshold_resolved"] is True
        assert numbers["threshold_resolved"] is True and numbers["curve_warnings"] == []
        assert "curve_warnings" not in alert["annotations"] and "UNRESOLVED" not in alert["annotations"]["description"]
        assert "UNRESOLVED" not in text and "unresolved" not in html.lower() and "unresolved" not in markdown
        return
    # the report's problems name the task, the curve and every reason, and the lineage resting on it
    [problem] = data["problems"]
    assert problem.startswith(f"task arith: the threshold of curve {curve.curve_id[:12]} is unresolved")
    assert "org/model" in problem and all(m in problem for m in expected)
    assert task["threshold_resolved"] is False and kind in {w["code"] for w in task["curve_warnings"]}
    assert f"> problem: {markdown_text(problem)}" in markdown and "**unresolved**" in markdown
    # the webhook: numbers, an annotation with every warning, and the description says it
    assert numbers["threshold_resolved"] is False
    assert kind in {w["code"] for w in numbers["curve_warnings"]}
    assert all(m in alert["annotations"]["curve_warnings"] for m in expected)
    assert "threshold is UNRESOLVED" in alert["annotations"]["description"]
    assert all(m in alert["annotations"]["description"] for m in expected)
    # the email, plain text and HTML
    assert "THRESHOLD UNRESOLVED" in text and f"curve warning ({kind}):" in text
    assert "Threshold unresolved:" in html and f"curve warning ({kind}):" in html
