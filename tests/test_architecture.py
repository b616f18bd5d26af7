"""The shape of the package, read from its imports.

The layer order, the absence of import cycles and the ban on test code are import-linter
contracts declared in pyproject.toml (`[tool.importlinter]`); these tests run `lint-imports` on
the checkout, check that the contracts really refuse what they forbid, and that
docs/architecture.md draws the same order. What a contract cannot say stays hand-written here:
torch kept out of the processes that never score (the `lstar` command's start-up and the daemon's
parent process), where only imports at module level count.

A failure prints the import chain, so the fix starts from the line named.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from import_graph import ROOT, all_modules, imports, module_graph

# Loaded only where a model is scored or evaluated (the scoring child, `lstar eval`, the lab).
LAZY_ONLY = ("torch", "transformers")
# The processes that must start without them.
ENTRY_POINTS = ("monitor.cli", "monitor.service.daemon")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `root` with the contracts of its pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()", "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return contract["layers"]


def test_the_import_contracts_hold() -> None:
    """Every stage imports only the stages below it, no package's modules or subpackages import
    each other in a cycle, and production code never imports test code."""
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.search(r"Contracts: [1-9][0-9]* kept, 0 broken", proc.stdout), proc.stdout[-3000:]


@pytest.fixture()
def package_copy(tmp_path: Path) -> Path:
    """The package and its contracts copied to a folder of their own, to be broken on purpose."""
    shutil.copytree(ROOT / "monitor", tmp_path / "monitor", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_refuse_an_upward_import_a_cycle_and_an_unplaced_package(package_copy: Path) -> None:
    with (package_copy / "monitor" / "store" / "rows.py").open("a") as f:
        f.write("\nimport monitor.service.daemon  # upward: the store under the daemon\n")
    with (package_copy / "monitor" / "hub" / "client.py").open("a") as f:
        f.write("\nimport monitor.hub.gate\n")  # the gate imports the client: a cycle inside hub/
    (package_copy / "monitor" / "sandbox").mkdir()
    (package_copy / "monitor" / "sandbox" / "__init__.py").write_text("")
    with (package_copy / "monitor" / "lab" / "train.py").open("a") as f:
        f.write("\nimport pytest\n")
    proc = _lint_imports(package_copy)
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "monitor.sandbox" in out, out[-3000:]   # exhaustive: every subpackage has a layer
    (package_copy / "monitor" / "sandbox" / "__init__.py").unlink()
    (package_copy / "monitor" / "sandbox").rmdir()
    proc = _lint_imports(package_copy)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert "monitor.store is not allowed to import monitor.service" in out, out[-3000:]
    assert "monitor.store.rows -> monitor.service.daemon" in out, out[-3000:]
    assert "No cycles are allowed in monitor.hub" in out, out[-3000:]
    assert "monitor.lab.train -> pytest" in out, out[-3000:]


def test_the_jobs_contract_lists_every_job_and_refuses_a_job_importing_another(package_copy: Path) -> None:
    """Every module of monitor/jobs/ but the shared context is in the independence contract, and
    a job importing another one, or the daemon, breaks the contracts."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "jobs-independent"]
    jobs = {f"monitor.jobs.{p.stem}" for p in (ROOT / "monitor" / "jobs").glob("*.py")} - {
        "monitor.jobs.__init__", "monitor.jobs.context"}
    assert contract["type"] == "independence" and set(contract["modules"]) == jobs
    with (package_copy / "monitor" / "jobs" / "prune.py").open("a") as f:
        f.write("\nimport monitor.jobs.score  # one job importing another\n")
    with (package_copy / "monitor" / "jobs" / "gate.py").open("a") as f:
        f.write("\nimport monitor.service.daemon  # a job reaching up into the daemon\n")
    proc = _lint_imports(package_copy)
    out = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert "monitor.jobs.prune is not allowed to import monitor.jobs.score" in out, out[-3000:]
    assert "monitor.jobs is not allowed to import monitor.service" in out, out[-3000:]


def test_the_architecture_doc_draws_the_contracts_layer_order() -> None:
    """docs/architecture.md lists the layers top to bottom exactly as the contract declares them."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- layers: pyproject.toml \[tool.importlinter\] -->\n```\n(.*?)```", doc, re.S)
    assert block, "docs/architecture.md has no layer block"
    drawn = [re.sub(r"\s+", " ", line.split("#")[0]).strip() for line in block.group(1).splitlines()]
    drawn = [line.replace("monitor.", "") for line in drawn if line]
    assert drawn == _layers()


def _loaded_by(entry: str, graph: dict[str, dict[str, int]]) -> dict[str, str | None]:
    """Modules importing `entry` loads (with its parent packages), each with the module that pulls it in."""
    modules = all_modules()
    seen: dict[str, str | None] = {entry: None}
    todo = [entry]
    while todo:
        module = todo.pop()
        parts = module.split(".")
        parents = [".".join(parts[:i]) for i in range(1, len(parts))]
        for nxt in [*parents, *graph.get(module, {})]:
            if nxt in modules and nxt not in seen:
                seen[nxt] = module
                todo.append(nxt)
    return seen


@pytest.mark.slow
def test_the_cli_and_the_daemon_start_without_torch() -> None:
    graph = module_graph()
    modules = all_modules()
    entries = [*ENTRY_POINTS, *(m for m in modules if m.startswith("monitor.commands."))]
    offenders = []
    for entry in entries:
        loaded = _loaded_by(entry, graph)
        for module in loaded:
            for imp in imports(modules[module]):
                if imp.module_level and imp.module.split(".")[0] in LAZY_ONLY:
                    chain = [module]
                    while loaded[chain[-1]] is not None:
                        chain.append(loaded[chain[-1]])
                    offenders.append(f"{modules[module].relative_to(ROOT)}:{imp.line} imports {imp.module}, "
                                     f"loaded by {' <- '.join(chain)}")
    assert not offenders, "\n".join(sorted(set(offenders)))


def test_every_yaml_file_is_read_by_the_one_bounded_loader() -> None:
    """Only monitor.yamlio imports yaml (alias budget, nesting and node limits, no tags): no
    other module parses YAML itself, nor hands a file to pydantic-settings' own YAML source."""
    offenders = []
    for name, path in sorted(all_modules().items()):
        if name == "monitor.yamlio":
            continue
        offenders += [f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}" for imp in imports(path)
                      if imp.module.split(".")[0] in ("yaml", "ruamel")]
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(ROOT)}: uses {word}" for word in ("YamlConfigSettingsSource", "yaml.")
                      if re.search(rf"(?<![\w.]){re.escape(word)}", text)]
    assert offenders == []
