"""A report's worth of state for tests and screenshots: three families watched on the Hub.

- `org/pythia-tiny`: a Pythia-style lineage, one branch per training step; the steps sort
  wrongly as strings (step200, step1000, step2000, step3000, step20000) and were scored out
  of order, so only ordering by the parsed step puts step20000 last;
- `org/llama-tiny`: three commits of `main`, dated by the gate's commit date, scored newest
  first, so only ordering by commit date puts the newest last;
- `org/neox-small`: two `main` commits known only from the Hub listing's lastModified,
  scored newest first.

Checkpoints are written with `Store.record_discoveries` (as the poller does) with the meta the
poller and the gate record, score runs with `Store.record_score_run`, and predictions by the
real outbox (`evaluate_pending`) after each run, in scoring order, as the daemon does. The
task curve is fitted on synthetic labels by the real fit with the level b + ε = 0.25 + 0.0455.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from support.scores import fake_sha

CORPUS = "c" * 64
T0 = datetime(2025, 3, 1, 12, tzinfo=timezone.utc)
BASELINE, MARGIN = 0.25, 0.0455

# (step, L*, SE, commit date hours after T0, scoring hours after T0): commit dates scrambled
# against the steps when `scrambled`, scoring times always in another order again.
PYTHIA = [(200, 3.1, 0.03, 3, 5.4), (1000, 2.4, 0.03, 0, 5.3), (2000, 1.6, 0.02, 4, 5.2),
          (3000, 1.1, 0.02, 1, 5.0), (20000, 0.3, 0.02, 2, 5.1)]
# (commit label, L*, SE, commit date hours after T0, scoring hours after T0)
LLAMA = [("c1", 2.9, 0.05, 0.5, 6.2), ("c2", 2.2, 0.04, 1.5, 6.1), ("c3", 1.9, 0.04, 2.5, 6.0)]
NEOX = [("n1", 2.7, 0.04, 1.0, 6.6), ("n2", 2.05, 0.04, 3.5, 6.5)]
TOKENIZERS = {"org/pythia-tiny": ("a1" * 32, 7.2), "org/llama-tiny": ("b2" * 32, 6.4),
              "org/neox-small": ("c3" * 32, 7.0)}


@dataclass
class ReportState:
    """What `build_report_state` made: the open store, the policy and curve, and the facts the
    tests check the report against."""

    store: Any
    policy: Any
    curve: Any
    folder: Path
    shas: dict[tuple[str, str], str]     # (repo, step/commit label) -> sha
    now: datetime


def _score_run(run_id: str, repo: str, sha: str, checkpoint_id: int, lstar: float, se: float,
               when: datetime) -> tuple[dict[str, Any], dict[str, Any]]:
    fp, ce_uni = TOKENIZERS[repo]
    # A heavy-tailed TCB, as real models give: the mean well above the median.
    tcb = {"mean": 40.0 + 30 * lstar, "median": 3.5 + lstar, "p10": 0.8 + lstar / 5, "v_eff_mean": 8.0 + 20 * lstar,
           "margin_mean": 2.5 - lstar / 2, "n_positions": 256}
    run = {"run_id": run_id, "checkpoint_id": checkpoint_id, "model_repo": repo, "model_sha": sha,
           "model_source": "hub", "tokenizer_fingerprint": fp, "corpus_sha256": CORPUS,
           "spec_version": "lstar-score/1", "window_len": 64, "stride": 32, "prefix_policy": "bos",
           "dtype": "float32", "device": "cpu", "n_tokens": 1000, "n_bytes": 4000,
           "nll_sum": (lstar + ce_uni) * 1000, "ce": lstar + ce_uni, "ce_unigram": ce_uni, "lstar": lstar,
           "l_rel": (lstar + ce_uni) / ce_uni, "l_gain": -lstar / ce_uni, "bits_per_byte": 1.0,
           "tokens_per_byte": 0.25, "se_ce": se, "weighted_ppl": None, "reference_fingerprint": None,
           "slices": {}, "tcb": tcb, "spec": {}, "model": {}, "library_versions": {}, "wall_s": 1.0,
           "tokens_per_s": 1000.0, "finished_at": when}
    tokenizer = {"fingerprint": fp, "source": fp, "vocab_size": 10, "prefix_policy": "bos", "prefix_token_id": 0}
    return run, tokenizer


def _fit_curve(folder: Path) -> Any:
    from monitor.curves.artifact import ScoringRef, save_curve
    from monitor.curves.fit import fit_curve
    from monitor.curves.labels import Label

    rng = np.random.default_rng(0)
    xs = np.linspace(0.0, 3.2, 16)
    labels = [Label(checkpoint=f"h{i}", value=float(np.clip(BASELINE + 0.6 / (1 + np.exp(4 * (x - 1.2)))
                                                              + rng.normal(0, 0.02), 0, 1)),
                    family="f1" if i % 2 else "f2", task="cloze", metric="acc", n=200, lstar=float(x))
              for i, x in enumerate(xs)]
    spec = ScoringRef(spec_version="lstar-score/1", window=64, stride=32, prefix_policy="bos")
    curve = fit_curve(labels, task="cloze", metric="acc", baseline=BASELINE, margin=MARGIN, resamples=100,
                      lofo=False, corpus_sha256=CORPUS, scoring_spec=spec)
    save_curve(curve, folder / "curves" / "cloze.json")
    return curve


def write_report_policy(folder: Path, audit: Path) -> Path:
    """`folder/policy.yaml`: the cloze curve at `folder/curves/cloze.json`, alerts and a daily
    report to the file receiver `audit`."""
    path = Path(folder) / "policy.yaml"
    path.write_text(f"""\
