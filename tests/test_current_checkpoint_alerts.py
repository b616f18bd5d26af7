"""One current checkpoint everywhere, the alert engine included (issue 38, item 1).

A lineage's state is that of its current checkpoint, the latest in TRAINING order
(`monitor.training_order`). Here `org/pythia-tiny@step2000` is scored first and its task is
at_risk (the alert fires); then step1000, an EARLIER checkpoint, is scored late and is clear.
Its prediction is recorded, but it must not resolve step2000's alert: the alert engine, the
watchlist, the status page, the report and the alerts table all still say step2000's state, and
the evaluation's log and report say that step1000 was an earlier checkpoint scored late. A later
checkpoint (step3000) that is clear does resolve the alert: the rule is training order, not
"never resolve".

The store is built with the poller's, scorer's and outbox's own functions (`Store.record_*`,
`evaluate_pending`); every expected value is read straight from the tables or worked by hand
from the curve's own numbers (`predict_task` on the L* given).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace

import pytest

from monitor.alerts.evaluation_tick import evaluate_pending
from monitor.alerts.predict import predict_task
from monitor.hub.poll import Candidate
from monitor.policy.load import load_policy
from monitor.reports.report import report_for_cli
from monitor.reports.watchlist import watchlist_page
from monitor.service.status_page import last_alerts, lineage_rows, read_candidates
from monitor.store import Store
from support.report_state import CORPUS, T0, _fit_curve, _score_run, write_report_policy
from support.scores import fake_sha

REPO = "org/pythia-tiny"
# step: (L*, SE, commit date hours after T0). At_risk at L* 1.8, clear at 2.6 and 3.0 on the
# fixture's curve (checked by `predict_task` below, not assumed).
STEPS = {1000: (2.6, 0.03, 0), 2000: (1.8, 0.03, 1), 3000: (3.0, 0.03, 2)}


def _score(store: Store, ids: dict[int, int], shas: dict[int, str], step: int, hours: float) -> None:
    lstar, se, _ = STEPS[step]
    when = T0 + timedelta(hours=hours)
    run, tokenizer = _score_run(f"run-step{step}", REPO, shas[step], ids[step], lstar, se, when)
    store.record_score_run(run, [("d1", "web", 1000, run["nll_sum"], 4000)],
                           {"sha256": CORPUS, "name": "calib", "version": "0", "parent_sha256": CORPUS,
                            "selection": "all", "n_documents": 1, "n_bytes": 4000}, tokenizer)
    store.set_checkpoint_verdict(ids[step], expect_status="discovered", status="scored", reason=None, meta=None,
                                 now=when)


@pytest.fixture()
def world(tmp_path):
    curve = _fit_curve(tmp_path)
    write_report_policy(tmp_path, tmp_path / "audit.jsonl")
    policy = load_policy(tmp_path / "policy.yaml")
    store = Store.open(tmp_path / "lstar.duckdb")
    shas = {step: fake_sha(f"pythia step {step}") for step in STEPS}
    store.record_discoveries("rule-key", "watch", "http://hub.invalid", [
        Candidate(REPO, shas[step], (f"step{step}",), meta={
            "gate": {"verdict": "passed", "commit_date": (T0 + timedelta(hours=hours)).isoformat()}})
        for step, (_, _, hours) in STEPS.items()], watermark=None, boundary=[], now=T0 + timedelta(hours=3),
        requests=1, listed=len(STEPS))
    ids = {step: next(c.id for c in store.list_checkpoints() if c.sha == shas[step]) for step in STEPS}
    task = policy.tasks[0]
    by_hand = {step: predict_task(curve, task, value=lstar, se=se, corpus_sha256=CORPUS).state
               for step, (lstar, se, _) in STEPS.items()}
    assert by_hand == {1000: "clear", 2000: "at_risk", 3000: "clear"}
    yield SimpleNamespace(store=store, policy=policy, task=task.name, shas=shas, ids=ids)
    store.close()


def _alerts(store: Store) -> list[dict]:
    return store.query("SELECT id, commit_sha, state, status, kind FROM alerts ORDER BY created_at, id")


def test_an_earlier_checkpoint_scored_late_leaves_the_lineage_state_and_its_alert(world, caplog) -> None:
    store, sha = world.store, world.shas
    _score(store, world.ids, sha, 2000, hours=4)
    evaluate_pending(store, [world.policy], now=T0 + timedelta(hours=4, minutes=1))
    [fired] = _alerts(store)
    assert (fired["commit_sha"], fired["state"], fired["status"]) == (sha[2000], "at_risk", "firing")
    (deliveries_before,) = store.query("SELECT count(*) AS n FROM deliveries")

    _score(store, world.ids, sha, 1000, hours=5)   # step1000, earlier in training, scored late
    with caplog.at_level(logging.INFO, logger="lstar.events"):
        report = evaluate_pending(store, [world.policy], now=T0 + timedelta(hours=5, minutes=1))

    # it gets its prediction row, with its own state ...
    preds = store.query("SELECT commit_sha, state FROM predictions ORDER BY evaluated_at, id")
    assert [(p["commit_sha"], p["state"]) for p in preds] == [(sha[2000], "at_risk"), (sha[1000], "clear")]
    # ... but no resolve, no new alert, no delivery: step2000's alert still fires
    assert _alerts(store) == [fired]
    assert store.query("SELECT count(*) AS n FROM deliveries") == [deliveries_before]
    history = store.lineage_history(world.policy.name, world.task, REPO)
    assert (history.state, history.current, history.behind_current) == ("at_risk", sha[2000], False)
    assert history.last_firing is not None and history.last_firing.id == fired["id"]
    # the evaluation's report and log say why
    [late] = report.as_dict()["late"]
    assert sha[1000][:12] in late and sha[2000][:12] in late and "earlier in training order" in late
    [logged] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("state ")]
    assert "late=true" in logged.lower() and f"current={sha[2000][:12]}" in logged and "changed=false" in logged.lower()

    # the watchlist, the status page and the report name step2000 and its state
    [row] = watchlist_page(store).items
    assert (row["commit"], row["state"], row["last_alert"]["id"]) == (sha[2000], "at_risk", fired["id"])
    candidates, _ = read_candidates(store, {world.policy.name: [world.task]})
    [page_row], _ = lineage_rows(candidates)
    assert (page_row["commit"], page_row["state"]) == (sha[2000], "at_risk")
    page_alert = last_alerts(store, [page_row["key"]])[page_row["key"]]
    assert (page_alert["id"], page_alert["status"]) == (fired["id"], "firing")
    data = report_for_cli(store, world.policy, now=T0 + timedelta(hours=6))
    [lineage] = data["tasks"][0]["lineages"]
    assert (lineage["commit"], lineage["state"]) == (sha[2000], "at_risk")
    [family] = data["families"]
    assert family["current"].startswith(f"{REPO}@step2000 (")
    # its crossings are the alerts': step2000 entering at_risk, not step1000 "clearing" it
    assert [(c["commit"], c["from"], c["to"]) for c in data["crossings"]] == [(sha[2000], None, "at_risk")]


def test_a_later_checkpoint_still_resolves_the_alert(world) -> None:
    store, sha = world.store, world.shas
    for step, hours in ((2000, 4), (1000, 5), (3000, 6)):
        _score(store, world.ids, sha, step, hours=hours)
        report = evaluate_pending(store, [world.policy], now=T0 + timedelta(hours=hours, minutes=1))
    assert "late" not in report.as_dict()   # step3000 is the latest in training order
    alerts = _alerts(store)
    assert [(a["commit_sha"], a["state"], a["status"]) for a in alerts] == \
        [(sha[2000], "at_risk", "firing"), (sha[3000], "clear", "resolved")]
    history = store.lineage_history(world.policy.name, world.task, REPO)
    assert (history.state, history.current) == ("clear", sha[3000])


def test_the_scored_checkpoint_is_placed_before_it_has_a_prediction(world) -> None:
    """`lineage_history` with the checkpoint being evaluated: behind the current one or not,
    from the refs and dates the checkpoints table holds (nothing predicted for it yet)."""
    store, sha = world.store, world.shas
    _score(store, world.ids, sha, 2000, hours=4)
    evaluate_pending(store, [world.policy], now=T0 + timedelta(hours=4, minutes=1))
    ask = lambda step: store.lineage_history(world.policy.name, world.task, REPO,  # noqa: E731
                                             (REPO, sha[step], T0 + timedelta(hours=9)))
    assert (ask(1000).behind_current, ask(2000).behind_current, ask(3000).behind_current) == (True, False, False)
    assert ask(1000).state == ask(3000).state == "at_risk"
