"""DuckDB's placement of a checkpoint (`monitor.store.placement_sql`) equals
`training_order.place` wherever it says it is exact (`canonical`), and says it is not exact for
the inputs the two engines read differently; a report orders such a lineage by Python's placement.

Python's `place` is the reference: every case below is placed by both, from the same stored
JSON, and compared as (step, microseconds since the epoch)."""

from __future__ import annotations

import json
import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb

from monitor.store.placing import META_COLUMNS, META_SET, META_VALUES, PLACEMENT_EXTRACT
from monitor.store.placement_sql import canonical_sql, placed_time_sql, refs_list_sql, step_sql
from monitor.training_order import lineage_order, place, time_key

DISCOVERED = datetime(2026, 5, 1, 12, tzinfo=timezone.utc)
SCORED = datetime(2026, 5, 2, 12, tzinfo=timezone.utc)


def sql_places(cases: list[tuple[str | None, str | None, datetime | None]]) -> list[tuple[int | None, int | None, bool]]:
    """(step, time in µs, canonical) of each (refs JSON, meta JSON, discovered_at) case, by DuckDB."""
    conn = duckdb.connect()
    conn.execute("SET TimeZone = 'America/New_York'")   # a string without offset is UTC whatever the session says
    conn.execute("CREATE TABLE c (i INTEGER, refs JSON, meta JSON, discovered_at TIMESTAMPTZ, scored_at TIMESTAMPTZ)")
    conn.executemany("INSERT INTO c VALUES (?, ?, ?, ?, ?)",
                     [[i, refs, meta, discovered, SCORED] for i, (refs, meta, discovered) in enumerate(cases)])
    refs_list = refs_list_sql("refs")
    rows = conn.execute(
        f"SELECT {step_sql(refs_list)}, epoch_us({placed_time_sql(refs_list, 'placed', 'discovered_at', 'scored_at')}), "
        f"coalesce({canonical_sql('refs', 'placed')}, true) FROM (SELECT *, {PLACEMENT_EXTRACT.format(meta='meta')} "
        "AS placed FROM c) ORDER BY i").fetchall()
    return [tuple(row) for row in rows]


def python_place(refs: str | None, meta: str | None, discovered: datetime | None) -> tuple[int | None, int | None]:
    decoded_refs = json.loads(refs) if refs is not None else None
    where = place(decoded_refs if isinstance(decoded_refs, list) else [], json.loads(meta) if meta else {},
                  discovered, SCORED)
    return where.step, time_key(where.time)


def meta_with(commit_date=None, last_modified=None) -> str:
    meta: dict = {"fetch": {"files": ["model.safetensors"]}}
    if commit_date is not None:
        meta["gate"] = {"commit_date": commit_date, "checks": ["x"] * 3}
    if last_modified is not None:
        meta["listing"] = {"last_modified": last_modified}
    return json.dumps(meta)


EXACT = [   # (refs, meta, discovered_at): DuckDB places these as Python does
    (json.dumps(["step1000"]), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),
    (json.dumps(["checkpoint-5", "global_step20", "ckpt_7"]), meta_with("2026-11-29T07:19:47+05:30"), DISCOVERED),
    (json.dumps(["STEP7"]), meta_with("2026-11-29T07:19:47"), None),            # no offset: UTC
    (json.dumps(["step_00012"]), meta_with("2026-11-29T07:19:47.5-03:00"), DISCOVERED),
    (json.dumps(["v2step3", "xstep5_step6"]), meta_with("2026-11-29T07:19:47.000001Z"), DISCOVERED),
    (json.dumps(["main"]), meta_with(None, "2026-03-01T00:00:00Z"), DISCOVERED),   # the listing's date
    (json.dumps(["main"]), meta_with("2026-02-30T00:00:00Z", "2026-03-01T00:00:00Z"), DISCOVERED),  # impossible date
    (json.dumps(["main", "step3"]), meta_with(None, "2026-03-01T00:00:00Z"), DISCOVERED),  # not the main head alone
    (json.dumps(["step"]), meta_with(12345), DISCOVERED),                        # a number names no time
    (json.dumps([]), meta_with(""), None),                                       # empty: scored time
    (None, None, None),                                                          # no checkpoint row
    ("null", "[1, 2]", DISCOVERED),
    (json.dumps(["step9" * 3]), json.dumps({"gate": "2026-11-29T07:19:47Z"}), DISCOVERED),
    (json.dumps(["a-step3-b", "ckpt99999999999999999"]), meta_with("1999-12-31T23:59:59Z"), DISCOVERED),
]
NOT_EXACT = [   # read differently by the two engines: flagged, so Python places them
    (json.dumps(["ſtep5"]), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),     # case folding beyond ASCII
    (json.dumps(["step1\u0663"]), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),  # an Arabic-Indic digit
    (json.dumps(["step" + "9" * 25]), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),   # past 64 bits
    (json.dumps([1, "step2"]), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),
    (json.dumps({"step4": 1}), meta_with("2026-11-29T07:19:47Z"), DISCOVERED),
    (json.dumps(["step1"]), meta_with("2026-11-29"), DISCOVERED),               # a date alone
    (json.dumps(["step1"]), meta_with("2026-11-29 07:19:47"), DISCOVERED),      # a space for T
    (json.dumps(["step1"]), meta_with("2026-11-29T24:00:00"), DISCOVERED),
    (json.dumps(["step1"]), meta_with("0000-01-01T00:00:00Z"), DISCOVERED),
    (json.dumps(["main"]), meta_with(None, "2026-11-29T07:19:47.1234567Z"), DISCOVERED),
]


