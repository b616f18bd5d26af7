"""A task's `evaluate.file` is hostile at run time too: the observe tick reads it bounded (a
FIFO put in its place cannot block the tick, a huge file is refused before it is read), checks
it against the fingerprint its policy took, and an evaluation whose file changed before it ran
is superseded by one of the new file (kept, reported), never failed for good."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest

from monitor.alerts.observations import schedule_observations
from monitor.alerts.task_files import TaskFileNotAsScheduled, check_task_files, task_file_as_scheduled
from monitor.curves.evaluator import load_mc_task
from monitor.errors import LabelError, PolicyError
from monitor.files import TASK_FILE_MAX_BYTES
from monitor.policy import load_policy
from monitor.reports.report import build_report, to_html, to_markdown
from monitor.store import Store
from tests.test_observe import NOW, _mc, _observe, _policy, _prediction


@pytest.fixture(scope="module")
def curve(tmp_path_factory) -> Path:
    from tests.test_daemon_events import fit_arith_curve

    return fit_arith_curve("c" * 64, tmp_path_factory.mktemp("curve") / "arith.json")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _edit(path: Path) -> None:
    """The task file edited: one more item."""
    with path.open("a") as handle:
        handle.write(json.dumps({"id": "b", "context": "Q2?", "choices": [" no", " yes"], "answer": 1}) + "\n")


def _in_thread(call, timeout: float):
    """`call()` in a thread; (finished, result or exception) after at most `timeout` seconds."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), out.get("value")


def test_a_fifo_as_the_task_file_does_not_block_the_observe_tick(tmp_path, curve):
    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        task.unlink()
        os.mkfifo(task)   # swapped for a FIFO after the policy loaded
        try:
            finished, result = _in_thread(lambda: schedule_observations(store, [policy], now=NOW), timeout=10)
        finally:
            if not finished:   # the old code blocks in open(): give it a writer so the thread ends
                os.close(os.open(task, os.O_WRONLY | os.O_NONBLOCK))
        assert finished, "the observe tick blocked on a FIFO"
        assert result == {"scheduled": 0, "skipped_budget": 0, "superseded": 0}
        assert store.observations() == []   # nothing scheduled under a file that cannot be read
    [check] = check_task_files([policy]).values()
    assert check.sha256 is None
    assert check.problem == (f"policy p: task arith: {task.resolve()}: is a named pipe (FIFO), not a multiple-choice "
                             "task file; multiple-choice task files are regular JSON-lines files; rename or remove "
                             "it; its evaluations wait until it is mended")


def test_an_oversized_task_file_is_refused_without_reading_it(tmp_path, curve):
    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    size = 3 * TASK_FILE_MAX_BYTES   # 192 MiB, sparse: nothing written to disk
    with task.open("r+b") as handle:
        handle.truncate(size)
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        tracemalloc.start()
        started = time.perf_counter()
        try:
            counts = schedule_observations(store, [policy], now=NOW)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        took = time.perf_counter() - started
        assert counts["scheduled"] == 0 and store.observations() == []
    assert peak < 8 << 20, f"the tick held {peak:,} bytes"   # the old tick read the whole file
    assert took < 2.0
    [check] = check_task_files([policy]).values()
    assert f"file is {size:,} bytes; multiple-choice task files are limited to {TASK_FILE_MAX_BYTES:,} bytes; " \
           "split it, or use kind lm_eval" in check.problem


def test_policy_check_refuses_a_fifo_task_file_by_what_it_is(tmp_path, curve):
    os.mkfifo(tmp_path / "mc.jsonl")
    with pytest.raises(PolicyError) as info:
        load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    assert "tasks[0].evaluate.file: task file 'mc.jsonl' does not load: " in str(info.value)
    assert "is a named pipe (FIFO), not a multiple-choice task file" in str(info.value)


def test_lstar_eval_reads_a_task_file_bounded(tmp_path):
    fifo = tmp_path / "task.jsonl"
    os.mkfifo(fifo)
    try:
        finished, result = _in_thread(lambda: load_mc_task(fifo), timeout=10)
    finally:
        if not finished:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert finished and isinstance(result, LabelError)
    assert result.message == f"{fifo}: is a named pipe (FIFO), not a multiple-choice task file"


