"""Active evaluation in the daemon, on the fake Hub: a checkpoint predicted at_risk is evaluated
once (a leased job in a child process), a SIGKILL during the job loses nothing and runs it at
most once more, the observation's alert reaches the webhook, the report has a track record,
the daily budget holds; and a curve its observations contradict raises LstarCurveMiscalibrated
exactly once."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone

import pytest

from monitor.policy import load_policy
from monitor.reports.report import build_report, to_markdown
from monitor.demo.fakehub import FakeHub
from monitor.demo.hub_repos import add_lineage
from monitor.demo.receivers import WebhookReceiver
from monitor.scoring.corpus import load_corpus
from monitor.store import Store
from support.cli_run import lstar_in_process
from support.daemon_harness import DaemonProcess, wait_for
from tests.test_daemon_events import SECRET_ENV, fit_arith_curve

pytestmark = pytest.mark.slow  # daemons score and evaluate tiny checkpoints in child processes

# Documents scored per checkpoint: every check here is on predictions, evaluations and alerts,
# none on how precise an L* is. The steps of a lineage land near the curve's level with 2 as
# with 4 or 20: the at_risk interval is the curve's band around the 0.3 level (0.26 to 0.33 at
# an L* near 6.2), several nats wide, not the L*'s standard error. The first 2 documents of
# calib-v0 (7,496 bytes) are 43 % of the first 4 (17,482), so of the forward passes through
# gpt-neox's 50,277-id output layer, in 8 scores of the file's two tests.
DOCS = 2
ITEMS = 20


def mc_task(path, *, right: bool, items: int = ITEMS):
    """A two-option task whose answer is the 1-token option (`right`) or the 9-token one.

    A randomly initialised model gives each token a log-probability near -log(vocab), so the
    summed log-likelihood of one token beats that of nine on every item: accuracy is exactly 1
    (`right`) or 0, whatever the weights' seed (checked independently below)."""
    lines = []
    for i in range(items):
        short, long = " yes", " no" * 9
        choices = [short, long] if i % 2 == 0 else [long, short]
        lines.append(json.dumps({"id": f"q{i}", "context": f"Question {i}: is it so?", "choices": choices,
                                 "answer": choices.index(short if right else long)}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_policy(folder, hook_url: str, curve, *, per_day: int, on: str = "[at_risk, emerged]") -> None:
    (folder / "watcher.yaml").write_text(f"""\
name: watcher
watch:
  - name: tiny
    author: fake-org
    revisions: {{branches: "step\\\\d+"}}
evaluations: {{per_day: {per_day}}}
tasks:
  - name: arith
    curve: {curve}
    evaluate: {{kind: multiple_choice, file: mc.jsonl, metric: acc, on: {on}}}
route: {{receiver: hook, group_wait: 0s, group_interval: 0s, repeat_interval: 4h}}
receivers:
  - name: hook
    webhook: {{url: "{hook_url}", secret_env: LSTAR_TEST_WEBHOOK_SECRET, timeout: 5s}}
""")


def _args(tmp_path, corpus_dir):
    return ["--cache-dir", str(tmp_path / "cache"), "--corpus", str(corpus_dir), "--docs", str(DOCS),
            "--max-context", "128", "--n-boot", "50"]


def _alerts(hook: WebhookReceiver) -> list[dict]:
    return [a for r in hook.requests if r.method == "POST" for a in r.json().get("alerts", [])]


def test_an_at_risk_checkpoint_is_evaluated_once_through_a_sigkill_within_the_budget(tmp_path, shared_dir):
    corpus_dir = shared_dir / "corpus" / "calib-v0"
    corpus = load_corpus(corpus_dir).select(first=DOCS).sha256
    curve = fit_arith_curve(corpus, tmp_path / "arith.json")
    policies, state = tmp_path / "policies", tmp_path / "state"
    policies.mkdir()
    mc_task(policies / "mc.jsonl", right=True)
    with FakeHub() as hub, WebhookReceiver() as hook:
        # equally (un)trained steps: each lands near the curve's level, predicted at_risk
        add_lineage(hub, "fake-org/tiny", steps=(1000, 2000, 3000), init_std=(0.4, 0.4))
        write_policy(policies, hook.url, curve, per_day=1)
        # The lineage is on the Hub before either daemon starts: the poll each daemon runs at
        # its start finds every step, so later polls find nothing (polling each second, an
        # idle daemon used 0.054 CPU-seconds a second; polling once, 0.032).
        args = [*_args(tmp_path, corpus_dir), "--poll-every", "1h"]
        first = DaemonProcess(policies, state, endpoint=hub.url, args=args,
                              env={**SECRET_ENV, "LSTAR_FAILPOINT": "hang_eval_child"})
        with first:
            wait_for(lambda: "observation_started" in first.log(), timeout=400,
                     what=f"the evaluation job to start\n{first.log()[-3000:]}")
            first.kill()   # SIGKILL mid-job: the hung child dies with it (PR_SET_PDEATHSIG)
        second = DaemonProcess(policies, state, endpoint=hub.url, args=args, env=SECRET_ENV)
        with second:
            wait_for(lambda: any(a["labels"]["alertname"].startswith("LstarPrediction") for a in _alerts(hook)),
                     timeout=400, what=f"the observation's alert at the webhook\n{second.log()[-3000:]}")
            # polled each second, not every 0.2 s: each /status request builds a new httpx client
            # (about 34 ms of CPU here for its SSL context) and the daemon answers it, for a
            # minute of scoring; the counts only grow, so a later look sees what an earlier would
            wait_for(lambda: second.status()["checkpoints"].get("scored") == 3, timeout=400, every=1.0,
                     what=f"every step scored\n{second.log()[-3000:]}")
            # then two more evaluation ticks and two more observe ticks: every prediction is
            # written and every one that calls for an evaluation has its row
            for job in ("evaluate", "observe"):
                runs = second.status()["jobs"][job]["runs"]
                wait_for(lambda job=job, runs=runs: second.status()["jobs"][job]["runs"] >= runs + 2, timeout=120,
                         every=1.0, what=f"two more {job} ticks")
            # the API shows the observed state beside the predicted one, and counts the skipped
            listed = {c["sha"]: c["observations"] for c in second.get_json("/checkpoints")["items"]}
            summary = second.status()["observations"]
            assert second.stop() == 0
        # what `lstar checkpoints` prints, run in this process (tests/support/cli_run.py): the
        # listing is checked, not how a process starts
        shown = lstar_in_process("checkpoints", "--state", str(state), env={"COLUMNS": "400"})
        assert shown.returncode == 0, shown.stderr
        listing = shown.stdout
        assert second.log().count("observation_started") == 1   # run once more, not twice

    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        predictions = store.query("SELECT run_id, repo, commit_sha, state, lo, hi, threshold FROM predictions "
                                  "WHERE task = 'arith' ORDER BY evaluated_at, id")
        observations = store.observations()
        eval_runs = store.query("SELECT * FROM eval_runs")
        policy = load_policy(policies / "watcher.yaml")
        report = build_report(store, policy, now=datetime.now(timezone.utc),
                              period_start=datetime(2000, 1, 1, tzinfo=timezone.utc))
    eligible = [p for p in predictions if p["state"] in ("at_risk", "emerged")]
    assert len(eligible) >= 2 and eligible[0]["state"] == "at_risk"
    assert len(observations) == len(eligible)   # only predictions in `on` get a row
    done = [o for o in observations if o["status"] == "done"]
    skipped = [o for o in observations if o["status"] == "skipped"]
    # exactly one evaluation job, for the first eligible prediction; the others are over the budget
    assert len(done) == 1 and len(skipped) == len(eligible) - 1
    obs = done[0]
    assert obs["run_id"] == eligible[0]["run_id"] and obs["predicted_state"] == "at_risk"
    assert sorted(o["run_id"] for o in skipped) == sorted(p["run_id"] for p in eligible[1:])
    assert {o["reason"] for o in skipped} == {"budget"} and {o["eval_run_id"] for o in skipped} == {None}
    # the SIGKILL cost one attempt, recorded, and the job ran once more: one evaluation run stored
    assert obs["attempts"] == 2 and len(obs["meta"]["interrupted"]) == 1
    assert len(eval_runs) == 1 and obs["eval_run_id"] == eval_runs[0]["run_id"]
    assert json.loads(eval_runs[0]["metrics"])["acc"]["value"] == 1.0
    # the child's thread count is kept: float32 sums differ in the last places between counts
    threads = json.loads(eval_runs[0]["model"])["threads"]
    assert isinstance(threads, int) and threads >= 1
    # every item right: Clopper-Pearson at 0.9 gives [0.05 ** (1/20), 1]
    assert (obs["observed"], obs["n"], obs["k"]) == (1.0, ITEMS, ITEMS)
    assert obs["observed_lo"] == pytest.approx(0.05 ** (1 / ITEMS), rel=1e-9) and obs["observed_hi"] == 1.0
    assert obs["observed_lo"] > eligible[0]["threshold"]
    assert obs["observed_state"] == "observed_emerged"
    # the at_risk interval holds the level; the observed one lies wholly above it and above the interval
    assert eligible[0]["lo"] <= eligible[0]["threshold"] <= eligible[0]["hi"] < obs["observed_lo"]
    assert obs["verdict"] == "contradicted" and obs["inside"] is False
    # the alert, delivered to the webhook once, with both states
    observed_alerts = [a for a in _alerts(hook) if a["labels"]["alertname"].startswith("LstarPrediction")]
    assert len(observed_alerts) == 1
    labels = observed_alerts[0]["labels"]
    assert labels["alertname"] == "LstarPredictionContradicted"
    assert (labels["predicted_state"], labels["observed_state"], labels["state"]) == \
        ("at_risk", "observed_emerged", "observed_emerged")
    assert labels["commit"] == obs["commit_sha"]
    assert [(o["predicted_state"], o["observed_state"], o["verdict"]) for o in listed[obs["commit_sha"]]] == \
        [("at_risk", "observed_emerged", "contradicted")]
    assert {(o["status"], o["reason"], o["n"]) for o in summary} == \
        {("done", None, 1), ("skipped", "budget", len(eligible) - 1)}
    assert "observed arith: at_risk -> observed_emerged (contradicted)" in " ".join(listing.split())
    assert " ".join(listing.split()).count("evaluation arith: skipped (budget)") == len(eligible) - 1
    # the report: the track record, and the observed state beside the predicted one
    record = report["track_record"]
    assert [(r["curve_id"], r["checked"], r["covered"], r["contradictions"]) for r in record] == \
        [(obs["curve_id"], 1, 0, 1)]
    text = to_markdown(report)
    assert "## Track record" in text and "predictions checked: 1" in text
    checked = [x for t in report["tasks"] for x in t["lineages"] if x["commit"] == obs["commit_sha"]]
    for x in checked:
        assert (x["predicted_state"], x["observed_state"], x["state_in_force"]) == \
            ("at_risk", "observed_emerged", "observed_emerged")


def test_a_curve_its_observations_contradict_raises_miscalibrated_exactly_once(tmp_path, shared_dir):
    corpus_dir = shared_dir / "corpus" / "calib-v0"
    corpus = load_corpus(corpus_dir).select(first=DOCS).sha256
    curve = fit_arith_curve(corpus, tmp_path / "arith.json")   # claims the task sits near 0.3
    policies, state = tmp_path / "policies", tmp_path / "state"
    policies.mkdir()
    mc_task(policies / "mc.jsonl", right=False)   # observed: 0 of 20, wholly below
    args = ["--once", "--once-wait", "30s", *_args(tmp_path, corpus_dir)]
    with FakeHub() as hub, WebhookReceiver() as hook:
        add_lineage(hub, "fake-org/tiny", steps=(1000, 2000, 3000, 4000, 5000))
        write_policy(policies, hook.url, curve, per_day=20, on="[clear, at_risk, emerged]")
        for run in range(2):   # a second pass (a restart) finds the episode already told
            daemon = DaemonProcess(policies, state, endpoint=hub.url, env=SECRET_ENV, fast=False, args=args)
            done = subprocess.run(daemon.command(), capture_output=True, text=True, env=daemon.env, timeout=900,
                                  check=False)
            assert done.returncode == 0, done.stderr[-4000:]
        miscalibrated = [a for a in _alerts(hook) if a["labels"]["alertname"] == "LstarCurveMiscalibrated"]
    with Store.open(state / "lstar.duckdb", read_only=True) as store:
        observations = store.observations(status="done")
        episodes = store.miscalibrations()
    assert len(observations) == 5
    assert all(o["observed"] == 0.0 and o["verdict"] == "contradicted" and o["inside"] is False
               for o in observations)
    # 0 of 5 inside at nominal 0.9: P(X <= 0) = 0.1 ** 5, far below 0.05
    assert len(episodes) == 1 and episodes[0]["alerted_at"] is not None and episodes[0]["ended_at"] is None
    assert json.loads(episodes[0]["detail"])["p_value"] == pytest.approx(0.1 ** 5)
    assert len(miscalibrated) == 1
    assert miscalibrated[0]["labels"]["curve_id"] == observations[0]["curve_id"]
