"""The daemon's live status page (`GET /` on the local API): server-rendered HTML that an
evaluation team keeps open.

It reads the tables the governance report reads (predictions, checkpoints, score runs,
alerts, silences) and the daemon's own in-memory state, and shows:

- every watched lineage × task of the policies in force with its current state, an L* trend
  (an inline SVG sparkline of the lineage's checkpoints in training order), the distance of
  P̂ to the task's level and the last alert;
- the open alerts and the active or pending silences;
- the daemon's health, queue depths (checkpoints by status, the outbox) and last poll.

Bounded: one query reads at most `MAX_CANDIDATES` prediction rows (the newest per
checkpoint × task, most recently evaluated first), the page shows the `MAX_ROWS` lineage ×
task rows closest to their level and counts the rest; open alerts and silences are read
`MAX_LISTED` at a time with their totals. The API renders it on a pool of its own, shared by
concurrent requests and served again for `MAX_AGE` seconds (`api_cache.SharedRender`), so it
answers under load as /health and /metrics do.

Self-contained and strict: no external asset, no script; it refreshes itself with `<meta
http-equiv="refresh">`; the answer carries a Content-Security-Policy that allows nothing but
the page's own stylesheet (by its hash) and inline images; every value is escaped by Jinja's
autoescape after `escape.template_value` made control and bidirectional characters visible.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

from monitor.escape import template_value
from monitor.reports.present import checkpoint_name, fmt
from monitor.reports.watchlist import last_alerts as watchlist_last_alerts
from monitor.reports.watchlist import with_states_in_force
from monitor.store.placing import PLACEMENT_OBJECT
from monitor.training_order import Placement, current_checkpoint, lineage_order, place

MAX_ROWS = 50            # lineage × task rows shown, closest to their level first
MAX_CANDIDATES = 20_000  # prediction rows read (one per checkpoint × task) at most
MAX_LISTED = 20          # open alerts and silences shown
SPARK_POINTS = 24        # checkpoints drawn in a sparkline (the latest in training order)
REFRESH_S = 30           # the page reloads itself this often
MAX_AGE = 2.0            # seconds a render is served again to every request
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
TEMPLATE = "status.html.j2"

# The page's only stylesheet: the CSP allows exactly this text (by its SHA-256), nothing else.
CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse;font-size:.9em}th,td{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:left}
th{background:#f3f3f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.state{font-weight:600;padding:.1em .5em;border-radius:.3em}
.clear{background:#e3f4e6;color:#1b5e20}.at_risk{background:#fff1d6;color:#8a5300}
.emerged{background:#fde2e1;color:#a4161a}.flagged{background:#e8e8f8;color:#30307a}
.ok{color:#1b5e20;font-weight:600}.bad{color:#a4161a;font-weight:600}
.muted{color:#666}svg.spark{vertical-align:middle}svg.spark polyline{fill:none;stroke:#1155cc;stroke-width:1.5}
svg.spark circle{fill:#1155cc}
"""
CSS_HASH = base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()
CONTENT_SECURITY_POLICY = (f"default-src 'none'; style-src 'sha256-{CSS_HASH}'; img-src data:; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY"}


@dataclass(frozen=True)
class Candidate:
    """One checkpoint's newest prediction for one (policy, task, lineage), with what places it
    in its lineage (refs, meta, discovery and scoring times)."""

    policy: str
    task: str
    lineage: str
    repo: str
    commit: str
    state: str
    lstar: float | None          # the score run's L* (whatever the curve's axis)
    p_hat: float | None
    lo: float | None
    hi: float | None
    level: float | None          # the task's level b + ε the state was classified against
    evaluated_at: datetime | None
    refs: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    discovered_at: datetime | None = None
    scored_at: datetime | None = None


def placement(c: Candidate) -> Placement:
    """Where a candidate's checkpoint sits in its lineage (`monitor.training_order.place`)."""
    return place(c.refs, c.meta, c.discovered_at, c.scored_at)


def distance_to_level(c: Candidate) -> float | None:
    """P̂ minus the task's level (in the task's metric): negative while below it."""
    if c.p_hat is None or c.level is None:
        return None
    return c.p_hat - c.level


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 24) -> dict[str, Any] | None:
    """An SVG polyline's points for `values` (oldest first), lower L* drawn higher: the model
    improving reads as a rising line. None for no values."""
    values = [v for v in values if v is not None][-SPARK_POINTS:]
    if not values:
        return None
    low, high = min(values), max(values)
    span = high - low or 1.0
    pad = 3
    step = (width - 2 * pad) / max(1, len(values) - 1)
    points = [(pad + i * step if len(values) > 1 else width / 2,
               pad + (v - low) / span * (height - 2 * pad)) for i, v in enumerate(values)]
    return {"width": width, "height": height, "points": " ".join(f"{x:.1f},{y:.1f}" for x, y in points),
            "last": points[-1], "first_value": values[0], "last_value": values[-1], "n": len(values)}


