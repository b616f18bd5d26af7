"""The tests' store template (tests/support/store_template.py): a state file opened from it is
the one a real first open migrates, and only a plain first open is redirected to it."""

from __future__ import annotations

from pathlib import Path

from support.store_template import StoreTemplate, use_template

from monitor.store import MIGRATIONS, Store, connection


def _schema(store: Store) -> list[tuple]:
    """Every column of every table, with its type, default and nullability."""
    return store.conn.execute(
        "SELECT table_name, column_name, data_type, column_default, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position").fetchall()


def _constraints(store: Store) -> list[tuple]:
    return store.conn.execute(
        "SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints() "
        "ORDER BY ALL").fetchall()


def test_an_open_from_the_template_has_the_schema_a_real_open_migrates(tmp_path: Path) -> None:
    with Store.open(tmp_path / "real.duckdb") as real:           # the real open: every migration runs
        expected = (_schema(real), _constraints(real), real.applied_migrations())
        real_sequences = real.query("SELECT sequence_name, start_value FROM duckdb_sequences() ORDER BY 1")
    template = StoreTemplate(tmp_path / "template")
    (tmp_path / "template").mkdir()
    with use_template(template):
        for name in ("a.duckdb", "b.duckdb"):
            with Store.open(tmp_path / name) as store:
                assert (_schema(store), _constraints(store), store.applied_migrations()) == expected
                assert store.applied_migrations() == [m.name for m in MIGRATIONS]
                assert store.query("SELECT sequence_name, start_value FROM duckdb_sequences() ORDER BY 1") \
                    == real_sequences
    assert template.copies == 2
    assert Store.open.__func__ is connection.StoreConnection.__dict__["open"].__func__   # put back


def test_only_a_plain_first_open_starts_from_the_template(tmp_path: Path, monkeypatch) -> None:
    template = StoreTemplate(tmp_path / "template")
    (tmp_path / "template").mkdir()
    with use_template(template):
        with Store.open(tmp_path / "bare.duckdb", migrate=False) as bare:      # migrate=False: nothing applied
            assert bare.applied_migrations() == []
        with Store.open(tmp_path / "kept.duckdb", migrate=False) as kept:      # an existing file is not replaced
            kept.migrate(MIGRATIONS[:1])
            kept.conn.execute("CREATE TABLE mine (x INTEGER)")
        with Store.open(tmp_path / "kept.duckdb") as kept:
            assert kept.query("SELECT count(*) AS n FROM mine") == [{"n": 0}]
        Store.open(tmp_path / "new" / "nested.duckdb").close()                # no folder yet: the real open
        assert template.copies == 0
        monkeypatch.setattr(connection, "MIGRATIONS", MIGRATIONS[:2])          # a test's own migrations
        with Store.open(tmp_path / "two.duckdb") as two:
            assert two.applied_migrations() == [m.name for m in MIGRATIONS[:2]]
        assert template.copies == 0
        monkeypatch.undo()
        Store.open(tmp_path / "plain.duckdb").close()
        assert template.copies == 1


def test_a_first_open_beside_a_left_over_wal_takes_the_real_path(tmp_path: Path) -> None:
    # A WAL with no state file beside it (a file deleted without its WAL): the real open starts
    # a new file; a template copied there would meet a WAL that is not its own and fail.
    import duckdb

    source = tmp_path / "source.duckdb"
    Store.open(source).close()
    conn = duckdb.connect(str(source))
    conn.execute("PRAGMA disable_checkpoint_on_shutdown")
    conn.execute("CREATE TABLE mine (x INTEGER)")
    conn.close()
    wal = Path(str(source) + ".wal")
    assert wal.exists()
    template = StoreTemplate(tmp_path / "template")
    (tmp_path / "template").mkdir()
    with use_template(template):
        (tmp_path / "new.duckdb.wal").write_bytes(wal.read_bytes())
        with Store.open(tmp_path / "new.duckdb") as store:
            assert store.applied_migrations() == [m.name for m in MIGRATIONS]
    assert template.copies == 0
