"""Prometheus metrics of the daemon (a registry of its own, served at /metrics)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("lstar.daemon")


class DaemonMetrics:
    """Counters of work done, job durations and last successes, stuck jobs, disk and database
    state; the outbox's depth and dead letters, skipped evaluations, each watch rule's last
    successful poll and the last policy reload.

    `store_reader` (set by the daemon: a context manager giving a read-only store) lets
    `render` read the outbox counts at scrape time: two aggregate queries, however many
    checkpoints the database holds.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.store_reader: Callable[[], Any] | None = None
        self.polls = Counter("lstar_polls", "Watch-rule polls of the Hub, by result.", ["result"], registry=r)
        self.discovered = Counter("lstar_checkpoints_discovered", "New checkpoint rows found by polls.", registry=r)
        self.scores = Counter("lstar_scores", "Queue jobs handled by the scorer, by final status.", ["result"],
                              registry=r)
        self.alerts_raised = Counter("lstar_alerts_raised", "Alerts written to the outbox.", registry=r)
        self.notifications = Counter("lstar_notifications", "Notification send attempts, by outcome.",
                                     ["outcome"], registry=r)
        self.job_failures = Counter("lstar_job_failures", "Job runs that raised.", ["job"], registry=r)
        self.job_duration = Histogram("lstar_job_duration_seconds", "Wall time of job runs.", ["job"],
                                      buckets=(0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200), registry=r)
        self.last_success = Gauge("lstar_job_last_success_timestamp_seconds",
                                  "Unix time of the job's last successful run.", ["job"], registry=r)
        self.stuck = Gauge("lstar_job_stuck", "1 while the watchdog finds the job stuck.", ["job"], registry=r)
        self.disk_full = Gauge("lstar_disk_full", "1 while writes fail for lack of space.", registry=r)
        self.db_invalidated = Gauge("lstar_database_invalidated",
                                    "1 while the database must be re-opened after a fatal DuckDB error.",
                                    registry=r)
        self.outbox_depth = Gauge("lstar_outbox_depth",
                                  "Outbox entries waiting: deliveries not yet grouped (stage=delivery) and "
                                  "notifications not yet sent (stage=notification).", ["stage"], registry=r)
        self.dead_letters = Gauge("lstar_dead_letters_open",
                                  "Dead-lettered notifications not retried since (lstar alerts retry).",
                                  registry=r)
        self.evaluations_skipped = Counter("lstar_evaluations_skipped",
                                           "Evaluations that could not be done, by reason (each counted "
                                           "once, however many passes find it again).", ["reason"], registry=r)
        self.rule_last_success = Gauge("lstar_rule_last_success_timestamp_seconds",
                                       "Unix time of the watch rule's last successful Hub poll.", ["rule"],
                                       registry=r)
        self.reload_ok = Gauge("lstar_config_last_reload_successful",
                               "1 when the last read of the policy files loaded every file, else 0.", registry=r)
        self.reload_ok_at = Gauge("lstar_config_last_reload_success_timestamp_seconds",
                                  "Unix time of the last read of the policy files that loaded every file.",
                                  registry=r)

    def policy_reloaded(self, *, ok: bool) -> None:
        """Record one read of the policy files (ok: every file loaded)."""
        self.reload_ok.set(1 if ok else 0)
        if ok:
            self.reload_ok_at.set(time.time())

    def rule_polled(self, rule: str, at: float | None = None) -> None:
        """Record a successful poll of watch rule `rule` (at: Unix time, default now)."""
        self.rule_last_success.labels(rule=rule).set(time.time() if at is None else at)

    def refresh_outbox(self) -> None:
        """Read the outbox's counts (kept as they were when the database cannot be read)."""
        if self.store_reader is None:
            return
        try:
            with self.store_reader() as store:
                counts = store.outbox_depth()
        except Exception as exc:  # noqa: BLE001 - /metrics answers whatever the database does
            log.debug("outbox metrics not refreshed: %s", exc)
            return
        self.outbox_depth.labels(stage="delivery").set(counts["deliveries_pending"])
        self.outbox_depth.labels(stage="notification").set(counts["notifications_pending"])
        self.dead_letters.set(counts["dead_letters"])

    def render(self) -> bytes:
        """The text exposition format."""
        with contextlib.suppress(Exception):
            self.refresh_outbox()
        return generate_latest(self.registry)