def test_a_changed_task_file_supersedes_the_evaluations_that_have_not_run(tmp_path, curve, caplog):
    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}", per_day=2))
    before = _sha(task)
    assert policy.task_file_sha256("mc.jsonl") == before   # fingerprinted with the policy
    with Store.open(tmp_path / "s.duckdb") as store:
        for i, run in enumerate("ab"):
            _prediction(store, run, lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW + timedelta(minutes=i))
        assert schedule_observations(store, [policy], now=NOW)["scheduled"] == 2
        _edit(task)
        after = _sha(task)
        with caplog.at_level("INFO", logger="lstar.events"):
            counts = schedule_observations(store, [policy], now=NOW + timedelta(minutes=5))
        assert counts == {"scheduled": 0, "skipped_budget": 0, "superseded": 2}
        assert policy.task_file_sha256("mc.jsonl") == after   # taken on, as a reload would
        assert f"task_file_changed policy=p task=arith file={task.resolve()} was={before[:12]} " \
               f"now={after[:12]}" in caplog.text
        rows = {r["id"]: r for r in store.observations()}
        old = sorted((r for r in rows.values() if r["status"] == "superseded"), key=lambda r: r["id"])
        new = sorted((r for r in rows.values() if r["status"] == "pending"), key=lambda r: r["id"])
        assert [r["run_id"] for r in old] == [r["run_id"] for r in new] == ["a", "b"]
        for o, n in zip(old, new):
            assert o["superseded_by"] == n["id"] and n["meta"] == {"supersedes": o["id"]}
            assert (o["settings"]["task_sha256"], n["settings"]["task_sha256"]) == (before, after)
            assert (n["generation"], n["attempts"], n["scheduled_day"]) == (1, 0, o["scheduled_day"])
            assert o["reason"] == (f"task file {task.resolve()} changed (sha256 {before[:12]} -> {after[:12]}) "
                                   f"before this evaluation ran; evaluation {n['id']} runs the new file")
        # the replacements take the superseded rows' place in the day's budget: no more, no less
        assert store.observations_started_on("p", NOW.date()) == 2
        assert schedule_observations(store, [policy], now=NOW + timedelta(minutes=6)) == \
            {"scheduled": 0, "skipped_budget": 0, "superseded": 0}
        # the new evaluation completes, and counts in the track record once
        _observe(store, "a", 1.0, 20, curve_id="cid", at=NOW + timedelta(minutes=7))
        assert store.observation(new[0]["id"])["status"] == "done"
        assert [r["id"] for r in store.track_record("p")] == [new[0]["id"]]
        report = build_report(store, policy, now=NOW + timedelta(hours=1), period_start=NOW - timedelta(days=1))
    superseded = report["superseded_evaluations"]
    assert [(s["id"], s["superseded_by"], s["task_sha256"], s["by_task_sha256"], s["by_status"])
            for s in superseded] == [(old[0]["id"], new[0]["id"], before, after, "done"),
                                     (old[1]["id"], new[1]["id"], before, after, "pending")]
    text = to_markdown(report)
    assert "### Superseded evaluations" in text
    assert f"| {old[0]['id']} | arith | org/m@{'a' * 8} | `{before[:12]}` | {new[0]['id']} | `{after[:12]}` | done |" \
        in text
    html = to_html(report, {})
    assert "Superseded evaluations" in html and f"<code>{after[:12]}</code>" in html


def test_a_changed_task_file_that_does_not_load_keeps_the_evaluations_waiting(tmp_path, curve):
    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    before = _sha(task)
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        schedule_observations(store, [policy], now=NOW)
        task.write_text("not json\n")
        assert schedule_observations(store, [policy], now=NOW)["superseded"] == 0
        [row] = store.observations()
        assert (row["status"], row["settings"]["task_sha256"]) == ("pending", before)
        assert policy.task_file_sha256("mc.jsonl") == before   # the last good file stays the policy's
        [check] = check_task_files([policy]).values()
        assert check.problem.startswith(f"policy p: task arith: task file {task.resolve()} changed since the policy "
                                        "was loaded and does not load: ")
        # the evaluation cannot run on the bad file: it is handed back, not failed
        with pytest.raises(TaskFileNotAsScheduled, match="changed since the evaluation was scheduled"):
            task_file_as_scheduled(row["settings"], tmp_path / "work")
        _mc(task)   # restored: the evaluation runs on exactly the bytes it was scheduled with
        copy = task_file_as_scheduled(row["settings"], tmp_path / "work")
        assert copy.name == "mc.jsonl" and _sha(copy) == before and copy != task


