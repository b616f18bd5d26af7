"""Each daemon job declares the part of the store it uses (docs/architecture.md, "The jobs").

The Protocol beside each job in `monitor/jobs/` must list exactly the `Store` members the job
reaches, read from the source (`support.store_use`): those it calls on its store, and those
of the stage functions and classes it hands the store to, followed as deep as the store goes.
Each member's signature is `Store`'s own, so `Store` (and the daemon's `DaemonStore`)
satisfies every Protocol, and a job's Protocol goes stale the day the job reaches further.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
import typing
from pathlib import Path

import pytest
from support.store_use import direct_store_use, job_store_use

from monitor.service.daemon_store import DaemonStore
from monitor.store import Store

JOBS = {"poll": "PollStore", "gate": "GateStore", "score": "ScoreStore", "evaluate": "EvaluateStore",
        "observe": "ObserveStore", "dispatch": "DispatchStore", "report": "ReportStore", "prune": "PruneStore"}
JOBS_DIR = Path(__file__).resolve().parents[1] / "monitor" / "jobs"


def protocol_of(job: str) -> type:
    return getattr(importlib.import_module(f"monitor.jobs.{job}"), JOBS[job])


def declared(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_every_job_module_is_checked_here() -> None:
    modules = {p.stem for p in JOBS_DIR.glob("*.py")} - {"__init__", "context"}
    assert modules == set(JOBS)


@pytest.mark.parametrize("job", JOBS)
def test_the_protocol_is_a_protocol_that_store_satisfies_with_the_same_signatures(job: str) -> None:
    protocol = protocol_of(job)
    assert typing.Protocol in protocol.__mro__ and getattr(protocol, "_is_protocol", False)
    members = declared(protocol)
    assert members, f"{protocol.__name__} declares nothing"
    for name in sorted(members):
        assert hasattr(Store, name), f"{protocol.__name__}.{name} is not a member of Store"
        assert inspect.signature(getattr(protocol, name)) == inspect.signature(getattr(Store, name)), name
    # What the daemon hands a job (a Store on a cursor of its own) has every member too.
    assert members <= set(dir(DaemonStore))
    runtime = typing.runtime_checkable(protocol)
    assert issubclass(Store, runtime) and issubclass(DaemonStore, runtime)


@pytest.mark.parametrize("job", JOBS)
def test_the_protocol_lists_exactly_what_the_job_reaches(job: str) -> None:
    protocol = protocol_of(job)
    used = job_store_use(f"monitor.jobs.{job}")
    assert declared(protocol) == used, (f"{protocol.__name__}: missing {sorted(used - declared(protocol))}, "
                                        f"not used {sorted(declared(protocol) - used)}")


@pytest.mark.parametrize("job", JOBS)
def test_the_job_calls_on_its_store_only_what_its_protocol_declares(job: str) -> None:
    assert direct_store_use(f"monitor.jobs.{job}") <= declared(protocol_of(job))


@pytest.mark.parametrize("job", JOBS)
def test_every_store_parameter_of_a_job_is_typed_with_its_protocol(job: str) -> None:
    tree = ast.parse((JOBS_DIR / f"{job}.py").read_text())
    typed = [(fn.name, ast.unparse(arg.annotation) if arg.annotation else None)
             for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
             for arg in [*fn.args.args, *fn.args.kwonlyargs] if arg.arg == "store"]
    assert typed, f"monitor/jobs/{job}.py takes no store"
    assert all(annotation == JOBS[job] for _, annotation in typed), typed


def test_the_reading_follows_the_store_into_functions_and_classes(tmp_path, monkeypatch) -> None:
    """A job that calls a store method itself, hands the store to a stage function, and to a
    class that keeps it on `self` is found to reach all three; another variable is not counted."""
    (tmp_path / "fake_job.py").write_text(
        "from monitor.jobs.prune import prune\n"
        "from monitor.hub.client import HubClient\n"
        "def run(store, other):\n"
        "    store.get_watermark('rule')\n"
        "    other.silences()\n"
        "    prune(store, None)\n"
        "    HubClient(None, store=store)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("fake_job", None)
    used = job_store_use("fake_job")
    assert {"get_watermark", "prune_logs", "checkpoint", "get_hub_state", "put_hub_state"} <= used
    assert "silences" not in used
    assert direct_store_use("fake_job") == {"get_watermark"}


def test_the_daemon_gives_the_jobs_everything_their_context_declares(tmp_path) -> None:
    """`Daemon` implements `JobContext` and `DaemonConfig` `JobConfig`: every member a job may
    use through its context exists on the real daemon."""
    from monitor.jobs.context import JobConfig, JobContext
    from monitor.service.daemon import Daemon, DaemonConfig

    config = DaemonConfig(policies_dir=tmp_path, state_dir=tmp_path / "state")
    daemon = Daemon(config)
    for protocol, target in ((JobContext, daemon), (JobConfig, config)):
        members = {*protocol.__annotations__, *(n for n in vars(protocol) if not n.startswith("_"))}
        assert members and not [m for m in members if not hasattr(target, m)], protocol.__name__
        for name in members:
            if callable(getattr(protocol, name, None)) and not isinstance(getattr(protocol, name), property):
                assert (list(inspect.signature(getattr(protocol, name)).parameters)[1:]
                        == list(inspect.signature(getattr(type(target), name)).parameters)[1:]), name