# -- reading -----------------------------------------------------------------------------------
def _decoded(text: Any, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


def read_candidates(store: Any, watched: Mapping[str, Sequence[str]], *,
                    limit: int = MAX_CANDIDATES) -> tuple[list[Candidate], int]:
    """The newest prediction of each checkpoint × task of the watched (policy → tasks), at most
    `limit` rows (most recently evaluated first), and how many there are in all."""
    pairs = [(policy, task) for policy, tasks in watched.items() for task in tasks]
    if not pairs:
        return [], 0
    marks = ", ".join("(?, ?)" for _ in pairs)
    rows = store.query(
        "WITH newest AS (SELECT p.*, row_number() OVER (PARTITION BY p.policy, p.task, p.lineage, p.repo, "
        "p.commit_sha ORDER BY p.evaluated_at DESC, p.id DESC) AS n FROM predictions p "
        f"WHERE (p.policy, p.task) IN (SELECT * FROM (VALUES {marks})) AND p.state != 'not_evaluated') "
        "SELECT n.policy, n.task, n.lineage, n.repo, n.commit_sha, n.state, n.p_hat, n.lo, n.hi, n.threshold, "
        "n.evaluated_at, r.lstar AS score_lstar, n.lstar AS axis_value, r.finished_at AS scored_at, c.refs, "
        # of the meta, the two values that place a checkpoint (`monitor.store.placing`)
        f"{PLACEMENT_OBJECT.format(placed='c.placing_values')} AS meta, "
        "c.discovered_at, count(*) OVER () AS total FROM newest n "
        "LEFT JOIN score_runs r ON r.run_id = n.run_id "
        "LEFT JOIN checkpoints c ON c.repo = n.repo AND c.sha = n.commit_sha "
        "WHERE n.n = 1 ORDER BY n.evaluated_at DESC, n.repo, n.commit_sha LIMIT ?",
        [v for pair in pairs for v in pair] + [limit])
    total = int(rows[0]["total"]) if rows else 0
    out = []
    for r in rows:
        refs = _decoded(r["refs"], [])
        meta = _decoded(r["meta"], {})
        out.append(Candidate(
            policy=r["policy"], task=r["task"], lineage=r["lineage"], repo=r["repo"], commit=r["commit_sha"],
            state=r["state"], lstar=r["score_lstar"] if r["score_lstar"] is not None else r["axis_value"],
            p_hat=r["p_hat"], lo=r["lo"], hi=r["hi"], level=r["threshold"], evaluated_at=r["evaluated_at"],
            refs=tuple(x for x in refs if isinstance(x, str)) if isinstance(refs, list) else (),
            meta=meta if isinstance(meta, dict) else {}, discovered_at=r["discovered_at"],
            scored_at=r["scored_at"]))
    return out, total


def last_alerts(store: Any, groups: Sequence[tuple[str, str, str]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The newest alert of each (policy, task, lineage) in `groups`, as the watchlist shows it
    (`monitor.reports.watchlist.last_alerts`: one definition for both)."""
    return watchlist_last_alerts(store, [{"policy": p, "task": t, "lineage": n} for p, t, n in groups])


def open_alerts(store: Any, *, limit: int = MAX_LISTED) -> tuple[list[dict[str, Any]], int]:
    """The alerts in force (the newest of each policy × task × lineage, and of each operator
    subject, when it is firing), newest first, at most `limit`, and their total."""
    rows = store.query(
        "SELECT id, kind, policy, task, repo, commit_sha, lineage, state, created_at, count(*) OVER () AS total "
        "FROM (SELECT *, row_number() OVER (PARTITION BY policy, task, lineage, kind = 'meta' "
        "ORDER BY created_at DESC, id DESC) AS n FROM alerts WHERE kind != 'observe') "
        "WHERE n = 1 AND status = 'firing' ORDER BY created_at DESC, id DESC LIMIT ?", [limit])
    return rows, int(rows[0]["total"]) if rows else 0


def open_silences(store: Any, now: datetime, *, limit: int = MAX_LISTED) -> tuple[list[dict[str, Any]], int]:
    """Active and pending silences, newest first (as `lstar silence list`)."""
    from monitor.store.listings import silences_page

    page = silences_page(store, now=now, limit=limit)
    return list(page.items), int(page.total)


# -- the page's data ---------------------------------------------------------------------------
def lineage_rows(candidates: Sequence[Candidate], *, limit: int = MAX_ROWS) -> tuple[list[dict[str, Any]], int]:
    """One row per (policy, task, lineage): its current checkpoint's state, L* trend, distance
    to the level and last alert; the `limit` closest to their level (|P̂ − level|, unknown
    last), and how many rows there are in all."""
    groups: dict[tuple[str, str, str], list[Candidate]] = {}
    for c in candidates:
        groups.setdefault((c.policy, c.task, c.lineage), []).append(c)
    rows = []
    for key, members in groups.items():
        # the project's one rule (monitor.training_order): the sparkline's order and "current"
        ordered = lineage_order(members, placement, lambda c: (c.commit, c.repo))
        current = current_checkpoint(members, placement, lambda c: (c.commit, c.repo))
        if current is None:   # a group holds at least one candidate; kept for the type checker
            continue
        distance = distance_to_level(current)
        rows.append({"key": key, "policy": key[0], "task": key[1], "lineage": key[2],
                     "checkpoint": checkpoint_name(current.repo, current.commit, current.refs),
                     "repo": current.repo, "commit": current.commit, "state": current.state,
                     "lstar": current.lstar, "p_hat": current.p_hat, "level": current.level,
                     "distance": distance, "evaluated_at": current.evaluated_at, "checkpoints": len(ordered),
                     "spark": sparkline([c.lstar for c in ordered])})
    rows.sort(key=lambda r: (r["distance"] is None, abs(r["distance"]) if r["distance"] is not None else 0.0,
                             r["policy"], r["task"], r["lineage"]))
    return rows[:limit], len(rows)


def gather(daemon: Any, *, now: datetime, max_rows: int = MAX_ROWS,
           max_candidates: int = MAX_CANDIDATES) -> dict[str, Any]:
    """Everything the page shows, from `daemon` (a `DaemonView`). A database that cannot be
    read leaves the daemon's own state on the page with the reason."""
    ok, reasons = daemon.health()
    policies = list(daemon.policies())
    watched = {p.name: [t.name for t in p.tasks] for p in policies}
    data: dict[str, Any] = {"now": now, "healthy": ok, "reasons": list(reasons), "refresh_s": REFRESH_S,
                            "policies": sorted(watched), "rows": [], "rows_total": 0, "candidates_read": 0,
                            "candidates_total": 0, "alerts": [], "alerts_total": 0, "silences": [],
                            "silences_total": 0, "checkpoint_counts": {}, "outbox": {}, "jobs": {},
                            "database_error": None, "max_rows": max_rows}
    try:
        status = daemon.status()
    except Exception as exc:  # noqa: BLE001 - the page shows whatever it can read
        status, data["database_error"] = {}, f"{type(exc).__name__}: {exc}"
    data["checkpoint_counts"] = dict(status.get("checkpoints") or {})
    jobs = status.get("jobs") or {}
    data["jobs"] = {name: {k: jobs[name].get(k) for k in ("last_start", "last_success", "last_error", "runs",
                                                          "failures", "next_run")}
                    for name in ("poll", "score", "evaluate", "dispatch") if isinstance(jobs.get(name), dict)}
    data["hub_outages"] = len(status.get("hub_outages") or [])
    try:
        with daemon.read_store() as store:
            candidates, data["candidates_total"] = read_candidates(store, watched, limit=max_candidates)
            data["candidates_read"] = len(candidates)
            rows, data["rows_total"] = lineage_rows(candidates, limit=max_rows)
            # an evaluation's observed state supersedes the prediction, as on the watchlist and report
            with_states_in_force(store, rows, commit="commit")
            for row in rows:
                row["predicted_state"], row["state"] = row["state"], row["state_in_force"]
            alerts = last_alerts(store, [r["key"] for r in rows])
            for row in rows:
                row["last_alert"] = alerts.get(row["key"])
            data["rows"] = rows
            data["alerts"], data["alerts_total"] = open_alerts(store)
            data["silences"], data["silences_total"] = open_silences(store, now)
            data["outbox"] = store.outbox_depth()
    except Exception as exc:  # noqa: BLE001 - a database the page cannot read is shown, not raised
        data["database_error"] = f"{type(exc).__name__}: {exc}"
    return data


# -- rendering ---------------------------------------------------------------------------------
def _when(value: Any) -> str:
    """A time as the report prints it: a datetime, or the ISO text the daemon's job states hold
    (left as it is when it is not a time)."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        return fmt(moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc))
    return fmt(value)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                             undefined=jinja2.StrictUndefined, finalize=template_value)
    env.filters["fmt"] = fmt
    env.filters["when"] = _when
    env.filters["signed"] = lambda v: "—" if v is None else f"{v:+.4f}"
    return env


_ENV = _environment()


def render(data: Mapping[str, Any]) -> bytes:
    """The page's HTML for `gather`'s data."""
    html = _ENV.get_template(TEMPLATE).render(**data, css=CSS)   # the page's own text, marked safe there
    return html.encode()


def render_status_page(daemon: Any, *, now: datetime | None = None) -> bytes:
    """`gather` then `render`: what `GET /` answers."""
    from monitor.store import utcnow

    return render(gather(daemon, now=now or utcnow()))


__all__ = ["Candidate", "placement", "distance_to_level", "sparkline", "read_candidates",
           "last_alerts", "open_alerts", "open_silences", "lineage_rows", "gather", "render", "render_status_page",
           "CONTENT_SECURITY_POLICY", "HEADERS", "CSS", "MAX_ROWS", "MAX_CANDIDATES", "MAX_AGE", "REFRESH_S"]
