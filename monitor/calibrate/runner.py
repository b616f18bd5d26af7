"""Run a campaign: score every checkpoint, evaluate it on every task, import results files,
then fit, validate and write the curves (`monitor.calibrate.outputs`).

This process is the only writer of the campaign's DuckDB file. Scoring fans out over the
scoring backend (`score_checkpoints`, the one place that knows how scores are computed);
evaluation runs here, on a checkpoint loaded once for all of its tasks. Every finished job is
written in one transaction with its rows, so a campaign killed at any point resumes with
exactly the jobs that have no stored run (`monitor.calibrate.plan`). A job that fails is
reported and the others go on; curves are fitted only when every job is done.

Crash tests stop the run with `LSTAR_FAILPOINT=calibrate_after_jobs=N`: SIGKILL right after
the N-th job this process finished was written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from monitor.calibrate.campaign import Campaign, TaskSpec
from monitor.calibrate.evaluate import check_lm_eval_available, evaluate
from monitor.calibrate.outputs import CampaignOutputs, write_outputs
from monitor.calibrate.plan import KEY_FIELD, EvalWork, Plan, ScoreWork, build_plan, db_path, mark_done
from monitor.curves.labels import Label, label_rows, read_labels_csv, read_lm_eval_results
from monitor.errors import CampaignError, LstarError
from monitor.failpoints import failpoint, failpoint_values
from monitor.scoring import ScoredRun, ScoreRequest, compute_score, load_checkpoint, load_corpus, prepare
from monitor.scoring.loader import download_hub_checkpoint
from monitor.scoring.tokenizer import load_tokenizer
from monitor.store import Store

FAILPOINT = "calibrate_after_jobs"

# on_progress(stage, done, total, what): stage is "score", "eval", "import" or "fit".
Progress = Callable[[str, int, int, str], None]


@dataclass
class JobFailure:
    """A job that did not finish, and why (one line)."""

    kind: str
    checkpoint: str
    task: str | None
    error: str


@dataclass
class CampaignResult:
    """What a run of a campaign did and wrote."""

    plan: Plan
    ran_scores: list[str] = field(default_factory=list)      # score run ids written by this run
    ran_evals: list[str] = field(default_factory=list)       # eval run ids written by this run
    imported: int = 0
    skipped_results: list[str] = field(default_factory=list)
    failures: list[JobFailure] = field(default_factory=list)
    outputs: CampaignOutputs | None = None
    db: Path | None = None


def _corpus(campaign: Campaign) -> Any:
    spec = campaign.corpus
    corpus = load_corpus(campaign.path(spec.dir))
    if spec.docs is None and spec.slices is None and spec.every is None:
        return corpus
    return corpus.select(slices=spec.slices, every=spec.every, first=spec.docs)


def score_request(campaign: Campaign, work: ScoreWork) -> ScoreRequest:
    """The `lstar score` request of one scoring job (the model is set where it is fetched)."""
    s, c = campaign.scoring, campaign.corpus
    return ScoreRequest(model="", corpus_dir=campaign.path(c.dir), max_context=s.max_context, stride=s.stride,
                        disjoint=s.disjoint, docs=c.docs, slices=c.slices, every=c.every, dtype=s.dtype,
                        device=s.device, batch_size=s.batch_size, with_tcb=s.with_tcb, n_boot=s.n_boot,
                        progress=False, extra_model_info={KEY_FIELD: work.key})


def _fetched_request(campaign: Campaign, work: ScoreWork) -> ScoreRequest:
    request = score_request(campaign, work)
    c = work.checkpoint
    if c.source == "local":
        return replace(request, model=str(c.local_dir))
    # The gate's verified download, pinned to the campaign's sha; the snapshot links into
    # the repo cache's blobs/, so that folder is where its files may resolve.
    snapshot, repo_cache = download_hub_checkpoint(c.repo, c.sha, _cache_dir(campaign), endpoint=campaign.hub.endpoint)
    return replace(request, model=str(snapshot), model_root=repo_cache,
                   extra_model_info={**request.extra_model_info, "repo": c.repo, "sha": c.sha, "source": "hub",
                                     "path": str(snapshot)})


def _cache_dir(campaign: Campaign) -> Path | None:
    return campaign.path(campaign.hub.cache_dir) if campaign.hub.cache_dir else None


def score_checkpoints(campaign: Campaign, works: list[ScoreWork],
                      store: Store) -> Iterator[tuple[ScoreWork, ScoredRun | LstarError]]:
    """Score each job; yields (job, its rows or the error that stopped it) as each finishes.

    The one place that computes scores for a campaign: the local backend runs them here, one
    after another, sharing the store's cache of unigram baselines.
    """
    if campaign.scoring.backend != "local":
        raise CampaignError(f"{campaign.label}: scoring.backend: {campaign.scoring.backend!r} is not available "
                            "in this installation", hint="use backend: local")
    for work in works:
        try:
            yield work, compute_score(prepare(_fetched_request(campaign, work)), store)
        except LstarError as exc:
            yield work, exc


def _kill_after(finished: int) -> None:
    value = failpoint_values().get(FAILPOINT)
    if value and value.isdigit() and finished == int(value):
        failpoint(FAILPOINT)


def _load_for_eval(campaign: Campaign, work: EvalWork) -> Any:
    c = work.checkpoint
    ref = str(c.local_dir) if c.source == "local" else f"{c.repo}@{c.sha}"
    return load_checkpoint(ref, dtype=campaign.scoring.dtype, device=campaign.scoring.device,
                           cache_dir=_cache_dir(campaign), endpoint=campaign.hub.endpoint)


def _import_results(campaign: Campaign, index: int, task: TaskSpec, plan: Plan) -> tuple[list[Label], list[str]]:
    """Labels of an imported results file, each matched to a campaign checkpoint by repo and
    sha (or by name). L* always comes from the campaign's own scores, so every point of a
    curve shares one corpus and scoring spec; L* columns of a CSV are not used."""
    assert task.results is not None
    path = campaign.path(task.results)
    try:
        raw = read_labels_csv(path) if path.suffix.lower() == ".csv" else read_lm_eval_results(path)
    except LstarError as exc:
        raise CampaignError(f"{campaign.label}: tasks[{index}].results: {exc.one_line()}") from None
    matched, skipped = [], []
    for label in raw:
        found = None
        for c in plan.checkpoints:
            repo = label.repo or label.checkpoint
            same_repo = repo in (c.repo, c.ref, c.name) or label.checkpoint == c.name
            same_sha = label.sha is None or label.sha == c.sha or (len(label.sha) >= 7 and c.sha.startswith(label.sha))
            if same_repo and same_sha:
                found = c
                break
        if found is None:
            skipped.append(f"{label.checkpoint} ({label.task}/{label.metric}) in {label.source_ref or path}")
            continue
        matched.append(label.with_(checkpoint=found.name, family=found.family, repo=found.repo, sha=found.sha,
                                   lstar=None, lstar_se=None, raw_ce=None,
                                   source_ref=label.source_ref or str(path)))
    return matched, skipped


def run_campaign(campaign: Campaign, *, on_progress: Progress | None = None) -> CampaignResult:
    """Run every job of `campaign` that has no stored run yet, then (when all are done) fit,
    validate and write the curves and the report."""
    report = on_progress or (lambda stage, done, total, what: None)
    check_lm_eval_available(campaign)
    corpus = _corpus(campaign)
    plan = build_plan(campaign, corpus.sha256)
    out = campaign.output_dir
    out.mkdir(parents=True, exist_ok=True)
    result = CampaignResult(plan=plan, db=db_path(campaign))
    finished = 0
    with Store.open(db_path(campaign)) as store:
        mark_done(plan, store)
        _write_plan(out, campaign, plan, corpus.sha256)

        pending = plan.pending_scores
        total = len(plan.scores)
        report("score", total - len(pending), total, "")
        for work, outcome in score_checkpoints(campaign, pending, store):
            if isinstance(outcome, LstarError):
                result.failures.append(JobFailure("score", work.checkpoint.describe(), None, outcome.one_line()))
                continue
            with store.transaction() as conn:
                outcome.write(store, conn)
            store.checkpoint()
            run_id = str(outcome.run_row["run_id"])
            plan.score_done[work.key] = run_id
            result.ran_scores.append(run_id)
            report("score", len(plan.score_done), total, work.checkpoint.name)
            finished += 1
            _kill_after(finished)

        pending_evals = plan.pending_evals
        total = len(plan.evals)
        report("eval", total - len(pending_evals), total, "")
        by_checkpoint: dict[int, list[EvalWork]] = {}
        for work in pending_evals:
            by_checkpoint.setdefault(work.checkpoint.index, []).append(work)
        for works in by_checkpoint.values():
            try:  # one load for all of the checkpoint's tasks
                loaded = _load_for_eval(campaign, works[0])
                handle = load_tokenizer(loaded.model_dir)
            except LstarError as exc:
                result.failures.extend(JobFailure("eval", w.checkpoint.describe(), w.task_name, exc.one_line())
                                       for w in works)
                continue
            for work in works:
                try:
                    outcome = evaluate(campaign, work, loaded, handle)
                except LstarError as exc:
                    result.failures.append(JobFailure("eval", work.checkpoint.describe(), work.task_name,
                                                      exc.one_line()))
                    continue
                run_id = outcome.run["run_id"]
                store.record_labels(label_rows(outcome.labels, source_ref=run_id, eval_run_id=run_id),
                                    eval_run=outcome.run)
                plan.eval_done[work.key] = run_id
                result.ran_evals.append(run_id)
                report("eval", len(plan.eval_done), total, f"{work.checkpoint.name} · {work.task_name}")
                finished += 1
                _kill_after(finished)
            del loaded

        imports = [(i, t) for i, t in enumerate(campaign.tasks) if t.kind == "results"]
        for n, (i, task) in enumerate(imports, start=1):
            labels, skipped = _import_results(campaign, i, task, plan)
            result.skipped_results.extend(skipped)
            rows = [row for label in labels
                    for row in label_rows([label], source_ref=label.source_ref or str(task.results))]
            result.imported += store.record_labels(rows) if rows else 0
            report("import", n, len(imports), str(task.results))
        _write_plan(out, campaign, plan, corpus.sha256)
        if result.failures:
            return result
        result.outputs = write_outputs(campaign, plan, store, on_progress=report)
    return result


def _write_plan(out: Path, campaign: Campaign, plan: Plan, corpus_sha256: str) -> None:
    """OUTPUT/plan.json: every job, its key and (when done) its run id; rewritten atomically."""
    data = {"campaign": campaign.name, "corpus_sha256": corpus_sha256, **plan.as_dict()}
    tmp = out / f".plan.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / "plan.json")
