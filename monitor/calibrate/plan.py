"""The plan of a campaign and what of it is done.

The plan is one scoring job per checkpoint and one evaluation job per (checkpoint, evaluated
task); imported results files are read into labels beside them. The campaign's state is the
project's own tables in `OUTPUT/calibrate.duckdb` (`monitor.store.Store`): a score run or an
evaluation run is written in one transaction with everything it produced, and each carries
its job's key in its `model` object, so a job is done exactly when a row with its key is
stored. A killed campaign therefore resumes where it stopped, and a finished job is never run
again. The key covers everything that changes the job's result (checkpoint, corpus
selection, scoring or evaluation settings), so changing one of those runs the job anew.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.calibrate.campaign import Campaign, TaskSpec
from monitor.curves.evaluator import read_task_file
from monitor.errors import CampaignError, LabelError
from monitor.scoring.loader import checkpoint_hash
from monitor.store import Store
from monitor.store.rows import EvalRunRow

DB_NAME = "calibrate.duckdb"
# The job key's field in a stored run's `model` object.
KEY_FIELD = "calibrate_job"


def job_key(kind: str, **parts: Any) -> str:
    """sha256 (first 32 hex digits) of the canonical JSON of what decides a job's result."""
    blob = json.dumps({"kind": kind, **parts}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class CheckpointRef:
    """One reference checkpoint of the campaign, resolved to the (repo, sha) its runs record."""

    index: int
    name: str
    family: str
    ref: str
    repo: str             # Hub repo id, or the local folder's resolved path (as `lstar score` records it)
    sha: str              # the pinned commit, or the local folder's content hash
    source: str           # "hub" | "local"
    local_dir: Path | None

    def describe(self) -> str:
        return f"{self.name} ({self.ref})"


@dataclass(frozen=True)
class ScoreWork:
    """Score one checkpoint on the campaign's corpus selection."""

    checkpoint: CheckpointRef
    key: str


@dataclass(frozen=True)
class EvalWork:
    """Evaluate one checkpoint on one task (built-in evaluator or lm-evaluation-harness)."""

    checkpoint: CheckpointRef
    task: TaskSpec
    task_index: int
    task_name: str
    task_sha256: str
    key: str


@dataclass
class Plan:
    """Every job of a campaign, and which are still to run."""

    checkpoints: list[CheckpointRef]
    scores: list[ScoreWork]
    evals: list[EvalWork]
    score_done: dict[str, str] = field(default_factory=dict)    # job key -> score run id
    eval_done: dict[str, str] = field(default_factory=dict)     # job key -> eval run id

    @property
    def pending_scores(self) -> list[ScoreWork]:
        return [w for w in self.scores if w.key not in self.score_done]

    @property
    def pending_evals(self) -> list[EvalWork]:
        return [w for w in self.evals if w.key not in self.eval_done]

    def as_dict(self) -> dict[str, Any]:
        """The plan as written to `OUTPUT/plan.json`."""
        return {"checkpoints": [{"name": c.name, "family": c.family, "ref": c.ref, "repo": c.repo,
                                 "sha": c.sha, "source": c.source} for c in self.checkpoints],
                "scores": [{"checkpoint": w.checkpoint.name, "key": w.key,
                            "run_id": self.score_done.get(w.key)} for w in self.scores],
                "evals": [{"checkpoint": w.checkpoint.name, "task": w.task_name, "key": w.key,
                           "run_id": self.eval_done.get(w.key)} for w in self.evals]}


def resolve_checkpoints(campaign: Campaign) -> list[CheckpointRef]:
    """The campaign's checkpoints with the (repo, sha) their runs will record."""
    out = []
    for i, spec in enumerate(campaign.checkpoints):
        hub = spec.hub
        if hub is not None:
            out.append(CheckpointRef(i, campaign.checkpoint_name(i), spec.family, spec.ref, hub[0], hub[1],
                                     "hub", None))
            continue
        folder = campaign.path(spec.ref).resolve()
        out.append(CheckpointRef(i, campaign.checkpoint_name(i), spec.family, spec.ref, str(folder),
                                 checkpoint_hash(folder), "local", folder))
    return out


def scoring_settings(campaign: Campaign, corpus_sha256: str) -> dict[str, Any]:
    """What decides a score besides the checkpoint: the corpus selection and the spec."""
    s = campaign.scoring
    return {"corpus_sha256": corpus_sha256, "dtype": s.dtype, "device": s.device,
            "max_context": s.max_context, "stride": s.stride, "disjoint": s.disjoint,
            "with_tcb": s.with_tcb, "n_boot": s.n_boot}


def task_identity(campaign: Campaign, task: TaskSpec) -> tuple[str, str]:
    """(name, sha256) of an evaluated task: a built-in task is named by its file's stem and
    pinned by its bytes, read as the evaluation reads them (`read_task_file`: a regular file
    of at most 64 MiB, so a FIFO in its place is an error naming it, not a hang); an lm-eval
    task by its name and the installed harness's version."""
    if task.builtin is not None:
        path = campaign.path(task.builtin)
        try:
            raw = read_task_file(path)
        except LabelError as exc:
            raise CampaignError(exc.message, hint=exc.hint) from None
        return path.stem, hashlib.sha256(raw).hexdigest()
    assert task.lm_eval is not None
    try:
        harness = importlib.metadata.version("lm-eval")
    except importlib.metadata.PackageNotFoundError:
        harness = "not installed"   # such a campaign stops before any work (check_lm_eval_available)
    # Another harness version may define the task, its prompts or its metrics differently.
    digest = hashlib.sha256(f"lm_eval:{task.lm_eval}\nharness:{harness}\n".encode("utf-8"))
    if task.include is not None:
        # A task of one's own: its YAML and data files are part of what it measures.
        folder = campaign.path(task.include)
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(f"{file.relative_to(folder).as_posix()}\t".encode("utf-8"))
            digest.update(hashlib.sha256(file.read_bytes()).hexdigest().encode("ascii") + b"\n")
    return task.lm_eval, digest.hexdigest()


def build_plan(campaign: Campaign, corpus_sha256: str) -> Plan:
    """Every job of the campaign (nothing is run or written)."""
    checkpoints = resolve_checkpoints(campaign)
    settings = scoring_settings(campaign, corpus_sha256)
    scores = [ScoreWork(c, job_key("score", repo=c.repo, sha=c.sha, **settings)) for c in checkpoints]
    evals = []
    names: dict[str, int] = {}
    for t, task in enumerate(campaign.tasks):
        if task.kind == "results":
            continue
        name, sha = task_identity(campaign, task)
        if name in names:
            raise CampaignError(f"{campaign.label}: tasks[{t}]: task name {name!r} is also the name of "
                                f"tasks[{names[name]}]; rename one task file")
        names[name] = t
        for c in checkpoints:
            # lm-eval draws its few-shot examples with the campaign's seed and batches requests;
            # the built-in evaluator uses neither.
            harness = ({"seed": campaign.fit.seed, "batch_size": campaign.scoring.batch_size}
                       if task.kind == "lm_eval" else {})
            key = job_key("eval", repo=c.repo, sha=c.sha, task=name, task_sha256=sha, limit=task.limit,
                          num_fewshot=task.num_fewshot, dtype=campaign.scoring.dtype,
                          device=campaign.scoring.device, **harness)
            evals.append(EvalWork(c, task, t, name, sha, key))
    return Plan(checkpoints, scores, evals)


def mark_done(plan: Plan, store: Store) -> Plan:
    """Fill in which jobs already have a stored run (their keys in the runs' `model` object)."""
    for work in plan.scores:
        c = work.checkpoint
        for run in store.score_runs_for_checkpoint(c.repo, c.sha):
            if (run.model or {}).get(KEY_FIELD) == work.key:
                plan.score_done[work.key] = str(run.run_id)
                break
    evals_by_repo: dict[str, list[EvalRunRow]] = {}
    for work in plan.evals:
        c = work.checkpoint
        if c.repo not in evals_by_repo:
            evals_by_repo[c.repo] = store.eval_runs(model_repo=c.repo, limit=1_000_000)
        for run in evals_by_repo[c.repo]:
            if run.model_sha == c.sha and (run.model or {}).get(KEY_FIELD) == work.key:
                plan.eval_done[work.key] = str(run.run_id)
                break
    return plan


def db_path(campaign: Campaign) -> Path:
    """The campaign's state: a DuckDB file in its output folder."""
    return campaign.output_dir / DB_NAME