name: governance
tasks:
  - name: cloze
    curve: curves/cloze.json
corpora:
  public: {CORPUS}
route:
  receiver: audit
receivers:
  - name: audit
    file:
      path: {audit}
reports:
  - name: weekly
    schedule:
      every: 1d
    receivers: [audit]
""")
    return path


def build_report_state(folder: Path, *, scrambled: bool = True) -> ReportState:
    """Write the curve, policy and DuckDB file under `folder` and return them (store open).

    `scrambled` dates the Pythia commits out of step order (to prove the step wins); without
    it they are dated in step order, as a real training run publishes them.
    """
    from monitor.alerts.evaluation_tick import evaluate_pending
    from monitor.hub.poll import Candidate
    from monitor.policy.load import load_policy
    from monitor.store import Store

    folder = Path(folder)
    curve = _fit_curve(folder)
    write_report_policy(folder, folder / "audit.jsonl")
    policy = load_policy(folder / "policy.yaml")
    store = Store.open(folder / "lstar.duckdb")
    shas: dict[tuple[str, str], str] = {}
    runs = []   # (scored at, repo, label, L*, SE)
    candidates = []
    for i, (step, lstar, se, hours, scored) in enumerate(PYTHIA):
        sha = shas[("org/pythia-tiny", f"step{step}")] = fake_sha(f"pythia step {step}")
        committed = T0 + timedelta(hours=hours if scrambled else i)
        refs = ("main", f"step{step}") if step == max(s for s, *_ in PYTHIA) else (f"step{step}",)
        candidates.append(Candidate("org/pythia-tiny", sha, refs, meta={
            "gate": {"verdict": "passed", "commit_date": committed.isoformat()}}))
        runs.append((T0 + timedelta(hours=scored), "org/pythia-tiny", f"step{step}", lstar, se))
    for label, lstar, se, hours, scored in LLAMA:
        sha = shas[("org/llama-tiny", label)] = fake_sha(f"llama {label}")
        candidates.append(Candidate("org/llama-tiny", sha, ("main",), meta={
            "gate": {"verdict": "passed", "commit_date": (T0 + timedelta(hours=hours)).isoformat()}}))
        runs.append((T0 + timedelta(hours=scored), "org/llama-tiny", label, lstar, se))
    for label, lstar, se, hours, scored in NEOX:
        sha = shas[("org/neox-small", label)] = fake_sha(f"neox {label}")
        candidates.append(Candidate("org/neox-small", sha, ("main",), meta={
            "listing": {"last_modified": (T0 + timedelta(hours=hours)).isoformat()}}))
        runs.append((T0 + timedelta(hours=scored), "org/neox-small", label, lstar, se))
    store.record_discoveries("rule-key", "watch", "http://hub.invalid", candidates, watermark=None, boundary=[],
                             now=T0 + timedelta(hours=4, minutes=30), requests=1, listed=len(candidates))
    ids = {(c.repo, c.sha): c.id for c in store.list_checkpoints()}
    for n, (when, repo, label, lstar, se) in enumerate(sorted(runs)):
        sha = shas[(repo, label)]
        run, tokenizer = _score_run(f"run{n:02d}", repo, sha, ids[(repo, sha)], lstar, se, when)
        store.record_score_run(run, [("d1", "web", 1000, run["nll_sum"], 4000)],
                               {"sha256": CORPUS, "name": "calib", "version": "0", "parent_sha256": CORPUS,
                                "selection": "all", "n_documents": 1, "n_bytes": 4000}, tokenizer)
        store.set_checkpoint_verdict(ids[(repo, sha)], expect_status="discovered", status="scored", reason=None,
                                     meta=None, now=when)
        evaluate_pending(store, [policy], now=when + timedelta(minutes=1))
    return ReportState(store=store, policy=policy, curve=curve, folder=folder, shas=shas,
                       now=T0 + timedelta(hours=7))


__all__ = ["ReportState", "build_report_state", "PYTHIA", "LLAMA", "NEOX", "T0", "BASELINE", "MARGIN"]
