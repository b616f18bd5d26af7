"""Which of the store's methods a daemon job reaches: read from the source, no job is run.

From each job module, every attribute taken on a variable named `store` counts, and every
function or class the store is handed to is followed (its parameter that receives the store,
or for a class the attribute of `self` its constructor keeps it in), through the modules of
`monitor`, as deep as the store goes. Only names that are public members of `Store` count.

A reading, not a proof: a store kept under another name than the parameter it arrived by
(`s = store`), or handed on through an expression other than that name or `self.<its
attribute>`, is not followed, and neither is a call whose function is chosen at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import textwrap
from typing import Any

from monitor.store import Store

STORE_MEMBERS = {name for name in dir(Store) if not name.startswith("_")}
# What a job calls through the daemon (`monitor.jobs.context.JobContext`) with the store, and
# the report writer the daemon hands the report job: followed as the code they stand for.
# Each: the code, and the parameter the store reaches it by.
STANDS_FOR = {"hub_client": ("monitor.hub.client:HubClient", "store"),
              "write": ("monitor.reports.schedule:write_due_reports", 0)}


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@functools.lru_cache(maxsize=None)
def _module_imports(name: str) -> dict[str, str]:
    return _imported_names(ast.parse(inspect.getsource(importlib.import_module(name))))


def _imported_names(tree: ast.AST) -> dict[str, str]:
    """name -> "module:attr" for every `from X import Y` in the tree, at any depth."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}:{alias.name}"
    return out


def _resolve(func: ast.expr, names: dict[str, str], module: Any) -> Any:
    """The function or class a call names, when it can be found (else None)."""
    if isinstance(func, ast.Name):
        if func.id in names:
            try:
                return _load(names[func.id])
            except (ImportError, AttributeError):
                return None
        return getattr(module, func.id, None)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        # `outbox.write_planned(store, ...)` after `from monitor.alerts import outbox`
        owner = _resolve(func.value, names, module)
        if inspect.ismodule(owner):
            return getattr(owner, func.attr, None)
    return None


def _stands_for(func: ast.expr) -> tuple[Any, int | str] | None:
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if name not in STANDS_FOR:
        return None
    spec, place = STANDS_FOR[name]
    return _load(spec), place


def _receiving(node: ast.Call, var: str) -> list[int | str]:
    """Where `var` is handed in a call: positional indexes and keyword names."""
    places: list[int | str] = [i for i, a in enumerate(node.args) if isinstance(a, ast.Name) and a.id == var]
    places += [k.arg for k in node.keywords if k.arg and isinstance(k.value, ast.Name) and k.value.id == var]
    return places


def _param(fn: Any, place: int | str, *, bound: bool) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    if isinstance(place, str):
        return place if place in params else None
    index = place + (1 if bound else 0)
    return params[index] if index < len(params) else None


def _attrs_on(tree: ast.AST, var: str, *, on_self: str | None = None) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            if isinstance(value, ast.Name) and value.id == var:
                out.add(node.attr)
            elif (on_self and isinstance(value, ast.Attribute) and value.attr == on_self
                  and isinstance(value.value, ast.Name) and value.value.id == "self"):
                out.add(node.attr)
    return out


def _kept_as(init: ast.AST, param: str) -> str | None:
    """The attribute of `self` a constructor keeps `param` in."""
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and any(isinstance(n, ast.Name) and n.id == param
                                                for n in ast.walk(node.value)):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    return target.attr
    return None


def _uses(tree: ast.AST, var: str, module: Any, seen: set[tuple[str, str]], *,
          on_self: str | None = None, job: bool = False) -> set[str]:
    """Store members used on `var` in `tree`, and in whatever `var` is handed to."""
    used = _attrs_on(tree, var, on_self=on_self) & STORE_MEMBERS
    names = _module_imports(module.__name__)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        places = _receiving(node, var)
        if on_self:
            places += [i for i, a in enumerate(node.args) if isinstance(a, ast.Attribute) and a.attr == on_self
                       and isinstance(a.value, ast.Name) and a.value.id == "self"]
        if not places:
            continue
        stands = _stands_for(node.func) if job else None
        if stands is not None:
            used |= follow(*stands, seen)
            continue
        target = _resolve(node.func, names, module)
        if target is None or not getattr(target, "__module__", "").startswith("monitor."):
            continue
        used |= follow(target, places[0], seen)
    return used


def follow(target: Any, place: int | str, seen: set[tuple[str, str]]) -> set[str]:
    """Store members that `target` (a function or class of `monitor`) uses on the argument
    handed at `place`."""
    key = (f"{target.__module__}.{target.__qualname__}", str(place))
    if key in seen:
        return set()
    seen.add(key)
    module = importlib.import_module(target.__module__)
    if inspect.isclass(target):
        init = target.__init__
        param = _param(init, place, bound=True)
        if param is None:
            return set()
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
        if dataclasses.is_dataclass(target):   # its generated __init__ has no source: a field keeps its name
            return _uses(tree, param, module, seen, on_self=param)
        init_tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        return _uses(tree, param, module, seen, on_self=_kept_as(init_tree, param))
    param = _param(target, place, bound=False)
    if param is None:
        return set()
    tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    return _uses(tree, param, module, seen)


@functools.lru_cache(maxsize=None)
def _job_store_use(job_module: str) -> frozenset[str]:
    module = importlib.import_module(job_module)
    tree = ast.parse(inspect.getsource(module))
    return frozenset(_uses(tree, "store", module, set(), job=True))


def job_store_use(job_module: str) -> set[str]:
    """The store members a job module reaches, directly and through what it hands the store to."""
    return set(_job_store_use(job_module))


def direct_store_use(job_module: str) -> set[str]:
    """The attributes a job module takes on a variable named `store` itself."""
    tree = ast.parse(inspect.getsource(importlib.import_module(job_module)))
    return _attrs_on(tree, "store")
