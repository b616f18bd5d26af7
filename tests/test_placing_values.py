"""`checkpoints.placing_values` is always `PLACEMENT_EXTRACT` of the row's meta.

Every reader that places a checkpoint in its lineage reads the stored values instead of parsing
the meta (`monitor.store.placing`), so a write of a meta that left them behind would misplace a
checkpoint silently. Two checks: every SQL statement in the code that writes a checkpoint's meta
writes the column in the same statement (read from the source), and after the store's own
writers (discovery, the gate's verdict, a lease's progress, completion and reclaim, a reference
base) the column equals DuckDB's extraction from the meta, row by row."""

from __future__ import annotations

import ast
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from monitor.hub.poll import Candidate
from monitor.store import Store
from monitor.store.placing import PLACEMENT_EXTRACT

ROOT = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 6, 1, 12, tzinfo=timezone.utc)
# a statement that writes the checkpoints table
# (anywhere in it: after a WITH clause too; the table named plainly, quoted or with its schema)
_WRITE = re.compile(r"\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|MERGE\s+INTO)\s+(?:\w+\.)?\"?checkpoints\b",
                    re.IGNORECASE)
# ... and writes its meta: an INSERT's column list or an UPDATE's SET names it
_WRITES_META = re.compile(r"\(\s*[^()]*\bmeta\b[^()]*\)\s*(?:VALUES|SELECT)|\bSET\b.*\bmeta\s*=|\{META_(?:SET|COLUMNS)\}",
                          re.IGNORECASE | re.DOTALL)
# ... and the placing values with it
_WRITES_PLACING = re.compile(r"\bplacing_values\b|\{META_SET\}|\{META_COLUMNS\}")


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's with each `{name}` kept as written; a statement
    built with `+` or `.format` from literals, the pieces joined (a piece that is not a literal
    kept as `{expression}`), so a meta column in any piece is seen."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            else:
                parts.append("{" + ast.unparse(part.value) + "}")   # type: ignore[attr-defined]
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is None and right is None:
            return None
        return "".join(t if t is not None else "{" + ast.unparse(n) + "}"
                       for t, n in ((left, node.left), (right, node.right)))
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
            and not node.keywords):
        template = _text(node.func.value)
        if template is None:
            return None
        args = [_text(a) if _text(a) is not None else "{" + ast.unparse(a) + "}" for a in node.args]
        try:
            return template.format(*args)
        except (IndexError, KeyError, ValueError):
            return " ".join([template, *args])
    return None


# the node types `_text` reads a text from (it answers None for every other)
_TEXT_NODES = (ast.Constant, ast.JoinedStr, ast.BinOp, ast.Call)


def _pieces(node: ast.AST) -> list[ast.AST]:
    """The nodes `_text` read to give `node`'s text (each is not a statement of its own)."""
    if isinstance(node, ast.JoinedStr):
        return list(node.values)
    if isinstance(node, ast.BinOp):
        return [node.left, node.right, *_pieces(node.left), *_pieces(node.right)]
    if isinstance(node, ast.Call):
        inner = [node.func, node.func.value, *node.args] if isinstance(node.func, ast.Attribute) else []
        return [*inner, *(p for n in inner for p in _pieces(n))]
    return []


