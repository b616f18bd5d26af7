"""When each policy's report is due; writing and delivering the due ones (the daemon's report job)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from monitor.events import event
from monitor.policy import Policy, Report
from monitor.reports.delivery import deliver_report
from monitor.reports.report import build_report, missing_parents, remove_empty_folders, slug, write_report
from monitor.store import Store


def next_due(report: Report, last_end: datetime | None, now: datetime) -> datetime:
    """When `report` is next due: now for a first report, else the schedule's next time after
    the previous report's end (an `every` interval, or the crontab line's next fire time)."""
    if last_end is None:
        return now
    if report.schedule.every is not None:
        return last_end + report.schedule.every
    from apscheduler.triggers.cron import CronTrigger

    trigger = CronTrigger.from_crontab(report.schedule.cron, timezone=report.schedule.timezone)
    fire = trigger.get_next_fire_time(None, last_end + timedelta(microseconds=1))
    return fire if fire is not None else now + timedelta(days=3650)


def write_due_reports(store: Store, policies: Sequence[Policy], *, now: datetime,
                      out_dir: str | Path) -> list[dict[str, Any]]:
    """Write, record and deliver every report whose schedule is due; returns what was done.

    Folder: OUT_DIR/<policy>/<report>-<UTC timestamp>/. A report's period runs from the
    previous report's end (or `window` before now for the first) to now. Idempotent for a
    given `now`: a report already recorded for (policy, name, now) is not written again.
    """
    done = []
    for policy in policies:
        for spec in policy.reports:
            last = store.last_report(policy.name, spec.name)
            last_end = last.period_end if last else None
            if next_due(spec, last_end, now) > now:
                continue
            start = last_end if last_end is not None else now - spec.window
            data = build_report(store, policy, now=now, period_start=start, name=spec.name)
            stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            folder = Path(out_dir) / slug(policy.name) / f"{slug(spec.name)}-{stamp}"
            created = missing_parents(folder)
            paths = write_report(data, folder)
            # Recorded before it is sent: a report whose record fails (a full disk) leaves no
            # folder and sends nothing, and the next tick does it all again.
            try:
                report_id = store.record_report({
                    "policy": policy.name, "name": spec.name, "period_start": start, "period_end": now,
                    "folder": str(folder), "summary": data["summary"], "deliveries": [], "created_at": now})
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                remove_empty_folders(created)
                raise
            if report_id is None:
                continue  # recorded meanwhile for this very time: sent then
            deliveries = deliver_report(policy, spec, data, paths, now=now)
            store.set_report_deliveries(report_id, deliveries)
            event("report_written", report=report_id, policy=policy.name, name=spec.name, folder=str(folder),
                  receivers=len(deliveries), delivered=sum(d.get("outcome") == "delivered" for d in deliveries))
            done.append({"policy": policy.name, "report": spec.name, "folder": str(folder),
                         "summary": data["summary"], "deliveries": deliveries})
    return done
