"""The schema migrations as SQL files: the same steps under the same names as the databases
already written expect, and a runner that refuses a folder it cannot order."""

from __future__ import annotations

import hashlib

import pytest

from monitor.errors import StoreError
from monitor.store import MIGRATIONS, Store
from monitor.store.migrations import load_migrations

# The names recorded in `schema_migrations` by every database written so far, and the sha256 of
# each migration's SQL with its whitespace collapsed, taken from the statements as they stood
# before they moved into files: a database created then opens now with nothing pending, and the
# files create the same schema.
RECORDED = {
    "0001_scoring": "a497ba1705f302ddef7a79c984c47c7febef731c04ef4e9db8e5688db4c528fa",
    "0002_labels": "7667be1b66c3122fad39f92f74cc3e483887e01b05cacd38a95cec87ec37bd08",
    "0003_hub": "f913d09e465e872619658bc8abc29e333f93c77b797fff3735578b187434c9df",
    "0004_alerts": "d6a04ea65a5be6d25da9d7ef9f588b28e2788303c72c1df35164ee5e5a50111c",
    "0005_reports": "6e684c6f9e1ad7a682e2bd0cf23ac0c07026ba0a6daa65fbf68b9e882884f941",
    "0006_score_digests": "6b57df74403418826556ac58d9752ef7dca1809fba55adbcb918abb6ea8689f1",
    "0007_lease_starts": "cfbe0a0e2d70bc1dbb9bba621b3d72b1dcb90d87de03aee611d4af18615698c3",
    "0008_evaluation_gaps": "3dd8e020a53d24f7b79eb7e0fcdf48be9d64842da3f6e241bdf0655c16d20be5",
    "0009_axis_se": "b1463e2f744082a6fcaa8e2a6f79e442dce8e6487cfd6a1502b68e74e1c0fa35",
    "0010_incremental_jobs": "45944f623617db19cebec7454d552d7ea2a85b9b2f6086c0081a1370f4beae48",
    "0011_partial_scores": "2245633fcdfbb491299c2d13a51ddad9376fb563599c942c943438cd55b32f9e",
    "0012_checkpoint_bases": "bb9b04d643b2d5379049e922f590546913f33c53bd459675a8392b0b67acc4d5",
    "0013_observations": "5fd8b543700b484ce620dda677d5f431601294a99c7f5ccb308bd7640d621ba6",
    "0014_superseded_observations": "c58253dda0187325c5a1f47655dcb20b380189747c14021bad8063be9b226db0",
    "0015_policy_changes": "0eed4f20ad7624af42fdfe3fa83ebff674bae630ee0e169397a9d6c06e2397f8",
    "0016_stress_results": "f7e91be728e758e498c2b7c489f01edc1117667f84a3e0746bc4586d6d43de2a",
    "0017_placing_values": "82a47096ce48890220dcbc7a63fe8c5da457034207f019be73f6949db6583aaa",
}


def _digest(sql: str) -> str:
    return hashlib.sha256(" ".join(sql.split()).encode()).hexdigest()


def test_the_files_are_the_migrations_databases_already_recorded():
    assert [m.name for m in MIGRATIONS] == list(RECORDED)
    assert {m.name: _digest(m.sql) for m in MIGRATIONS} == RECORDED


def test_a_database_recorded_with_the_old_names_has_nothing_pending(tmp_path):
    path = tmp_path / "old.duckdb"
    with Store.open(path) as store:
        recorded = [r[0] for r in store.conn.execute(
            "SELECT name FROM schema_migrations ORDER BY applied_at, name").fetchall()]
        assert recorded == list(RECORDED)
    with Store.open(path, read_only=True) as reader:
        assert reader.pending_migrations() == []


def _folder(tmp_path, *names: str):
    for name in names:
        (tmp_path / name).write_text(f"-- {name}\nSELECT 1;\n", encoding="utf-8")
    return tmp_path


def test_files_load_in_number_order_and_other_files_are_ignored(tmp_path):
    folder = _folder(tmp_path, "0002_second.sql", "0001_first.sql", "README.md")
    loaded = load_migrations(folder)
    assert [m.name for m in loaded] == ["0001_first", "0002_second"]
    assert loaded[1].sql == "-- 0002_second.sql\nSELECT 1;\n"


def test_a_gap_in_the_numbers_is_refused(tmp_path):
    folder = _folder(tmp_path, "0001_first.sql", "0003_third.sql")
    with pytest.raises(StoreError) as err:
        load_migrations(folder)
    assert err.value.message == "migration file 0003_third.sql skips number 0002"
    assert "renumber it 0002" in err.value.hint


def test_the_numbers_start_at_one(tmp_path):
    with pytest.raises(StoreError, match="migration file 0002_first.sql skips number 0001"):
        load_migrations(_folder(tmp_path, "0002_first.sql"))


def test_a_repeated_number_is_refused(tmp_path):
    folder = _folder(tmp_path, "0001_first.sql", "0002_alerts.sql", "0002_reports.sql")
    with pytest.raises(StoreError) as err:
        load_migrations(folder)
    assert err.value.message == ("migration files 0002_alerts.sql and 0002_reports.sql share the "
                                 "number 0002")


@pytest.mark.parametrize("name", ["1_short.sql", "0001-dash.sql", "0001_Upper.sql", "0001_.sql"])
def test_a_badly_named_file_is_refused(tmp_path, name):
    with pytest.raises(StoreError, match=f"migration file {name} is not named NNNN_name.sql"):
        load_migrations(_folder(tmp_path, name))


def test_observations_keep_their_rows_when_supersession_arrives(tmp_path):
    """0014 copies the observations table into one keyed by (policy, task, run, generation)."""
    path = tmp_path / "old.duckdb"
    before = [m for m in MIGRATIONS if m.name != "0014_superseded_observations"]
    with Store.open(path, migrate=False) as store:
        store.migrate(before)
        store.conn.execute(
            "INSERT INTO observations (policy, task, run_id, prediction_id, repo, commit_sha, lineage, curve_id, "
            "predicted_state, predicted_lo, predicted_hi, level, confidence, settings, status, scheduled_day, "
            "created_at, updated_at) VALUES ('p', 't', 'r', 1, 'o/m', 'abc', 'o/m', 'c', 'at_risk', 0.1, 0.2, 0.3, "
            "0.9, '{}', 'pending', DATE '2026-03-02', now(), now())")
    with Store.open(path) as store:
        rows = store.query("SELECT id, run_id, status, generation, superseded_by FROM observations")
        assert rows == [{"id": 1, "run_id": "r", "status": "pending", "generation": 0, "superseded_by": None}]
        again = store.conn.execute(   # the sequence goes on where it was
            "INSERT INTO observations (policy, task, run_id, prediction_id, repo, commit_sha, lineage, curve_id, "
            "predicted_state, predicted_lo, predicted_hi, level, confidence, settings, status, scheduled_day, "
            "created_at, updated_at, generation) VALUES ('p', 't', 'r', 1, 'o/m', 'abc', 'o/m', 'c', 'at_risk', "
            "0.1, 0.2, 0.3, 0.9, '{}', 'pending', DATE '2026-03-02', now(), now(), 1) RETURNING id").fetchone()
        assert again == (2,)
