"""The observe job: schedule the evaluations new predictions call for (within each policy's
daily budget), run the queued ones in bounded child processes, and follow each curve's track
record (`monitor.alerts.observations`); an observation row moves `pending → done` (or `failed`
with the reason, or back to `pending`), and a done one may raise a confirmation or
contradiction alert.

Driving the evaluation queue: lease an observation job, fetch its checkpoint verified,
run the task in a bounded child process, and write the result with the lease's completion.

Like scoring (`monitor.scoring.scoring_driver`): the child never opens the database; the
result, the evaluation run, and the confirmation or contradiction alert are written in the
transaction that completes the lease, so a job completes (and alerts) exactly once. A job
whose content (weights digest, task file sha256, evaluator settings) was evaluated before is
not run again: its result is copied from that observation (`linked_from`) and judged
against its own prediction. Errors are classified as the checkpoint queue does: an integrity,
gate, model-load, spec, corpus, tokenizer or label error fails the job at once; the Hub being
down or the daemon stopping gives the lease and the attempt back; anything else (a timeout,
running out of memory, a crash) gives the lease back, and the job fails after
`max_attempts` attempts in all.

The daemon's "evaluate" job is another one (`monitor.jobs.evaluate`: scores judged into
predictions); this one evaluates the models the predictions were about.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TYPE_CHECKING

from monitor.alerts.observations import content_digest, observation_alert, observation_fields
from monitor.alerts.task_files import TaskFileNotAsScheduled, task_file_as_scheduled
from monitor.errors import HubError, LabelError, LstarError
from monitor.events import event
from monitor.hub.fetch import fetch_verified
from monitor.hub.queue import PERMANENT_ERRORS, SKIP_ERRORS
from monitor.policy import Policy
from monitor.jobs.context import JobContext
from monitor.scoring.scoring_driver import materialize_snapshot, resolved_precision
from monitor.store import utcnow

log = logging.getLogger("lstar.observe")
MAX_ATTEMPTS = 3

if TYPE_CHECKING:
    from collections.abc import Mapping
    from datetime import date

    from monitor.store.rows import HubStateRow


class ObserveStore(Protocol):
    """What the evaluation queue reads and writes (`schedule_observations`, `check_calibration`
    and the lease of each observation here)."""

    def checkpoint(self) -> None: ...
    def claim_observation(self, owner: str, *, now: datetime, lease_s: float, max_attempts: int,
                          exclude: Sequence[int] = ()) -> dict[str, Any] | None: ...
    def close_hub_outage(self, endpoint: str, *, now: datetime) -> None: ...
    def complete_observation(self, obs_id: int, owner: str, *, status: str, now: datetime,
                             fields: Mapping[str, Any] | None = None, reason: str | None = None,
                             eval_run: Mapping[str, Any] | None = None,
                             alerts: Sequence[Mapping[str, Any]] = ()) -> bool: ...
    def end_miscalibration(self, episode_id: int, *, now: datetime) -> None: ...
    def get_hub_state(self, endpoint: str) -> HubStateRow | None: ...
    def observation_candidates(self, policy: str, task: str, states: Sequence[str], *, since: datetime,
                               derivatives_only: bool = False) -> list[dict[str, Any]]: ...
    def observation_with_digest(self, digest: str) -> dict[str, Any] | None: ...
    def observations_started_on(self, policy: str, day: date) -> int: ...
    def open_hub_outage(self, endpoint: str, *, now: datetime, failures: int, error: str | None) -> int: ...
    def open_miscalibration(self, policy: str, curve_id: str) -> dict[str, Any] | None: ...
    def put_hub_state(self, endpoint: str, state: Mapping[str, Any], *, now: datetime) -> None: ...
    def raise_operator_alerts(self, alerts: Sequence[Mapping[str, Any]], *, now: datetime,
                              hub_outage_id: int | None = None, evaluation_gap_id: int | None = None,
                              miscalibration_id: int | None = None) -> int: ...
    def release_observation(self, obs_id: int, owner: str, reason: str, *, now: datetime,
                            refund: bool = False) -> bool: ...
    def schedule_observation(self, row: Mapping[str, Any], *, now: datetime) -> bool: ...
    def set_observation_digest(self, obs_id: int, owner: str, digest: str, *, now: datetime) -> bool: ...
    def start_miscalibration(self, policy: str, curve_id: str, detail: Mapping[str, Any], *,
                             now: datetime) -> int: ...
    def supersede_observations(self, policy: str, task: str, settings: Mapping[str, Any], *, file: str,
                               now: datetime) -> list[tuple[int, int]]: ...
    def track_record(self, policy: str | None = None) -> list[dict[str, Any]]: ...


def _reason(exc: BaseException) -> str:
    if isinstance(exc, LstarError):
        return exc.one_line()
    text = " ".join(str(exc).split())[:400]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_observations(store: ObserveStore, policies: Sequence[Policy], *, owner: str, state_dir: Path,
                     client: Any = None, cache_dir: Path | None = None, timeout_s: float = 3600.0,
                     memory_bytes: int | None = None, lease_s: float = 4200.0, limit: int | None = None,
                     device: str = "cpu", dtype: str = "float32", ray: Any = None, template: Any = None,
                     now_fn: Callable[[], datetime] = utcnow,
                     stopping: Callable[[], bool] | None = None) -> list[dict[str, Any]]:
    """Run pending evaluation jobs until none is left (or `limit` ran, or the daemon stops);
    what happened to each. With `ray` (the daemon's `RayBackend`) each runs as a Ray task on
    the cluster, else in a child process here, forked from `template` when there is one (the
    warm pool's template process, or a function that gives it, asked when an evaluation runs)."""
    by_name = {p.name: p for p in policies}
    done: list[dict[str, Any]] = []
    tried: list[int] = []
    while limit is None or len(done) < limit:
        if stopping is not None and stopping():
            break
        job = store.claim_observation(owner, now=now_fn(), lease_s=lease_s, max_attempts=MAX_ATTEMPTS,
                                      exclude=tried)
        if job is None:
            break
        tried.append(int(job["id"]))
        outcome = _run_one(store, job, by_name.get(job["policy"]), owner=owner, state_dir=state_dir,
                           client=client, cache_dir=cache_dir, timeout_s=timeout_s, memory_bytes=memory_bytes,
                           device=device, dtype=dtype, ray=ray, template=template, now_fn=now_fn)
        done.append(outcome)
        if outcome.get("hub_down"):
            break
    return done


def _run_one(store: ObserveStore, job: dict[str, Any], policy: Policy | None, *, owner: str, state_dir: Path,
             client: Any, cache_dir: Path | None, timeout_s: float, memory_bytes: int | None,
             device: str, dtype: str, ray: Any, template: Any,
             now_fn: Callable[[], datetime]) -> dict[str, Any]:
    ids = {"observation": job["id"], "policy": job["policy"], "task": job["task"], "repo": job["repo"],
           "commit": job["commit_sha"], "attempt": job["attempts"]}
    settings = job["settings"]
    workdir = state_dir / "tmp" / f"eval-{job['id']}-{uuid.uuid4().hex[:8]}"
    try:
        # first, as it costs no download: the child evaluates a copy of the bytes checked
        # against the job's fingerprint, and a job whose file is not as scheduled waits
        task_file = (str(task_file_as_scheduled(settings, workdir)) if settings["kind"] == "multiple_choice"
                     else None)
        snapshot, digests = fetch_verified(job["repo"], job["commit_sha"], cache_dir=cache_dir, client=client)
        # the evaluator's settings include where and in which precision it runs
        # `auto` left unresolved (workers elsewhere, e.g. Ray GPUs): no digest, never linked
        digest = (None if "auto" in (device, dtype) else
                  content_digest(digests.get("weights_digest"), {**settings, "device": device, "dtype": dtype}))
        if digest is not None:
            store.set_observation_digest(job["id"], owner, digest, now=now_fn())
        source = store.observation_with_digest(digest) if digest is not None else None
        if source is not None:
            value, n, k = float(source["observed"]), int(source["n"]), int(source["k"])
            eval_run, extra = None, {"linked_from": int(source["id"]), "eval_run_id": source["eval_run_id"]}
        else:
            value, n, k, eval_run, extra = _evaluate(job, ids, snapshot, digests, task_file, workdir,
                                                     state_dir=state_dir, timeout_s=timeout_s,
                                                     memory_bytes=memory_bytes, device=device, dtype=dtype, ray=ray,
                                                     template=template)
    except Exception as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        return _not_observed(store, job, ids, exc, owner=owner, now_fn=now_fn)
    shutil.rmtree(workdir, ignore_errors=True)
    return _record_observation(store, job, policy, ids, value, n, k, eval_run, extra, owner=owner, now_fn=now_fn)


def _evaluate(job: dict[str, Any], ids: dict[str, Any], snapshot: Path, digests: dict[str, Any],
              task_file: str | None, workdir: Path, *, state_dir: Path, timeout_s: float,
              memory_bytes: int | None, device: str, dtype: str, ray: Any,
              template: Any) -> tuple[float, int, int, dict[str, Any], dict[str, Any]]:
    """Evaluate the checkpoint here in a child process (or on a Ray node): the observed value,
    n, k, the evaluation run to record, and the fields that name it."""
    from monitor.curves.eval_child import EvalSpec, run_evaluation_child

    settings = job["settings"]
    model_dir = materialize_snapshot(snapshot, workdir / "model")
    event("observation_started", **ids, kind=settings["kind"])
    spec = EvalSpec(model_dir=str(model_dir), kind=settings["kind"], metric=settings["metric"],
                    file=task_file, task=settings.get("task"), device=device, dtype=dtype)
    if ray is not None:   # `--scoring-backend ray`: on a node of the cluster, like a score
        from monitor.curves.eval_child import evaluate_on_ray

        result = evaluate_on_ray(ray, spec, timeout_s=timeout_s, memory_bytes=memory_bytes,
                                 workdir=state_dir / "tmp")
    else:
        if callable(template):   # the pool's template, asked for now that an evaluation runs here
            template = _pool_template(template)
        result = run_evaluation_child(spec, timeout_s=timeout_s, memory_bytes=memory_bytes,
                                      workdir=state_dir / "tmp", log_path=state_dir / "scoring.log",
                                      template=template)
    if settings.get("task_sha256") and result.get("task_sha256") not in (None, settings["task_sha256"]):
        # cannot happen with the verified copy; were it to, the job waits, not fails
        raise TaskFileNotAsScheduled(f"the evaluation of task file {settings['file']} read sha256 "
                                     f"{str(result['task_sha256'])[:12]}, not the "
                                     f"{settings['task_sha256'][:12]} it was scheduled with")
    value, n, k = float(result["value"]), int(result["n"]), int(result["k"])
    run_id = f"eval-{uuid.uuid4().hex[:16]}"
    eval_run = {"run_id": run_id, "model_repo": job["repo"], "model_sha": job["commit_sha"],
                "task": settings.get("task") or job["task"], "task_sha256": result.get("task_sha256"),
                "n_items": n, "tokenizer_fingerprint": result["tokenizer_fingerprint"],
                "dtype": result["dtype"], "device": result["device"], "metrics": result["metrics"],
                "model": {**(result.get("model") or {}), "observation_id": job["id"],
                          "weights_digest": digests.get("weights_digest"), "threads": result.get("threads")},
                "wall_s": result["wall_s"]}
    return value, n, k, eval_run, {"eval_run_id": run_id}


def _not_observed(store: ObserveStore, job: dict[str, Any], ids: dict[str, Any], exc: Exception, *, owner: str,
                  now_fn: Callable[[], datetime]) -> dict[str, Any]:
    """What an evaluation that raised does to its job, decided by the error (first match wins):
    a task file not as scheduled waits without using an attempt; a permanent or skipping error
    fails it; the Hub down waits and stops the run; anything else is retried (attempts decide)."""
    if isinstance(exc, TaskFileNotAsScheduled):   # waits, pending, without using an attempt
        store.release_observation(job["id"], owner, f"waiting for its task file: {_reason(exc)}", now=now_fn(),
                                  refund=True)
        event("observation_waiting", **ids, reason=_reason(exc))
        return {**ids, "status": "pending", "reason": _reason(exc), "waiting": True}
    if isinstance(exc, SKIP_ERRORS + PERMANENT_ERRORS + (LabelError,)):
        held = store.complete_observation(job["id"], owner, status="failed", reason=_reason(exc), now=now_fn())
        event("observation_failed", **ids, reason=_reason(exc))
        return {**ids, "status": "failed", "reason": _reason(exc), "lease_lost": not held}
    if isinstance(exc, HubError):
        store.release_observation(job["id"], owner, f"waiting for the Hub: {_reason(exc)}", now=now_fn(), refund=True)
        return {**ids, "status": "pending", "reason": _reason(exc), "hub_down": True}
    # retryable: the lease goes back, attempts decide
    interrupted = type(exc).__name__ == "ScoringInterrupted"
    store.release_observation(job["id"], owner, _reason(exc), now=now_fn(), refund=interrupted)
    log.warning("evaluation %s (attempt %d) failed: %s", job["id"], job["attempts"], _reason(exc))
    return {**ids, "status": "pending", "reason": _reason(exc)}


def _record_observation(store: ObserveStore, job: dict[str, Any], policy: Policy | None, ids: dict[str, Any],
                        value: float, n: int, k: int, eval_run: dict[str, Any] | None, extra: dict[str, Any], *,
                        owner: str, now_fn: Callable[[], datetime]) -> dict[str, Any]:
    """Complete the job with its observation and the policy's alert on it, in one write."""
    now = now_fn()
    fields = {**observation_fields(job, value, n, k), **extra}
    alert = observation_alert(policy, job, fields, now=now) if policy is not None else None
    held = store.complete_observation(job["id"], owner, status="done", now=now, fields=fields, eval_run=eval_run,
                                      alerts=[alert.as_row()] if alert is not None else [])
    if held:
        event("observed", **ids, observed=value, n=n, lo=fields["observed_lo"], hi=fields["observed_hi"],
              predicted=job["predicted_state"], state=fields["observed_state"], verdict=fields["verdict"],
              linked_from=extra.get("linked_from"))
    return {**ids, "status": "done" if held else "lease_lost", "observed_state": fields["observed_state"],
            "verdict": fields["verdict"], "alerts": 1 if held and alert is not None else 0,
            "linked_from": extra.get("linked_from")}


def _pool_template(give: Callable[[], Any]) -> Any:
    """The pool's template from `give()`, or None (the evaluation starts a child of its own)
    when the pool fails to give one: a fault of the scoring pool (a thread it cannot start, a
    template that cannot fork) must not cost the evaluation an attempt it could run cold. The
    shutdown's interruption passes through: the attempt is given back."""
    try:
        return give()
    except Exception as exc:
        if type(exc).__name__ == "ScoringInterrupted":
            raise
        log.warning("the scoring pool gave no template for an evaluation (%s: %s); it starts a child of its own",
                    type(exc).__name__, exc)
        return None


def _evaluation_template(ctx: JobContext) -> Any:
    """What gives the warm scoring pool's template process (it imported torch once) when an
    evaluation is about to run, or None: evaluations are forked from it instead of importing
    torch in a new child. Asked for only then, as it starts the pool's template when none runs
    (in the pool's slot threads: a template dies with the thread that started it, and a slot
    thread lives as long as the pool)."""
    if ctx.config.scoring_backend == "ray":
        return None
    start = getattr(ctx.scoring_backend(), "evaluation_template", None)
    return start if callable(start) else None


def log_new_task_file_problems(ctx: JobContext, checks: Any) -> list[str]:
    """Log each task-file problem when it appears (an error line naming the file and the
    fix) and when it is mended; returns the problems of this tick."""
    problems = [c.problem for c in checks if c.problem is not None]
    seen = ctx.job_memory.get("task_file_problems", [])
    for problem in problems:
        if problem not in seen:
            log.error("%s", problem)
    if seen and not problems:
        log.info("every task file is usable again")
    ctx.job_memory["task_file_problems"] = problems
    return problems


def run(ctx: JobContext) -> dict[str, Any]:
    """Schedule, run and check the evaluations; asks for a dispatch when one raised an alert
    or a curve's track record calls for one."""
    from monitor.alerts.observations import check_calibration, schedule_observations
    from monitor.alerts.task_files import check_task_files

    cfg = ctx.config
    policies = ctx.policies()
    # Each task file read bounded and compared with its policy's fingerprint (a FIFO or a
    # huge file in its place is refused at once; a changed one is taken on or waits).
    task_files = check_task_files(policies)
    problems = log_new_task_file_problems(ctx, task_files.values())
    with ctx.job_store() as store:
        scheduled = schedule_observations(store, policies, now=utcnow(), task_files=task_files)
        # The precision the evaluation runs in, resolved as scoring's is (never the word
        # `auto`, which differs between hosts): it is part of the dedupe digest.
        here = resolved_precision(cfg.template, workers_here=cfg.scoring_backend != "ray")
        ran = run_observations(store, policies, owner=ctx.owner, state_dir=cfg.state_dir,
                               client=ctx.hub_client(store), cache_dir=cfg.cache_dir,
                               timeout_s=cfg.score_timeout, memory_bytes=cfg.score_memory,
                               lease_s=cfg.lease_s, device=here.device, dtype=here.dtype,
                               ray=ctx.scoring_backend() if cfg.scoring_backend == "ray" else None,
                               template=_evaluation_template(ctx),
                               stopping=ctx.stopping.is_set)
        miscalibrated = check_calibration(store, policies, now=utcnow())
        if ran:
            store.checkpoint()
    if miscalibrated or any(r.get("alerts") for r in ran):
        ctx.nudge("dispatch")
    return {**scheduled, "ran": ran, "miscalibration_deliveries": miscalibrated, "task_file_problems": problems}


__all__ = ["MAX_ATTEMPTS", "ObserveStore", "log_new_task_file_problems", "run", "run_observations"]
