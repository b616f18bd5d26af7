"""The package's imports as the source states them, read with `ast` (nothing is imported).

Shared by the architecture check of what stays lazy (the layers and cycles are import-linter's
contracts in pyproject.toml) and the packaging checks (every third-party import is declared).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "monitor"


@dataclass(frozen=True)
class Import:
    """One imported name: the dotted module it resolves to, where, whether at module level, and
    whether it ever runs (an import under `if TYPE_CHECKING:` never does)."""

    module: str
    line: int
    module_level: bool
    runs: bool = True


def module_name(path: Path) -> str:
    """`monitor/hub/gate.py` -> `monitor.hub.gate`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, known: dict[str, Path] | None = None) -> list[Import]:
    """Every import statement of `path`, function-level ones included.

    `from a.b import c` resolves to `a.b.c` when that is a module of the package (`known`),
    else to `a.b` (c is a name defined there). Imports under `if TYPE_CHECKING:` never run
    and count as not module level. Module level means run when the module is imported: top-level
    statements, those in top-level `if`/`try` blocks and class bodies, not those in functions.
    """
    known = known if known is not None else {}
    out: list[Import] = []

    def visit(node: ast.AST, module_level: bool, runs: bool = True) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                visit(ast.Module(body=child.body, type_ignores=[]), False, False)   # never runs
                for sub in child.orelse:
                    visit_stmt(sub, module_level, runs)
                continue
            visit_stmt(child, module_level, runs)

    def visit_stmt(child: ast.AST, module_level: bool, runs: bool) -> None:
        if isinstance(child, ast.Import):
            out.extend(Import(alias.name, child.lineno, module_level, runs) for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
            for alias in child.names:
                full = f"{child.module}.{alias.name}"
                out.append(Import(full if full in known or not known else child.module, child.lineno,
                                  module_level, runs))
        visit(child, module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)), runs)

    visit(parsed(path), True)
    return out


def parsed(path: Path) -> ast.Module:
    """The syntax tree of `path`, parsed once per test process for each version of the file.

    The packaging and architecture checks read every module's imports several times (five
    parses of the package's 286 modules in tests/test_packaging.py alone, 2.2 CPU-seconds
    each); a tree is only read, never changed, and a file edited since is parsed again."""
    stat = path.stat()
    return _parse(path, stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parse(path: Path, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def module_graph(*, module_level_only: bool = True) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the first such import}.

    module_level_only=False adds the imports inside functions (those that run when called);
    imports under `if TYPE_CHECKING:` never run and are never edges.
    """
    modules = all_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for imp in imports(path, modules):
            if imp.module in modules and imp.module != name and imp.runs and \
                    (imp.module_level or not module_level_only):
                edges.setdefault(imp.module, imp.line)
        graph[name] = edges
    return graph
