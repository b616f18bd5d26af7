"""docs/architecture.md lists the daemon's jobs as the code has them ("The jobs, in a
checkpoint's order"): every job module of `monitor/jobs/` once, each with its module, the store
Protocol it defines, the daemon job that runs it (in the order `--once` runs them), and tables
and states that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def job_rows(text: str) -> list[dict[str, str]]:
    """The rows of the table under the `<!-- jobs: monitor/jobs -->` marker."""
    block = re.search(r"<!-- jobs: monitor/jobs -->\n((?:\|.*\|\n)+)", text)
    assert block, "docs/architecture.md has no jobs table under <!-- jobs: monitor/jobs -->"
    lines = block.group(1).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["job", "module", "store Protocol", "scheduled as", "moves a row"], header
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def protocols_in(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef)
            and any(ast.unparse(base) == "Protocol" for base in node.bases)]


def test_the_table_parses_a_hand_written_example() -> None:
    text = ("<!-- jobs: monitor/jobs -->\n| job | module | store Protocol | scheduled as | moves a row |\n"
            "|---|---|---|---|---|\n| prune | `monitor/jobs/prune.py` | `PruneStore` | `prune` | `hub_polls`: x |\n")
    assert job_rows(text) == [{"job": "prune", "module": "`monitor/jobs/prune.py`", "store Protocol": "`PruneStore`",
                               "scheduled as": "`prune`", "moves a row": "`hub_polls`: x"}]


def test_every_job_module_is_listed_once_with_its_module_and_protocol() -> None:
    rows = job_rows(DOC.read_text())
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "monitor" / "jobs").glob("*.py")
                     if p.stem not in ("__init__", "context"))
    listed = [ticked(row["module"])[0] for row in rows]
    assert sorted(listed) == modules and len(set(listed)) == len(listed)
    for row in rows:
        (module,) = ticked(row["module"])
        assert Path(module).stem == row["job"], row
        (protocol,) = ticked(row["store Protocol"])
        assert protocols_in(ROOT / module) == [protocol], (module, protocols_in(ROOT / module))


def test_the_jobs_are_listed_in_the_order_the_daemon_runs_them() -> None:
    from monitor.service.daemon import JOB_NAMES, ONCE_ORDER, Daemon

    rows = job_rows(DOC.read_text())
    scheduled = [ticked(row["scheduled as"])[0] for row in rows]
    assert set(scheduled) <= set(JOB_NAMES)
    for name in scheduled:
        assert callable(getattr(Daemon, f"job_{name}", None)), name
    in_order = list(dict.fromkeys(scheduled))
    assert in_order == [name for name in ONCE_ORDER if name in in_order]
    # every daemon job that moves rows of the state is listed (reload and watchdog tend the daemon)
    assert set(ONCE_ORDER) - set(scheduled) == {"reload"}


def test_the_tables_and_states_named_exist() -> None:
    sql = " ".join(p.read_text() for p in (ROOT / "monitor" / "store" / "migrations").glob("*.sql"))
    tables = set(re.findall(r"CREATE TABLE (\w+)", sql))
    code = " ".join(p.read_text() for p in (ROOT / "monitor").rglob("*.py")) + sql
    for row in job_rows(DOC.read_text()):
        cell = row["moves a row"]
        assert "→" in cell, row
        for part in cell.split(";"):
            head, _, states = part.partition(":")
            for table in ticked(head):
                assert table in tables, f"{row['job']}: no table {table}"
            for state in ticked(states):
                assert re.search(rf"['\"]{state}['\"]", code), f"{row['job']}: state {state!r} appears nowhere"
