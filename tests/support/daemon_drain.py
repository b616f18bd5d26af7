"""A daemon job whose query runs past the drain deadline, stopped: the shutdown tests of a job's
own cursor (tests/test_incremental_jobs.py) and of a report's ranks cursor
(tests/test_report_ranks_closed.py) share it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor.store import Store


def assert_the_drain_interrupts(tmp_path: Path, job: str, endless: Callable[[Any, threading.Event], None]) -> None:
    """Run `endless(daemon, started)` as the daemon's job `job` (it sets `started` just before
    its query that would run for hours), stop the daemon with a 0.5 s drain, and check that the
    job failed with DuckDB's interrupt, the shutdown was clean and no cursor is left registered."""
    from monitor.service.daemon import Daemon, DaemonConfig

    (tmp_path / "policies").mkdir()
    daemon = Daemon(DaemonConfig(policies_dir=tmp_path / "policies", state_dir=tmp_path / "state", drain=0.5))
    daemon.store = Store.open(tmp_path / "state" / "lstar.duckdb")
    started = threading.Event()

    def body() -> dict:
        endless(daemon, started)
        return {}

    setattr(daemon, f"job_{job}", body)
    worker = threading.Thread(target=daemon._run_job, args=(job,), daemon=True)
    worker.start()
    assert started.wait(30)
    try:
        daemon.stopping.set()
        assert daemon._shutdown() == 0
        worker.join(30)
        assert not worker.is_alive()
        state = daemon.jobs[job]
        assert state.failures == 1 and "Interrupt" in (state.last_error or "")
        assert daemon.live_cursors == set()
    finally:
        for cursor in list(getattr(daemon, "live_cursors", ())):
            cursor.interrupt()
        worker.join(5)
