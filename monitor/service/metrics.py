"""Prometheus metrics of the daemon (a registry of its own, served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class DaemonMetrics:
    """Counters of work done, job durations and last successes, stuck jobs, disk and database state."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
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

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
