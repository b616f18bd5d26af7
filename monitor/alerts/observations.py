"""Checking predictions by running the task: scheduling active evaluations within a policy's
budget, the alert an observation raises, and the curves' track records.

Scheduling (`schedule_observations`): every prediction of a task with `evaluate:` whose state
is in its `on` list, made in the last 7 days (`LOOKBACK`: enabling `evaluate:` on a task with
a long history does not fill the day's budget with old checkpoints), gets one observation row: `pending` (a job for the evaluation queue)
while the policy's budget for the UTC day (`evaluations.per_day`) lasts, else `skipped` with
the reason `budget`. The rows are unique per (policy, task, score run, generation): a
prediction is checked at most once, under the task file its policy validated
(`monitor.alerts.task_files`); an evaluation whose task file changed before it ran is
superseded by one of the next generation under the new file, which takes its place in the
budget.

An observation (`observation_fields`) has a Clopper-Pearson interval at the curve's
confidence (`monitor.curves.observe`), an observed state against the level b + ε in force
for the prediction, and a verdict: `contradicted` when the observed interval lies wholly on
the other side of the level from the predicted interval, else `confirmed`. Its alert
(`observation_alert`, kind `observe`) goes through the policy's routing tree with the
alertname `LstarPredictionContradicted` or `LstarPredictionConfirmed` and both states as
labels (`predicted_state`, `observed_state`; `state` is the observed one, which supersedes the
predicted one for that checkpoint). It is written with the job's completion, so it is raised
once however often the job is retried.

Track record (`check_calibration`): per (policy, curve), the checked predictions, the share
whose observation fell inside the predicted interval, and the one-sided binomial test against
the curve's confidence. A curve significantly below it opens an episode that raises
`LstarCurveMiscalibrated` once; the episode ends when the test no longer rejects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from monitor.alerts.model import Alert, Delivery, operator_alert
from monitor.alerts.rules import group_key, group_labels, route_alert
from monitor.alerts.task_files import TaskFileCheck, check_task_file, check_task_files
from monitor.curves.observe import (INTERVAL_METHOD, clopper_pearson, coverage, inside, observed_state,
                                    predictive_interval,
                                    verdict)
from monitor.events import event
from monitor.policy import Policy
from monitor.policy.vocabulary import CONFIRMED_ALERTNAME, CONTRADICTED_ALERTNAME, MISCALIBRATED_ALERTNAME
from monitor.store import Store

BUDGET = "budget"
# Predictions older than this when first seen (made before the task had `evaluate:`, or while
# the daemon could not schedule) are not evaluated: the budget goes to current checkpoints.
LOOKBACK = timedelta(days=7)
SEVERITY = {"contradicted": "critical", "confirmed": "info"}


def evaluation_settings(policy: Policy, task: Any, check: TaskFileCheck | None = None) -> dict[str, Any]:
    """What an evaluation of `task` runs, with the task file's sha256 (part of the job's
    content digest): for a multiple-choice task, the file as `check` (by default a fresh
    `check_task_file`) found it; its sha256 is None while the file cannot be used."""
    ev = task.evaluate
    if ev.kind == "multiple_choice":
        return (check or check_task_file(policy, task)).settings(task)
    return {"kind": ev.kind, "metric": ev.metric, "task": ev.task, "task_sha256": None}


def schedule_observations(store: Store, policies: Sequence[Policy], *, now: datetime,
                          task_files: Mapping[tuple[str, str], TaskFileCheck] | None = None) -> dict[str, int]:
    """Give every prediction that calls for an evaluation its observation row: pending within
    the policy's budget for today (UTC), else skipped with the reason `budget`.

    Multiple-choice tasks go by `task_files` (by default `check_task_files(policies)`, which
    reads each file bounded): a task whose file cannot be used schedules nothing, and the
    evaluations of a task whose file changed that have not run are superseded by ones of the
    new file (`superseded` counts them)."""
    counts = {"scheduled": 0, "skipped_budget": 0, "superseded": 0}
    task_files = check_task_files(policies) if task_files is None else task_files
    day = now.date()
    for policy in policies:
        tasks = [t for t in policy.tasks if t.evaluate is not None]
        if not tasks:
            continue
        started = store.observations_started_on(policy.name, day)
        for task in tasks:
            check = task_files.get((policy.name, task.name))
            if task.evaluate.kind == "multiple_choice" and (check is None or check.sha256 is None):
                continue   # the file cannot be used now: its evaluations wait (check.problem says why)
            settings = evaluation_settings(policy, task, check)
            if check is not None:
                for old, new in store.supersede_observations(policy.name, task.name, settings, file=str(check.path),
                                                             now=now):
                    counts["superseded"] += 1
                    event("observation_superseded", policy=policy.name, task=task.name, observation=old, by=new,
                          task_sha256=str(settings["task_sha256"])[:12])
            candidates = store.observation_candidates(policy.name, task.name, list(task.evaluate.on),
                                                      since=now - LOOKBACK)
            if task.derivatives == "evaluate":  # every derivative, whatever its predicted state
                seen = {p["prediction_id"] for p in candidates}
                candidates += [p for p in store.observation_candidates(
                    policy.name, task.name, ["clear", "at_risk", "emerged"], since=now - LOOKBACK,
                    derivatives_only=True) if p["prediction_id"] not in seen]
            for p in candidates:
                within = started < policy.evaluations.per_day
                row = {"policy": policy.name, "task": task.name, "run_id": p["run_id"],
                       "prediction_id": p["prediction_id"], "checkpoint_id": p["checkpoint_id"],
                       "repo": p["repo"], "commit_sha": p["commit_sha"], "lineage": p["lineage"],
                       "curve_id": p["curve_id"], "predicted_state": p["state"], "predicted_lo": p["lo"],
                       "predicted_hi": p["hi"], "predicted_p": p["p_hat"], "level": p["threshold"],
                       "confidence": float(p["detail"].get("confidence") or 0.9), "settings": settings,
                       "status": "pending" if within else "skipped", "reason": None if within else BUDGET,
                       "scheduled_day": day}
                if not store.schedule_observation(row, now=now):
                    continue
                ids = {"policy": policy.name, "task": task.name, "repo": p["repo"], "commit": p["commit_sha"]}
                if within:
                    started += 1
                    counts["scheduled"] += 1
                    event("observation_scheduled", **ids, predicted=p["state"])
                else:
                    counts["skipped_budget"] += 1
                    event("observation_skipped", **ids, reason=BUDGET,
                          detail=f"{policy.evaluations.per_day} evaluation(s) a day already started on {day}")
    return counts


def content_digest(weights_digest: str | None, settings: Mapping[str, Any]) -> str | None:
    """The digest that dedupes evaluations: the weights, the task file, the evaluator settings."""
    if not weights_digest:
        return None
    blob = json.dumps({"weights": weights_digest, "task_sha256": settings.get("task_sha256"),
                       "settings": {k: v for k, v in settings.items() if k != "file"}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def observation_fields(job: Mapping[str, Any], value: float, n: int, k: int) -> dict[str, Any]:
    """The result columns of an observation of `job` (its prediction's interval and level):
    the observed value, its interval, observed state, verdict and coverage."""
    lo, hi = clopper_pearson(int(k), int(n), float(job["confidence"]))
    level = float(job["level"])
    return {"observed": float(value), "n": int(n), "k": int(k), "observed_lo": lo, "observed_hi": hi,
            "interval_method": INTERVAL_METHOD, "observed_state": observed_state(lo, hi, level),
            "verdict": verdict(float(job["predicted_lo"]), float(job["predicted_hi"]), lo, hi, level),
            # covered: inside the predicted interval widened by the observation's own sampling noise
            "inside": inside(float(value), *predictive_interval(
                float(job["predicted_p"]), float(job["predicted_lo"]), float(job["predicted_hi"]), int(n),
                float(job["confidence"])))}


def observation_alert(policy: Policy, job: Mapping[str, Any], fields: Mapping[str, Any], *,
                      now: datetime) -> Alert | None:
    """The confirmation or contradiction alert of one observation (None when no route takes it)."""
    task = next((t for t in policy.tasks if t.name == job["task"]), None)
    contradicted = fields["verdict"] == "contradicted"
    labels = {**policy.labels, **(task.labels if task is not None else {}),
              "alertname": CONTRADICTED_ALERTNAME if contradicted else CONFIRMED_ALERTNAME,
              "policy": policy.name, "task": job["task"], "repo": job["repo"], "lineage": job["lineage"],
              "commit": job["commit_sha"], "state": fields["observed_state"],
              "predicted_state": job["predicted_state"], "observed_state": fields["observed_state"],
              "verdict": fields["verdict"], "severity": SEVERITY[fields["verdict"]]}
    deliveries = []
    for target in route_alert(policy.route, labels):
        grouped = group_labels(labels, target.group_by)
        deliveries.append(Delivery(receiver=target.receiver, group_key=group_key(policy.name, target.receiver, grouped),
                                   group_labels=grouped, group_wait_s=target.group_wait.total_seconds(),
                                   group_interval_s=target.group_interval.total_seconds()))
    if not deliveries:
        return None
    short = job["commit_sha"][:12]
    numbers = {"kind": "observation", "task": job["task"], "repo": job["repo"], "commit": job["commit_sha"],
               "curve_id": job["curve_id"], "predicted_state": job["predicted_state"],
               "predicted_lo": job["predicted_lo"], "predicted_hi": job["predicted_hi"],
               "predicted_p": job["predicted_p"], "level": job["level"], "confidence": job["confidence"],
               **{k: fields[k] for k in ("observed", "n", "k", "observed_lo", "observed_hi", "interval_method",
                                         "observed_state", "verdict", "inside")}}
    summary = (f"task {job['task']} on {job['repo']}@{short}: the observation "
               f"{'CONTRADICTS' if contradicted else 'confirms'} the prediction ({job['predicted_state']} -> "
               f"{fields['observed_state']})")
    description = (f"predicted interval [{job['predicted_lo']:.3f}, {job['predicted_hi']:.3f}]; observed "
                   f"{fields['observed']:.3f} ({fields['k']}/{fields['n']}), {job['confidence']:g} "
                   f"{INTERVAL_METHOD} interval [{fields['observed_lo']:.3f}, {fields['observed_hi']:.3f}]; "
                   f"level b + eps = {job['level']:.3f}")
    key = "|".join((policy.name, job["task"], job["repo"], job["commit_sha"], "observation"))
    return Alert(alert_key=key, kind="observe", policy=policy.name, task=job["task"], repo=job["repo"],
                 commit_sha=job["commit_sha"], lineage=job["lineage"], state=fields["observed_state"],
                 status="firing", labels=labels, annotations={"summary": summary, "description": description},
                 numbers=numbers, starts_at=now, created_at=now, deliveries=tuple(deliveries))


def track_records(store: Store, policy: str | None = None) -> list[dict[str, Any]]:
    """Per (policy, curve): predictions checked, covered (observation inside the predicted
    interval), contradictions, and the coverage test against the curve's confidence."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in store.track_record(policy):
        groups.setdefault((row["policy"], row["curve_id"]), []).append(row)
    out = []
    for (pol, curve_id), rows in sorted(groups.items()):
        nominal = float(rows[0]["confidence"])
        cov = coverage(len(rows), sum(1 for r in rows if r["inside"]),
                       sum(1 for r in rows if r["verdict"] == "contradicted"), nominal)
        out.append({"policy": pol, "curve_id": curve_id, "task": rows[0]["task"], **cov.as_dict(),
                    "checks": rows})
    return out


def check_calibration(store: Store, policies: Sequence[Policy], *, now: datetime) -> int:
    """Open, alert or end each curve's miscalibration episode from its track record; returns
    the deliveries written (one `LstarCurveMiscalibrated` alert per episode)."""
    by_name = {p.name: p for p in policies}
    written = 0
    for record in track_records(store):
        policy = by_name.get(record["policy"])
        if policy is None:
            continue
        episode = store.open_miscalibration(policy.name, record["curve_id"])
        if not record["miscalibrated"]:
            if episode is not None:
                store.end_miscalibration(episode["id"], now=now)
                event("curve_calibrated_again", policy=policy.name, curve=record["curve_id"])
            continue
        detail = {k: v for k, v in record.items() if k != "checks"}
        if episode is None:
            episode = {"id": store.start_miscalibration(policy.name, record["curve_id"], detail, now=now),
                       "alerted_at": None}
        if episode["alerted_at"] is not None or not policy.receivers:
            continue
        target = policy.meta_receivers[0] if policy.meta_receivers else policy.receivers[0].name
        summary = (f"curve {record['curve_id']} (task {record['task']}) covers {record['covered']} of "
                   f"{record['checked']} observations, below its nominal {record['nominal']:g} "
                   f"(one-sided binomial p = {record['p_value']:.3g})")
        description = (f"coverage {record['coverage']:.3f}, {INTERVAL_METHOD} interval "
                       f"[{record['coverage_lo']:.3f}, {record['coverage_hi']:.3f}]; "
                       f"{record['contradictions']} contradiction(s). Refit it with "
                       "`lstar curves refit CURVE --add-observed` and review the new artifact.")
        alert = operator_alert(policy.name, subject="curve-miscalibrated", key=("miscalibrated", str(episode["id"])),
                               state="miscalibrated", receiver=target, summary=summary, description=description,
                               numbers={"kind": "curve-miscalibrated", **detail}, now=now,
                               labels={"alertname": MISCALIBRATED_ALERTNAME, "curve_id": record["curve_id"],
                                       "task": record["task"]})
        n = store.raise_operator_alerts([alert.as_row()], now=now, miscalibration_id=int(episode["id"]))
        if n:
            event("curve_miscalibrated", policy=policy.name, curve=record["curve_id"], checked=record["checked"],
                  covered=record["covered"], p_value=record["p_value"])
        written += n
    return written


__all__ = ["BUDGET", "check_calibration", "content_digest", "evaluation_settings", "observation_alert",
           "observation_fields", "schedule_observations", "track_records"]