def test_duckdb_places_the_exact_cases_as_python_does() -> None:
    got = sql_places(EXACT)
    for case, (step, when, canonical) in zip(EXACT, got):
        assert canonical, case
        assert (step, when) == python_place(*case), case
    # the hand-worked values, not only agreement: the largest step, the offset applied, the listing
    assert got[1][0] == 20 and got[4][0] == 6 and got[13][0] == 99_999_999_999_999_999
    assert got[1][1] == time_key(datetime(2026, 11, 29, 1, 49, 47, tzinfo=timezone.utc))
    assert got[5][1] == got[6][1] == time_key(datetime(2026, 3, 1, tzinfo=timezone.utc))
    assert got[7][1] == time_key(DISCOVERED) and got[9][1] == time_key(SCORED)


def test_inputs_the_engines_read_differently_are_flagged() -> None:
    assert [canonical for _, _, canonical in sql_places(NOT_EXACT)] == [False] * len(NOT_EXACT)


def test_generated_inputs_agree_wherever_duckdb_says_it_is_exact() -> None:
    rng = random.Random(39)
    words = ["step", "STEP", "Step", "checkpoint", "ckpt", "global_step", "v2step", "main", "x", "-", "_", "/",
             "0", "7", "12", "00042", "ſ", "٣", "é"]

    def ref() -> str:
        return "".join(rng.choice(words) for _ in range(rng.randint(0, 5)))

    def moment() -> object:
        kind = rng.random()
        if kind < 0.1:
            return rng.choice([None, "", 7, "soon", "2026-11-29"])
        text = (f"{rng.randint(1, 9999):04d}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}"
                f"T{rng.randint(0, 24):02d}:{rng.randint(0, 60):02d}:{rng.randint(0, 60):02d}")
        if rng.random() < 0.4:
            text += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 7)))
        return text + rng.choice(["", "Z", "+00:00", "-05:30", "+23:59", "+24:00", "z"])

    cases = []
    for _ in range(3000):
        refs = [ref() for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.3:
            refs = ["main"]
        cases.append((json.dumps(refs, ensure_ascii=rng.random() < 0.5), meta_with(moment(), moment()),
                      rng.choice([None, DISCOVERED])))
    got = sql_places(cases)
    exact = 0
    for case, (step, when, canonical) in zip(cases, got):
        if canonical:
            exact += 1
            assert (step, when) == python_place(*case), case
    assert exact > 600   # a good share compared (869 with this seed), not flagged


def test_a_report_orders_a_lineage_duckdb_cannot_place_by_python(tmp_path) -> None:
    """Two checkpoints of one lineage whose steps are unnamed: the later by commit date is
    current. Its date is written as a date alone, which only Python reads (as midnight UTC),
    so the report places it with `training_order.place`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import scale_state as ss

    from monitor.reports.report import build_report
    from monitor.store import Store

    end = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)
    policy = ss.load_bench_policy(ss.write_policy(tmp_path))
    with Store.open(tmp_path / "lstar.duckdb") as store:
        repo = ss.repo_name(0)
        for i in range(2):
            ss.record_checkpoint(store, policy, repo, i, ss.lstar_of(0, i, 2), end - timedelta(days=30 - i))
        with store.transaction() as conn:
            conn.execute("UPDATE checkpoints SET refs = '[\"release\"]'")
            first, second = meta_with("2026-05-20"), meta_with("2026-05-10T00:00:00Z")
            conn.execute(f"UPDATE checkpoints SET {META_SET} WHERE sha = ?",
                         [first, first, ss.commit_sha(repo, 0)])   # the first scored, released later
            conn.execute(f"UPDATE checkpoints SET {META_SET} WHERE sha = ?", [second, second, ss.commit_sha(repo, 1)])
        data = build_report(store, policy, now=end, period_start=end - timedelta(days=7))
    family = data["families"][0]
    assert family["order"] == "release time"
    assert ss.commit_sha(repo, 0)[:7] in family["current"] and ss.commit_sha(repo, 1)[:7] not in family["current"]
    assert [row["commit"] for row in data["lineage_history"]] == [ss.commit_sha(repo, 1), ss.commit_sha(repo, 0)]


def test_duckdb_ranks_follow_the_rule_over_generated_lineages(tmp_path) -> None:
    """`ReportRanks` ranks each lineage's checkpoints as `training_order.lineage_order` orders
    Python's placements: by step only where every checkpoint names one, ties broken by time,
    then commit, then repo; a lineage with one checkpoint DuckDB cannot place is re-ranked by
    the report (`history.lineage_rows`), and its rows are left for that."""
    from monitor.reports.history import _rerank_inexact
    from monitor.store import Store

    rng = random.Random(41)
    end = datetime(2026, 6, 1, tzinfo=timezone.utc)
    days = [datetime(2026, 5, d, tzinfo=timezone.utc) for d in (1, 2, 3)]   # few: ties in time
    expected: dict[str, list[str]] = {}
    with Store.open(tmp_path / "lstar.duckdb") as store:
        with store.transaction() as conn:
            ident = 0
            for n in range(40):
                lineage, rows = f"org/l{n}", []
                stepped = rng.random() < 0.5
                for i in range(rng.randint(1, 6)):
                    ident += 1
                    repo = f"org/l{n}" if rng.random() < 0.7 else f"org/l{n}-ft"
                    sha = rng.choice(["a", "b", "c"]) * 40 if rng.random() < 0.5 else f"{ident:040x}"
                    refs = [f"step{rng.randint(0, 3) * 100}"] if stepped or rng.random() < 0.3 else ["main"]
                    when = rng.choice(days)
                    meta = meta_with(when.isoformat().replace("+00:00", "Z") if rng.random() < 0.6 else None,
                                     rng.choice(days).isoformat())
                    if n == 7 and i == 0:
                        meta = meta_with("2026-05-02")   # only Python reads a date alone
                    if (repo, sha) in {(r, s) for r, s, *_ in rows}:
                        continue
                    conn.execute("INSERT INTO checkpoints (id, repo, sha, source, refs, lineage, rule, discovered_at, "
                                 f"updated_at, status, attempts, {META_COLUMNS}) VALUES (?, ?, ?, 'hub', ?, ?, 'r', ?, ?, "
                                 f"'scored', 0, {META_VALUES})",
                                 [ident, repo, sha, json.dumps(refs), lineage, DISCOVERED, end, meta, meta])
                    conn.execute("INSERT INTO score_runs (run_id, checkpoint_id, model_repo, model_sha, model_source, "
                                 "tokenizer_fingerprint, corpus_sha256, spec_version, window_len, stride, prefix_policy, "
                                 "dtype, device, n_tokens, n_bytes, nll_sum, ce, ce_unigram, lstar, l_rel, l_gain, "
                                 "bits_per_byte, tokens_per_byte, se_ce, slices, spec, model, library_versions, wall_s, "
                                 "tokens_per_s, finished_at, partial) VALUES (?, ?, ?, ?, 'hub', 't', 'c', '1', 8, 8, "
                                 "'p', 'float32', 'cpu', 10, 40, 10, 1, 1, 0, 0, 0, 1, 0.25, 0.1, '[]', '{}', '{}', "
                                 "'{}', 1, 10, ?, false)", [f"run{ident}", ident, repo, sha, SCORED])
                    rows.append((repo, sha, place(refs, json.loads(meta), DISCOVERED, SCORED), f"run{ident}"))
                # the rule itself (`lineage_order`, on Python's placements), ties by commit then repo
                ordered = lineage_order(rows, lambda row: row[2], lambda row: (row[1], row[0]))
                expected[lineage] = [row[3] for row in ordered]
        with store.report_ranks(None, start=end - timedelta(days=60), end=end, watched=None) as ranks:
            _rerank_inexact(store, ranks)
            got: dict[str, list[str]] = {}
            for lineage, run, _ in ranks.history(sorted(expected)):
                got.setdefault(lineage, []).append(run)
    assert got == expected
    assert any(len(v) > 3 for v in expected.values())
