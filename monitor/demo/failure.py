"""How a demo run fails: the stage that failed and why, in one line.

A stage that raises becomes `DemoFailed(stage, reason)`; a daemon pass that ran but did not
close the loop is read back from the database by `diagnose`, which names the first link that
did not hold (the reason a poll failed is in its `hub_polls` row, not in an exception).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from monitor.errors import LstarError


class DemoFailed(LstarError):
    """A stage of the demo failed: `stage` names it, `reason` says why (one line)."""

    exit_code = 1

    def __init__(self, stage: str, reason: str) -> None:
        self.stage, self.reason = stage, " ".join(reason.split())
        super().__init__(f"demo failed at {stage}: {self.reason}")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Any failure inside becomes `DemoFailed(name, ...)`, its reason the error's own line."""
    try:
        yield
    except DemoFailed:
        raise
    except Exception as exc:
        text = str(exc).strip().splitlines()
        reason = exc.one_line() if isinstance(exc, LstarError) else \
            f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
        raise DemoFailed(name, reason) from exc


# Where a checkpoint stopped, as the stage that left it there.
_STUCK_AT = {"discovered": "gate", "skipped": "gate", "gated": "score", "fetched": "score", "failed": "score"}


def diagnose(store: Any, *, org: str, exit_code: int, job_errors: dict[str, str], alerts: int, alert_mails: int,
             reports: int) -> tuple[str, str] | None:
    """(stage, reason) of the first link of the loop that did not hold, in pipeline order, or
    None when it closed: a job's error, a failed poll, no or unscored checkpoints of `org`'s
    repos, no prediction that fires, no alert at a receiver, no report, a non-zero exit."""
    for job in ("reload", "poll", "score", "evaluate", "dispatch", "report"):
        if job in job_errors:
            return job, job_errors[job]
    failed_polls = [p for p in store.hub_polls(limit=20) if not p.ok]
    if failed_polls:
        return "poll", f"polling the fake Hub (rule {failed_polls[0].rule_name}) failed: {failed_polls[0].error}"
    rows = store.query("SELECT repo, sha, status, reason FROM checkpoints WHERE repo LIKE ? ORDER BY id",
                       [f"{org}/%"])
    if not rows:
        return "poll", "no checkpoint of the fake Hub's step branches was discovered"
    stuck = [r for r in rows if r["status"] != "scored"]
    if stuck:
        r = stuck[0]
        return (_STUCK_AT.get(r["status"], "score"),
                f"{len(stuck)} of {len(rows)} checkpoints not scored; {r['repo']}@{r['sha'][:12]} is "
                f"{r['status']}: {r['reason'] or 'no reason recorded'}")
    states = store.query("SELECT state, count(*) AS n FROM predictions GROUP BY state ORDER BY state")
    if not any(s["state"] in ("at_risk", "emerged") for s in states):
        made = ", ".join(f"{s['n']} {s['state']}" for s in states) or "none"
        return "predict", f"no lineage is at risk or emerged against the fitted curve (predictions: {made})"
    if not alerts:
        return "dispatch", "no alert message reached the local webhook receiver"
    if not alert_mails:
        return "dispatch", "no alert mail reached the local SMTP server"
    if not reports:
        return "report", "no report was written"
    if exit_code != 0:
        return "daemon", f"the daemon exited {exit_code}"
    return None