def _legacy_row(store: Store, run: str, settings: dict, reason: str, *, attempts: int = 1) -> None:
    """An observation as the code before supersession (before migration 0014) left it: failed."""
    store.conn.execute(
        "INSERT INTO observations (policy, task, run_id, prediction_id, repo, commit_sha, lineage, curve_id, "
        "predicted_state, predicted_lo, predicted_hi, level, confidence, settings, status, reason, attempts, "
        "scheduled_day, created_at, updated_at, finished_at) VALUES ('p', 'arith', ?, 1, 'org/m', ?, 'org/m', "
        "'cid', 'at_risk', 0.28, 0.32, 0.3, 0.9, ?, 'failed', ?, ?, ?, ?, ?, ?)",
        [run, run * 8, json.dumps(settings), reason, attempts, NOW.date(), NOW, NOW, NOW])


def test_evaluations_the_old_code_failed_for_a_changed_file_are_rescheduled_once_by_the_migration(tmp_path,
                                                                                                   curve):
    from monitor.store.migrations import MIGRATIONS

    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    file = str(task.resolve())
    old = {"kind": "multiple_choice", "metric": "acc", "file": file, "task_sha256": "0" * 64}
    before = [m for m in MIGRATIONS if m.name < "0014"]
    with Store.open(tmp_path / "s.duckdb", migrate=False) as store:
        store.migrate(before)
        _legacy_row(store, "a", old, f"task file {file} changed since the evaluation was scheduled (sha256 "
                                     f"0123456789ab, expected 000000000000); schedule it again with the new file")
        # failures that merely quote the words (a Hub-controlled model_type) stay failed
        _legacy_row(store, "b", old, "config.json: unknown architecture, model_type 'task file x changed since the "
                                     "evaluation was scheduled (sha256 '")
        _legacy_row(store, "c", old, f"task file /elsewhere.jsonl changed since the evaluation was scheduled "
                                     f"(sha256 0123456789ab, expected 000000000000)")
    with Store.open(tmp_path / "s.duckdb") as store:
        rows = {r["run_id"]: r for r in store.observations()}
        assert {k: (r["status"], r["attempts"], r["finished_at"]) for k, r in rows.items()} == \
            {"a": ("pending", 0, None), "b": ("failed", 1, NOW), "c": ("failed", 1, NOW)}
        assert schedule_observations(store, [policy], now=NOW)["superseded"] == 1
        statuses = sorted((r["run_id"], r["status"], r["generation"]) for r in store.observations())
    assert statuses == [("a", "pending", 1), ("a", "superseded", 0), ("b", "failed", 0), ("c", "failed", 0)]


def test_a_failure_quoting_the_supersession_words_is_not_rescheduled(tmp_path, curve):
    """A failure's reason can quote the Hub (a config's model_type): whatever it says, a failed
    evaluation stays failed; the day's budget counts it once."""
    from monitor.errors import ModelLoadError

    _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}", per_day=1))
    reason = ModelLoadError("config.json: unknown architecture, model_type "
                            f"{'x changed since the evaluation was scheduled (sha256 '!r}").one_line()
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        schedule_observations(store, [policy], now=NOW)
        claimed = []
        for tick in range(5):
            job = store.claim_observation("me", now=NOW, lease_s=60, max_attempts=3)
            if job is None:
                break
            claimed.append(job["id"])
            store.complete_observation(job["id"], "me", status="failed", now=NOW, reason=reason)
            assert schedule_observations(store, [policy], now=NOW + timedelta(minutes=tick + 1))["superseded"] == 0
        assert len(claimed) == 1   # the old tick rescheduled it every time, past max_attempts
        assert store.observations_started_on("p", NOW.date()) == 1
        assert [(r["status"], r["generation"], r["reason"]) for r in store.observations()] == \
            [("failed", 0, reason)]


