"""The shape of the package, read from its imports: stages that depend on each other one way,
no import cycles (imports inside functions count too: a lazy import is still a dependency;
those under `if TYPE_CHECKING:` never run and do not), test helpers kept out of production,
and torch kept out of the processes that never score (the `lstar` command's start-up and the
daemon's parent process).

A failure prints the cycle or the import chain, so the fix starts from the line named.
"""

from __future__ import annotations

import pytest
from import_graph import PACKAGE, ROOT, all_modules, find_cycle, imports, module_graph

# Loaded only where a model is scored or evaluated (the scoring child, `lstar eval`, the lab).
LAZY_ONLY = ("torch", "transformers")
# The processes that must start without them.
ENTRY_POINTS = ("monitor.cli", "monitor.service.daemon")


def _stage(module: str) -> str:
    """The pipeline stage of a module: its subpackage of `monitor`, or the top-level module."""
    parts = module.split(".")
    if len(parts) == 1:
        return module
    return parts[1]


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    modules = all_modules()
    return "\n".join(f"  {a} -> {b}  ({modules[a].relative_to(ROOT)}:{graph[a][b]})"
                     for a, b in zip(cycle, cycle[1:]))


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle:\n" + _describe(cycle, graph)


def test_no_import_cycle_between_modules_even_inside_functions() -> None:
    """A function-level import kept for start-up time (torch, scipy) must not hide a cycle."""
    graph = module_graph(module_level_only=False)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle (function-level imports included):\n" + _describe(cycle, graph)


def test_no_import_cycle_between_stages() -> None:
    """scoring, hub, curves, policy, alerts, reports, service, store... import each other one way,
    counting the imports inside functions too."""
    graph = module_graph(module_level_only=False)
    stages: dict[str, dict[str, str]] = {}
    for module, edges in graph.items():
        for target, line in edges.items():
            a, b = _stage(module), _stage(target)
            if a != b:
                stages.setdefault(a, {}).setdefault(b, f"{module} -> {target} (line {line})")
    for stage in {_stage(m) for m in graph}:
        stages.setdefault(stage, {})
    cycle = find_cycle({a: set(bs) for a, bs in stages.items()})
    assert cycle is None, "stages import each other in a cycle:\n" + "\n".join(
        f"  {a} -> {b}: {stages[a][b]}" for a, b in zip(cycle, cycle[1:]))


def test_production_code_never_imports_the_test_helpers() -> None:
    testing = PACKAGE / "testing"
    offenders = [f"{path.relative_to(ROOT)}:{imp.line} imports {imp.module}"
                 for name, path in all_modules().items() if testing not in path.parents
                 for imp in imports(path, all_modules())
                 if imp.module == "monitor.testing" or imp.module.startswith("monitor.testing.")]
    assert not offenders, "\n".join(offenders)


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
