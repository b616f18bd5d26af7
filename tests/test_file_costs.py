"""The suite's file order (costliest first) and its cost recorder (tests/support/file_costs.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from support.file_costs import (COSTS_FILE, MAX_WORKERS, costliest_first, estimate_wall_s, load_costs, per_file,
                                quota_cores, recorded, suite_workers, usable_cores)

ROOT = Path(__file__).resolve().parents[1]


def _items(*nodeids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_files_are_ordered_by_cost_and_each_file_keeps_its_own_order() -> None:
    items = _items("tests/test_a.py::one", "tests/test_a.py::two", "tests/test_b.py::x",
                   "tests/test_c.py::p", "tests/test_d.py::q", "tests/test_c.py::r")
    costs = {"test_b.py": 500.0, "test_c.py": 20.0}
    order = [i.nodeid for i in costliest_first(items, costs)]
    # b (500) then c (20) with its two tests in their order, then the unmeasured a and d as collected
    assert order == ["tests/test_b.py::x", "tests/test_c.py::p", "tests/test_c.py::r",
                     "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_d.py::q"]


def test_without_costs_the_collection_order_is_kept() -> None:
    items = _items("tests/test_z.py::a", "tests/test_a.py::b", "tests/test_z.py::c")
    assert [i.nodeid for i in costliest_first(items, {})] == [
        "tests/test_z.py::a", "tests/test_z.py::c", "tests/test_a.py::b"]


def _brute_force_lpt(costs: list[float], workers: int) -> float:
    """Longest first, each job to the least loaded worker, written as a plain loop."""
    loads = [0.0] * workers
    for cost in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += cost
    return max(loads)


def test_the_wall_estimate_is_longest_first_on_two_workers() -> None:
    # by hand: 600 -> w1; 300 -> w2; 200 -> w2 (500); 100 -> w2 (600): both end at 600
    assert estimate_wall_s({"a": 600, "b": 300, "c": 200, "d": 100}, workers=2, cores=2) == 600
    # one file longer than all the rest together bounds the run
    assert estimate_wall_s({"demo": 1000, "b": 300, "c": 200}, workers=2, cores=2) == 1000
    for costs in itertools.islice(itertools.product([5, 17, 40, 90], repeat=5), 0, None, 37):
        assert estimate_wall_s(dict(enumerate(costs)), workers=2, cores=2) == _brute_force_lpt(list(costs), 2)
        assert estimate_wall_s(dict(enumerate(costs)), workers=2, cores=2) >= sum(costs) / 2


def _time_stepped(costs: list[float], workers: int, cores: int, dt: float = 0.01) -> float:
    """The same schedule as a plain loop over small steps of time: the busy workers share the
    cores evenly, a free worker takes the costliest file left."""
    queue, running, t = sorted(costs, reverse=True), [], 0.0
    while queue or running:
        while queue and len(running) < workers:
            running.append(queue.pop(0))
        share = min(1.0, cores / len(running)) * dt
        running = [left - share for left in running]
        t += dt
        running = [left for left in running if left > 1e-12]
    return t


def test_the_wall_estimate_shares_two_cores_among_three_workers() -> None:
    # by hand: three files of 60 at 2/3 of a core each all end at 90 (= the floor, 180 / 2)
    assert estimate_wall_s({"a": 60, "b": 60, "c": 60}) == pytest.approx(90)
    # 90, 30, 30: all at 2/3 until the two 30s end at 45 (the 90 has 60 left), then alone: 105
    assert estimate_wall_s({"a": 90, "b": 30, "c": 30}) == pytest.approx(105)
    # a fourth 60 starts at 90 on the first free worker, alone on a core: 150
    assert estimate_wall_s({"a": 60, "b": 60, "c": 60, "d": 60}) == pytest.approx(150)
    # two files on three workers: each has a core of its own
    assert estimate_wall_s({"a": 120.5, "b": 50}) == pytest.approx(120.5)
    for costs in itertools.islice(itertools.product([5, 17, 40, 90], repeat=5), 0, None, 97):
        assert estimate_wall_s(dict(enumerate(costs))) == pytest.approx(_time_stepped(list(costs), 3, 2), abs=0.05)
        assert estimate_wall_s(dict(enumerate(costs))) >= sum(costs) / 2 - 1e-9


def test_one_worker_more_than_the_cores_at_most_eight() -> None:
    assert [suite_workers(cores) for cores in (1, 2, 4, 7, 64)] == [2, 3, 5, 8, MAX_WORKERS]
    assert MAX_WORKERS == 8
    import conftest

    # `-n auto` in pyproject.toml asks conftest's hook, which gives this machine's number
    assert conftest.pytest_xdist_auto_num_workers(None) == suite_workers()
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-n auto" in addopts and "--dist loadfile" in addopts


def test_a_cgroup_cpu_quota_lowers_the_cores(tmp_path: Path) -> None:
    assert [quota_cores(line) for line in ("max 100000", "150000 100000", "200000 100000", "50000 100000",
                                           "", "max", "x 100000", "100000 0x", "100000 0")] == [None, 2, 2, 1, None, None,
                                                                                                 None, None, None]
    import os

    affinity = len(os.sched_getaffinity(0))
    root = tmp_path / "cgroup"
    (root / "a" / "b").mkdir(parents=True)
    proc = tmp_path / "self-cgroup"
    proc.write_text("0::/a/b\n")
    assert usable_cores(root, proc) == affinity                    # no cpu.max anywhere
    (root / "a" / "cpu.max").write_text("100000 100000\n")          # a parent's quota binds
    (root / "a" / "b" / "cpu.max").write_text("max 100000\n")
    assert usable_cores(root, proc) == 1
    (root / "a" / "cpu.max").write_text("garbage\n")               # unreadable as a quota: ignored
    assert usable_cores(root, proc) == affinity
    (tmp_path / "cpu.max").write_text("100000 100000\n")            # outside the root: never read
    proc.write_text("0::/../../escape\n")                          # a path leaving the root: root only
    assert usable_cores(root, proc) == affinity
    (root / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(root, proc) == 1


def test_pytest_without_xdist_accepts_the_conftest() -> None:
    """The worker-count hook is xdist's: with xdist off, pytest must still start."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "tests/test_file_costs.py", "-k", "broken_or_missing"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_worker_count_set_in_the_environment_is_xdists(monkeypatch: pytest.MonkeyPatch) -> None:
    import conftest

    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "1")
    assert conftest.pytest_xdist_auto_num_workers(None) is None