@pytest.mark.slow   # an evaluation child (torch) on a tiny model from the fake Hub
def test_an_evaluation_whose_file_changed_waits_then_its_replacement_completes(tmp_path, curve):
    from monitor.jobs.observe import run_observations
    from monitor.demo.fakehub import FakeHub
    from monitor.demo.hub_repos import tiny_model_files
    from monitor.hub.client import HubClient
    from tests.test_daemon_observe import mc_task

    task = mc_task(tmp_path / "mc.jsonl", right=True, items=4)
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with FakeHub() as hub, Store.open(tmp_path / "s.duckdb") as store:
        sha = hub.add_repo("org/m", tiny_model_files("gpt2", arch="llama", seed=3))
        store.write_outbox([{"policy": "p", "task": "arith", "run_id": "r0", "repo": "org/m", "commit_sha": sha,
                             "lineage": "org/m", "corpus_sha256": "c" * 64, "lstar": 5.0, "se": 0.1, "p_hat": 0.3,
                             "lo": 0.28, "hi": 0.32, "threshold": 0.3, "state": "at_risk", "curve_id": "cid",
                             "detail": {"confidence": 0.9}, "evaluated_at": NOW}], now=NOW)

        def tick(at):
            counts = schedule_observations(store, [policy], now=at)
            ran = run_observations(store, [policy], owner="me", state_dir=tmp_path / "state",
                                   client=HubClient(hub.url, store=store), cache_dir=tmp_path / "cache",
                                   timeout_s=300, device="cpu", dtype="float32", now_fn=lambda: at)
            return counts, ran

        counts = schedule_observations(store, [policy], now=NOW)
        assert counts["scheduled"] == 1
        mc_task(task, right=True, items=6)   # edited between scheduling and running
        ran = run_observations(store, [policy], owner="me", state_dir=tmp_path / "state",
                               client=HubClient(hub.url, store=store), cache_dir=tmp_path / "cache",
                               timeout_s=300, device="cpu", dtype="float32", now_fn=lambda: NOW)
        assert [(r["status"], r.get("waiting")) for r in ran] == [("pending", True)]   # waits, not failed
        [waiting] = store.observations()
        assert waiting["attempts"] == 0 and waiting["reason"].startswith("waiting for its task file: task file ")
        counts, ran = tick(NOW + timedelta(minutes=1))
        rows = sorted(store.observations(), key=lambda r: r["id"])
    assert counts["superseded"] == 1
    assert [r["status"] for r in ran] == ["done"]
    assert [(r["status"], r["generation"]) for r in rows] == [("superseded", 0), ("done", 1)]
    assert rows[0]["superseded_by"] == rows[1]["id"]
    assert (rows[1]["observed"], rows[1]["n"]) == (1.0, 6)   # the new file's six items


def _second_policy(folder: Path, curve: Path) -> Path:
    """Policy `q`, like `p` of `_policy` but in its own folder with its own task file."""
    folder.mkdir()
    _mc(folder / "mc.jsonl")
    path = _policy(folder, curve, "{file: mc.jsonl}")
    path.write_text(path.read_text().replace("name: p\n", "name: q\n", 1))
    return path


def _prediction_of(store: Store, policy: str, run: str) -> None:
    store.write_outbox([{"policy": policy, "task": "arith", "run_id": run, "repo": "org/m", "commit_sha": run * 8,
                         "lineage": "org/m", "corpus_sha256": "c" * 64, "lstar": 5.0, "se": 0.1, "p_hat": 0.3,
                         "lo": 0.28, "hi": 0.32, "threshold": 0.3, "state": "at_risk", "curve_id": "cid",
                         "detail": {"confidence": 0.9}, "evaluated_at": NOW}], now=NOW)