def meta_writes(paths: list[Path]) -> list[tuple[str, int, str]]:
    """(file, line, statement) of every string literal that writes a checkpoint's meta."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        # Only these nodes have a text; each is read once, in one walk (two walks reading every
        # node twice: 6.5 CPU-seconds for this file, most of it this scan of ~500 files).
        texts = [(node, text) for node in ast.walk(tree) if isinstance(node, _TEXT_NODES)
                 if (text := _text(node)) is not None]
        # a piece of a larger statement (an f-string's, a `+`'s, a `.format`'s), read with the whole
        inner = {id(part) for node, _ in texts for part in _pieces(node)}
        for node, text in texts:
            if id(node) in inner:
                continue
            if text and _WRITE.search(text) and _WRITES_META.search(text):
                found.append((str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), node.lineno, text))
    return found


def _sources() -> list[Path]:
    return sorted(p for folder in ("monitor", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py")
                  if p.name != Path(__file__).name)


def test_every_statement_that_writes_a_meta_writes_the_placing_values() -> None:
    writes = meta_writes(_sources())
    # the store's own writers are seen (a scan that found nothing would pass for the wrong reason)
    seen = {file for file, _, _ in writes}
    assert {"monitor/store/checkpoints.py", "monitor/store/hub.py", "monitor/store/derivatives.py"} <= seen, seen
    missing = [(file, line) for file, line, text in writes if not _WRITES_PLACING.search(text)]
    assert missing == [], f"these statements write checkpoints.meta without placing_values: {missing}"


def test_the_scan_sees_a_statement_that_forgets_them(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text('SQL = ("UPDATE checkpoints SET status = ?, "\n       "meta = ? WHERE id = ?")\n'
                   'INS = f"INSERT INTO checkpoints (repo, sha, meta) VALUES (?, ?, {x})"\n'
                   'OK = f"UPDATE checkpoints SET {META_SET} WHERE id = ?"\n'
                   'REFS = "UPDATE checkpoints SET refs = ? WHERE id = ?"\n'
                   # a statement built with `+`: its meta column in the second piece
                   'CAT = ("INSERT INTO checkpoints (repo, sha, " + f"{cols}" + "meta) VALUES (?, ?, ?)")\n'
                   'FMT = "UPDATE checkpoints SET {} WHERE id = ?".format("meta = ?")\n'
                   # after a WITH clause, and the table quoted with its schema
                   'CTE = "WITH m AS (SELECT 1) UPDATE main.\\"checkpoints\\" SET meta = ? WHERE id = ?"\n')
    flagged = [text for _, _, text in meta_writes([bad])]
    assert len(flagged) == 6                                   # the refs-only update is not a meta write
    assert [bool(_WRITES_PLACING.search(t)) for t in flagged] == [False, False, True, False, False, False]


def _mismatches(store: Store) -> list[tuple]:
    return store.conn.execute(
        f"SELECT id, meta, placing_values FROM checkpoints WHERE placing_values IS DISTINCT FROM "
        f"{PLACEMENT_EXTRACT.format(meta='meta')} ORDER BY id").fetchall()


def test_the_store_writers_keep_the_placing_values_equal_to_the_meta(tmp_path: Path) -> None:
    with Store.open(tmp_path / "lstar.duckdb") as store:
        listed = {"listing": {"last_modified": "2026-05-30T10:00:00.000Z"}, "size": 3}
        cands = [Candidate("org/a", "a" * 40, ("main",), meta=listed),
                 Candidate("org/b", "b" * 40, ("step100",)),                                  # no meta
                 Candidate("org/c", "c" * 40, ("main",), meta={"listing": {"last_modified": 17}})]   # not a string
        store.record_discoveries("key", "watch", "http://hub.invalid", cands, watermark=None, boundary=[],
                                 now=T0, requests=1, listed=3)
        ids = {r.repo: r.id for r in store.list_checkpoints()}
        assert _mismatches(store) == []
        placed = dict(store.conn.execute("SELECT repo, placing_values FROM checkpoints").fetchall())
        assert placed["org/a"] == [None, '"2026-05-30T10:00:00.000Z"'] and placed["org/b"] == [None, None]

        # the gate's verdict merges its facts into the meta
        assert store.set_checkpoint_verdict(ids["org/a"], expect_status="discovered", status="gated", reason=None,
                                            meta={"gate": {"commit_date": "2026-05-29T08:00:00Z", "ok": True}},
                                            now=T0)
        assert store.set_checkpoint_verdict(ids["org/b"], expect_status="discovered", status="gated", reason=None,
                                            meta={"gate": {"commit_date": None}}, now=T0)
        assert _mismatches(store) == []
        # a lease's progress and its completion
        row = store.claim_checkpoint("w1", now=T0, lease_s=60, statuses=["gated"], max_attempts=3)
        assert row is not None
        assert store.advance_checkpoint(row.id, "w1", status="fetched",
                                        meta={"gate": {"commit_date": "2026-05-01T00:00:00+02:00"}}, now=T0)
        assert _mismatches(store) == []
        assert store.complete_checkpoint(row.id, "w1", status="scored", reason=None,
                                         meta={"listing": {"last_modified": "2026-06-01T00:00:00Z"}, "score": {}},
                                         now=T0 + timedelta(minutes=1))
        # a lease of a dead holder reclaimed: the attempt appended to the meta
        held = store.claim_checkpoint("dead", now=T0, lease_s=60, statuses=["gated"], max_attempts=3)
        assert held is not None and [r.owner for r in store.reclaim_checkpoint_leases("w2", now=T0)] == ["dead"]
        assert _mismatches(store) == []
        # a reference base queued as a checkpoint of its own
        assert store.add_reference_base("org/base", "d" * 40, why={"for": "org/a"}, now=T0, rule="~base") is not None
        assert _mismatches(store) == []
        after = dict(store.conn.execute("SELECT repo, placing_values FROM checkpoints").fetchall())
        assert after[row.repo] == ['"2026-05-01T00:00:00+02:00"', '"2026-06-01T00:00:00Z"']
        assert after["org/base"] == [None, None]


def test_the_migration_fills_the_column_from_the_meta(tmp_path: Path) -> None:
    """A state written before the column existed gets it filled from each row's meta."""
    import duckdb

    from monitor.store.migrations import MIGRATIONS

    db = tmp_path / "old.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL)")
    before = [m for m in MIGRATIONS if m.name < "0017"]
    assert before and MIGRATIONS[len(before)].name == "0017_placing_values"
    for m in before:
        conn.execute(m.sql)
        conn.execute("INSERT INTO schema_migrations VALUES (?, now())", [m.name])
    metas = [json.dumps({"gate": {"commit_date": "2026-01-01T00:00:00Z"}, "x": "y" * 50}),
             '{"gate": {"commit_date": "2026-01-01"}, "gate": {"commit_date": "2026-02-02"}}',   # a key twice
             json.dumps({"listing": {"last_modified": [1, 2]}}), "{}"]
    for i, meta in enumerate(metas):
        conn.execute("INSERT INTO checkpoints (repo, sha, source, lineage, discovered_at, updated_at, status, meta) "
                     "VALUES (?, ?, 'hub', ?, ?, ?, 'scored', ?)", [f"org/m{i}", f"{i:040x}", f"org/m{i}", T0, T0, meta])
    conn.close()
    with Store.open(db) as store:
        assert _mismatches(store) == []
        got = [r[0] for r in store.conn.execute("SELECT placing_values FROM checkpoints ORDER BY id").fetchall()]
    assert got == [['"2026-01-01T00:00:00Z"', None], ['"2026-01-01"', None], [None, "[1,2]"], [None, None]]


def test_a_row_inserted_without_a_meta_has_no_placing_values(tmp_path: Path) -> None:
    """A row inserted without a meta gets the column's default, which equals the extraction
    from the default meta `{}`."""
    with Store.open(tmp_path / "lstar.duckdb") as store:
        store.conn.execute("INSERT INTO checkpoints (repo, sha, source, lineage, discovered_at, updated_at, status) "
                           "VALUES ('local:x', ?, 'local', 'local:x', ?, ?, 'scored')", ["e" * 64, T0, T0])
        assert _mismatches(store) == []
        assert store.conn.execute("SELECT placing_values FROM checkpoints").fetchone()[0] == [None, None]