def test_a_broken_or_missing_table_loses_only_the_order(tmp_path: Path) -> None:
    assert load_costs(tmp_path / "absent.json") == {}
    for text in ("{", "[]", '{"files": 3}', '{"files": {"t.py": {"cpu": 1}}}', '{"files": {"t.py": {"cpu_s": "x"}}}'):
        (tmp_path / "bad.json").write_text(text)
        assert load_costs(tmp_path / "bad.json") == {}, text


def test_the_committed_table_names_existing_files_and_puts_the_demo_first() -> None:
    costs = load_costs(COSTS_FILE)
    assert costs, f"{COSTS_FILE} is missing or unreadable"
    tests = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert set(costs) <= tests, sorted(set(costs) - tests)
    assert all(c >= 0 for c in costs.values())
    assert max(costs, key=costs.get) == "test_demo.py"


def test_xdist_keeps_the_order_conftest_gives() -> None:
    """Without `--no-loadscope-reorder` xdist sorts files by their number of tests, most first,
    and the one-test demo file would start last."""
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--dist loadfile" in addopts and "--no-loadscope-reorder" in addopts


def test_the_recorder_writes_cpu_and_wall_per_test_and_sums_them_per_file(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    with recorded("tests/test_x.py::burn", str(tmp_path)):
        # a child that burns CPU for a measured while: its CPU counts for the test that waited for it
        subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\n"
                        "while time.process_time() - t < 0.3: pass"], check=True)
    with recorded("tests/test_x.py::idle", str(tmp_path)):
        pass
    with recorded("tests/test_y.py::nothing", None):   # not recording: no file
        pass
    rows = [json.loads(line) for line in (tmp_path / "gw7.jsonl").read_text().splitlines()]
    assert [r["nodeid"] for r in rows] == ["tests/test_x.py::burn", "tests/test_x.py::idle"]
    assert rows[0]["cpu_s"] >= 0.3 and rows[0]["wall_s"] >= 0.3
    assert rows[1]["cpu_s"] < 0.3
    summed = per_file(rows)
    assert summed == {"test_x.py": {"cpu_s": pytest.approx(rows[0]["cpu_s"] + rows[1]["cpu_s"]),
                                    "wall_s": pytest.approx(rows[0]["wall_s"] + rows[1]["wall_s"]), "tests": 2}}


def test_the_order_reaches_the_collection() -> None:
    """conftest's hook applies the table: collected in-process, the demo's file comes first."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=",
                           "-p", "no:cacheprovider", "tests/test_file_costs.py", "tests/test_demo_parts.py",
                           "tests/test_demo.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = [line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line]
    assert files[0] == "tests/test_demo.py", files[:3]


def test_the_table_is_summed_printed_and_merged_into_the_committed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import support.file_costs as file_costs

    table = tmp_path / "file_costs.json"
    table.write_text('{"files": {"test_old.py": {"cpu_s": 7.0}, "test_a.py": {"cpu_s": 1.0}, '
                     '"test_gone.py": {"cpu_s": 3.0}}}')
    (tmp_path / "test_old.py").write_text("")   # still a test file beside the table; test_gone.py is not
    monkeypatch.setattr(file_costs, "COSTS_FILE", table)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "gw0.jsonl").write_text('{"nodeid": "tests/test_a.py::x", "cpu_s": 100.0, "wall_s": 60.0}\n'
                                    '{"nodeid": "tests/test_a.py::y", "cpu_s": 20.5, "wall_s": 10.0}\n')
    (runs / "gw1.jsonl").write_text('{"nodeid": "tests/test_b.py::z", "cpu_s": 50.0, "wall_s": 55.0}\n')
    assert file_costs._main([str(runs), "--write"]) == 0
    out = capsys.readouterr().out
    # a: 120.5 on one worker, b: 50 on another, each on a core -> 120.5 s = 2.0 min; floor 170.5 / 2 = 85 s
    assert "3 tests, 170 CPU-s; estimated wall on 2 idle cores with 3 workers: 2.0 min (floor 1.4 min)" in out
    assert out.index("test_a.py") < out.index("test_b.py")
    # measured files replace their old cost, files not measured this time keep theirs, and files
    # that no longer exist are dropped
    assert load_costs(table) == {"test_a.py": 120.5, "test_b.py": 50.0, "test_old.py": 7.0}
