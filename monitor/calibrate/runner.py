"""Run a campaign: score every checkpoint, evaluate it on every task, import results files,
then fit, validate and write the curves (`monitor.calibrate.outputs`).

This process is the only writer of the campaign's DuckDB file. Scoring fans out over the
scoring backend (`monitor.scoring.backends`: `local` child processes, or a Ray cluster);
evaluation runs here, on a checkpoint loaded once for all of its tasks. Every finished job is
written in one transaction with its rows, so a campaign killed at any point resumes with
exactly the jobs that have no stored run (`monitor.calibrate.plan`). A job that fails is
reported and the others go on; curves are fitted only when every job is done.

Crash tests stop the run with `LSTAR_FAILPOINT=calibrate_after_jobs=N`: SIGKILL right after
the N-th job this process finished was written.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from monitor.calibrate.campaign import Campaign, TaskSpec
from monitor.calibrate.evaluate import check_lm_eval_available, evaluate
from monitor.calibrate.manifest import prepare_output
from monitor.calibrate.outputs import CampaignOutputs, write_outputs
from monitor.calibrate.plan import KEY_FIELD, CheckpointRef, EvalWork, Plan, ScoreWork, build_plan, db_path, mark_done
from monitor.curves.labels import Label, label_rows, read_labels_csv, read_lm_eval_results
from monitor.errors import CampaignError, LstarError
from monitor.failpoints import failpoint, failpoint_values
from monitor.hub import LayoutError
from monitor.scoring import ScoredRun, ScoreRequest, default_memory_limit, load_checkpoint, load_corpus
from monitor.scoring.backends import ScoreJob, ScoringBackend, estimate_memory, make_backend
from monitor.scoring.backends.ray import INSTALL_HINT as RAY_INSTALL_HINT
from monitor.scoring.loader import download_hub_checkpoint
from monitor.scoring.precision import host_precision
from monitor.scoring.scoring_driver import materialize_snapshot
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
    """The `lstar score` request of one scoring job, every path absolute (a worker may run
    elsewhere); the model is set where the checkpoint is fetched."""
    s, c = campaign.scoring, campaign.corpus
    return ScoreRequest(model="", corpus_dir=campaign.path(c.dir).resolve(), max_context=s.max_context,
                        stride=s.stride, disjoint=s.disjoint, docs=c.docs, slices=c.slices, every=c.every,
                        dtype=s.dtype, device=s.device, batch_size=s.batch_size, with_tcb=s.with_tcb,
                        n_boot=s.n_boot, progress=False, extra_model_info={KEY_FIELD: work.key})


def _cache_dir(campaign: Campaign) -> Path | None:
    return campaign.path(campaign.hub.cache_dir) if campaign.hub.cache_dir else None


def _scratch(campaign: Campaign) -> Path:
    return campaign.output_dir / "tmp"


def score_job(campaign: Campaign, work: ScoreWork, store: Store, corpus_sha256: str) -> ScoreJob:
    """The backend job of one checkpoint: a local folder as it is, a Hub checkpoint fetched
    through the gate's verified download (pinned to the campaign's sha) and copied flat, as
    the daemon hands snapshots to its workers."""
    request = score_request(campaign, work)
    c = work.checkpoint
    if c.source == "local":
        model_dir = Path(str(c.local_dir))
        request = replace(request, model=str(model_dir))
    else:
        snapshot, _ = download_hub_checkpoint(c.repo, c.sha, _cache_dir(campaign), endpoint=campaign.hub.endpoint)
        model_dir = materialize_snapshot(snapshot, _scratch(campaign) / f"checkpoint-{work.key}")
        request = replace(request, model=str(model_dir),
                          extra_model_info={**request.extra_model_info, "repo": c.repo, "sha": c.sha,
                                            "source": "hub", "files_sha256_dir": str(snapshot)})
    # The local backend loads on this machine: estimate in the precision `auto` resolves to here.
    here = host_precision(request.dtype, request.device) if campaign.scoring.backend == "local" else request
    try:
        memory = estimate_memory(model_dir, dtype=here.dtype, device=here.device)
    except (LayoutError, OSError):
        memory = None  # the loader refuses such a checkpoint with the reason
    return ScoreJob(checkpoint_id=None, repo=c.repo, sha=c.sha, request=request, corpus_sha256=corpus_sha256,
                    memory_bytes=memory, baselines=tuple(store.baselines_for_corpus(corpus_sha256)), key=work.key)


def make_campaign_backend(campaign: Campaign, jobs: int = 2) -> ScoringBackend:
    """The campaign's scoring backend (`scoring.backend`) for `jobs` score jobs, configured as
    the daemon configures it."""
    s = campaign.scoring
    memory = default_memory_limit(s.device)
    if s.backend == "local":
        # Several jobs: one warm scoring worker, as the daemon's default (`--scoring-workers
        # 1`), so torch and transformers are imported once for the campaign, not once per
        # checkpoint (about 5 CPU-seconds each); a warm worker scores exactly what a fresh
        # child does. One job: a fresh child, which imports them only if the checkpoint gets
        # as far as loading (a warm worker imports them before it takes the job).
        return make_backend("local", workers=1 if jobs > 1 else 0, memory_bytes=memory,
                            workdir=_scratch(campaign), log_path=campaign.output_dir / "scoring.log")
    try:  # an address-space limit breaks CUDA's start-up; on a CPU job it still bounds the child
        return make_backend("ray", address=s.ray_address, memory_bytes=memory if s.device == "cpu" else None)
    except CampaignError:
        raise
    except LstarError as exc:
        raise CampaignError(f"{campaign.label}: scoring.backend: ray: {exc.one_line()}") from None


def score_checkpoints(campaign: Campaign, works: list[ScoreWork], store: Store,
                      corpus_sha256: str) -> Iterator[tuple[ScoreWork, ScoredRun | LstarError]]:
    """Score each job on the campaign's backend; yields (job, its rows or the error that
    stopped it) as each finishes, in whatever order the backend finishes them."""
    if not works:
        return
    by_key = {w.key: w for w in works}
    jobs = []
    for work in works:
        try:
            jobs.append(score_job(campaign, work, store, corpus_sha256))
        except LstarError as exc:  # a Hub checkpoint that cannot be fetched
            yield work, exc
    backend = make_campaign_backend(campaign, len(jobs))
    try:
        for outcome in backend.run(jobs):
            work = by_key[outcome.job.key]
            if outcome.job.request.model.startswith(str(_scratch(campaign))):
                shutil.rmtree(outcome.job.request.model, ignore_errors=True)
            if outcome.scored is not None:
                yield work, outcome.scored
                continue
            error = outcome.error.exception() if outcome.error is not None else None
            yield work, error if isinstance(error, LstarError) else CampaignError(
                f"scoring {work.checkpoint.describe()} failed: {outcome.error.message if outcome.error else '?'}")
    finally:
        backend.close()


def _check_ray_available(campaign: Campaign) -> None:
    """Fail before any work when the campaign asks for Ray and it is not installed."""
    if campaign.scoring.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise CampaignError(f"{campaign.label}: scoring.backend: 'ray' needs the ray package, which is not "
                            "installed", hint=RAY_INSTALL_HINT)


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
        found, why = _match_checkpoint(label, plan.checkpoints)
        if found is None:
            skipped.append(f"{label.checkpoint} ({label.task}/{label.metric}) in {label.source_ref or path}: {why}")
            continue
        matched.append(label.with_(checkpoint=found.name, family=found.family, repo=found.repo, sha=found.sha,
                                   lstar=None, lstar_se=None, raw_ce=None,
                                   source_ref=label.source_ref or str(path)))
    return matched, skipped


def _match_checkpoint(label: Label, checkpoints: Sequence[CheckpointRef]) -> tuple[CheckpointRef | None, str]:
    """The campaign checkpoint an imported label is of, or None and why.

    A label naming a campaign checkpoint by its name is that checkpoint. Otherwise its repo
    must match, and its sha (in full, or a prefix of at least 7 hex digits) picks the commit;
    a label without a sha (lm-eval results that record only a branch such as `step1000`)
    matches only when the campaign holds one checkpoint of that repo, since a revision name
    cannot be told apart from another commit of the same repo.
    """
    named = [c for c in checkpoints if label.checkpoint == c.name]
    if len(named) == 1:
        return named[0], ""
    repo = label.repo or label.checkpoint
    same_repo = [c for c in checkpoints if repo in (c.repo, c.ref)]
    if not same_repo:
        return None, "no campaign checkpoint has this repo or name"
    if label.sha is not None:
        sha = label.sha.lower()
        hits = [c for c in same_repo if c.sha == sha or (len(sha) >= 7 and c.sha.startswith(sha))]
        if len(hits) == 1:
            return hits[0], ""
        return None, (f"commit {label.sha} is not one of the campaign's checkpoints of {repo}" if not hits
                      else f"commit prefix {label.sha} matches {len(hits)} checkpoints; give the full sha")
    if len(same_repo) == 1:
        return same_repo[0], ""
    return None, (f"no commit sha, and the campaign has {len(same_repo)} checkpoints of {repo} "
                  f"({', '.join(c.name for c in same_repo)}); give the results their sha, or name a "
                  f"checkpoint {label.checkpoint!r}")


def run_campaign(campaign: Campaign, *, on_progress: Progress | None = None) -> CampaignResult:
    """Run every job of `campaign` that has no stored run yet, then (when all are done) fit,
    validate and write the curves and the report."""
    report = on_progress or (lambda stage, done, total, what: None)
    check_lm_eval_available(campaign)
    _check_ray_available(campaign)
    corpus = _corpus(campaign)
    plan = build_plan(campaign, corpus.sha256)
    out = campaign.output_dir
    prepare_output(out)   # the real folder checked at load, nothing swapped for a link since
    result = CampaignResult(plan=plan, db=db_path(campaign))
    finished = 0
    with Store.open(db_path(campaign)) as store:
        mark_done(plan, store)
        _write_plan(out, campaign, plan, corpus.sha256)

        pending = plan.pending_scores
        total = len(plan.scores)
        report("score", total - len(pending), total, "")
        for work, outcome in score_checkpoints(campaign, pending, store, corpus.sha256):
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
            result.imported += store.replace_imported_labels([str(campaign.path(str(task.results)))], rows)
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