@pytest.mark.parametrize("content,why", [
    ('{"id": {}, "context": "Q", "choices": ["a", "b"], "answer": 1}\n',
     ":1: 'id' must be a non-empty string or an integer"),
    ("[" * 100_000 + "\n", ":1: not JSON (nested too deeply to decode)"),
    ('{"id": "a", "context": "Q", "choices": ["a", "b"], "answer": ' + "1" * 5000 + "}\n",
     ":1: not JSON (Exceeds the limit (4300 digits) for integer string conversion"),
    ('{"id": "a", "context": "Q", "choices": ["a", "b"], "answer": 0, "slice": ["x"]}\n',
     "('a'): 'slice' must be a string when given"),
    ("symlink loop", "cannot read: RuntimeError: Symlink loop from"),
], ids=["dict id", "deep", "big int", "list slice", "symlink loop"])
def test_a_task_file_edited_into_any_shape_holds_back_only_its_own_evaluations(tmp_path, curve, content, why):
    task = _mc(tmp_path / "mc.jsonl")
    bad = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    good = load_policy(_second_policy(tmp_path / "q", curve))
    if content == "symlink loop":
        task.unlink()
        os.symlink("mc.jsonl", task)   # the task file replaced by a link to itself
    else:
        task.write_text(content)       # edited after the policy loaded
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        _prediction_of(store, "q", "b")
        counts = schedule_observations(store, [bad, good], now=NOW)   # the old tick raised here
        assert counts == {"scheduled": 1, "skipped_budget": 0, "superseded": 0}
        job = store.claim_observation("me", now=NOW, lease_s=60, max_attempts=3)
        assert (job["policy"], job["run_id"]) == ("q", "b")   # the other policy's evaluation runs
        assert task_file_as_scheduled(job["settings"], tmp_path / "work").read_bytes() == \
            (tmp_path / "q" / "mc.jsonl").read_bytes()
    checks = check_task_files([bad, good])
    problem = checks[("p", "arith")].problem
    assert checks[("q", "arith")].problem is None
    assert problem.startswith("policy p: task arith: ") and why in problem
    assert "\n" not in problem and len(problem) < 500
    assert problem.endswith("its evaluations wait until it is mended") or \
        problem.endswith("(fix it, or restore the file)")


@pytest.mark.parametrize("content,message", [
    ('{"id": {}, "context": "Q", "choices": ["a", "b"], "answer": 1}', "'id' must be a non-empty string"),
    ('{"id": [1], "context": "Q", "choices": ["a", "b"], "answer": 1}', "'id' must be a non-empty string"),
    ("[" * 100_000, "not JSON (nested too deeply to decode)"),
    ('{"id": 1, "context": "Q", "choices": ["a", "b"], "answer": 1}\n'
     '{"id": "1", "context": "Q", "choices": ["a", "b"], "answer": 1}', ":2 ('1'): duplicate id"),
], ids=["dict id", "list id", "deep", "int and string id"])
def test_parse_mc_task_refuses_hostile_shapes_as_label_errors(tmp_path, content, message):
    (tmp_path / "t.jsonl").write_text(content + "\n")
    with pytest.raises(LabelError) as info:
        load_mc_task(tmp_path / "t.jsonl")
    assert message in info.value.one_line()


def test_task_file_lines_split_on_newlines_only(tmp_path):
    """JSON allows U+2028, U+0085 and form feed raw inside strings: they do not end a line."""
    context = "Q\u2028more\x85and\x0cmore?"
    path = tmp_path / "t.jsonl"
    path.write_bytes((json.dumps({"id": "a", "context": context, "choices": [" y", " n"], "answer": 0},
                                 ensure_ascii=False) + "\r\n").encode())
    [item] = load_mc_task(path).items
    assert item.context == context


def test_the_status_summary_does_not_grow_with_supersessions(tmp_path, curve):
    from monitor.store.observations import SUPERSEDED_SUMMARY

    task = _mc(tmp_path / "mc.jsonl")
    policy = load_policy(_policy(tmp_path, curve, "{file: mc.jsonl}"))
    with Store.open(tmp_path / "s.duckdb") as store:
        _prediction(store, "a", lo=0.28, hi=0.32, state="at_risk", curve_id="cid", at=NOW)
        schedule_observations(store, [policy], now=NOW)
        for minute in range(1, 5):   # four edits, four supersessions, each with its own reason
            with task.open("a") as handle:
                handle.write(json.dumps({"id": f"q{minute}", "context": "Q?", "choices": [" a", " b"],
                                         "answer": 0}) + "\n")
            assert schedule_observations(store, [policy], now=NOW + timedelta(minutes=minute))["superseded"] == 1
        summary = store.observation_summary()
    assert [(r["status"], r["reason"], r["n"]) for r in summary] == [("pending", None, 1),
                                                                     ("superseded", SUPERSEDED_SUMMARY, 4)]
