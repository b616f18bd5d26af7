"""The model types transformers implements itself, and those with a causal LM class.

The gate (in the daemon) and the loader's checks of a checkpoint folder ask whether a
config.json's `model_type` is one of them. Importing transformers' auto mappings runs
`configuration_utils`, which imports torch: about 3 CPU-seconds in a process (the daemon)
that otherwise never needs torch. So the mappings' keys are read from the source files of
`transformers.models.auto` where those build them from literals, as they do; any other shape
falls back to the import, which gives the same sets (`tests/test_model_types.py` compares them).
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

# Module-level uses of a mapping that leave its keys as the literal statements say.
_READ_ONLY_CALLS = {"items", "keys", "values", "get", "copy"}


def _model_types(which: int, module: str, mapping: str) -> frozenset[str]:
    """The keys of one of transformers' auto mappings: read from the source (`which` of
    `model_types_from_source`), else imported."""
    from_source = model_types_from_source()
    if from_source is not None:
        return from_source[which]
    return frozenset(getattr(importlib.import_module(module), mapping))


@cache
def known_model_types() -> frozenset[str]:
    """Model types transformers implements itself (their code never comes from a repo)."""
    return _model_types(0, "transformers.models.auto.configuration_auto", "CONFIG_MAPPING_NAMES")


@cache
def causal_model_types() -> frozenset[str]:
    """The model types with a causal language model class (`AutoModelForCausalLM`)."""
    return _model_types(1, "transformers.models.auto.modeling_auto", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")


@cache
def model_types_from_source() -> tuple[frozenset[str], frozenset[str]] | None:
    """(known, causal) read from the source files of `transformers.models.auto` without
    importing transformers; None where they cannot be read that way."""
    try:
        spec = importlib.util.find_spec("transformers")  # finds the package, runs none of it
        if spec is None or not spec.submodule_search_locations:
            return None
        auto = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto"
        known = mapping_keys_in_source([auto / "auto_mappings.py", auto / "configuration_auto.py"],
                                       "CONFIG_MAPPING_NAMES")
        causal = mapping_keys_in_source([auto / "modeling_auto.py"], "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES")
    except (OSError, SyntaxError, ValueError, ImportError, UnicodeDecodeError):
        return None
    if not known or not causal or not causal <= known:
        return None
    return frozenset(known), frozenset(causal)


def mapping_keys_in_source(files: list[Path], name: str) -> set[str] | None:
    """The keys of the module-level mapping `name` as `files` (in import order; a missing file
    is skipped) build it from literals: `NAME = OrderedDict([("key", "Class"), ...])`,
    `NAME = OrderedDict(**{...}, **NAME)` and `NAME.update({...})` as a statement of its own
    (keyword arguments are keys too). None for any other module-level change of it (an item
    assigned or deleted, a call that may mutate it, an update under a condition, a key that is
    not a string literal)."""
    keys: set[str] = set()
    for file in files:
        if not file.is_file():
            continue
        for statement in ast.parse(file.read_text(encoding="utf-8")).body:
            if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                         for t in statement.targets):
                literal = _literal_keys(statement.value, name)
                if literal is None:
                    return None
                refers_to_itself = any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(statement.value))
                keys = keys | literal if refers_to_itself else literal
                continue
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue  # their bodies run later, if ever: not at import
            for node in ast.walk(statement):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == name:
                    if node.func.attr != "update":
                        if node.func.attr not in _READ_ONLY_CALLS:
                            return None
                        continue
                    # only a statement of its own: one inside a condition or an expression may
                    # not run at import
                    literal = _literal_keys(node, name) if isinstance(statement, ast.Expr) \
                        and statement.value is node else None
                    if literal is None:
                        return None
                    keys |= literal
                elif isinstance(node, (ast.Subscript, ast.Name)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                        and name in ast.dump(node):
                    return None
    return keys


# what a literal mapping is written with: anything else (a key computed by an operator or an
# f-string, a comprehension, a conditional) may make keys the literals do not say
_LITERAL_NODES = (ast.Call, ast.Attribute, ast.Name, ast.List, ast.Tuple, ast.Dict, ast.Constant, ast.keyword,
                  ast.Load)


def _literal_keys(node: ast.AST, name: str) -> set[str] | None:
    """The string keys of the (key, value) pairs, dict literals and keyword arguments in `node`;
    None if it holds anything but those, `OrderedDict`/`dict` calls, `.update` of `name` and
    `name` itself."""
    keys: set[str] = set()
    for child in ast.walk(node):
        if not isinstance(child, _LITERAL_NODES):
            return None
        if isinstance(child, ast.keyword) and child.arg is not None:   # `update(key="Class")`
            keys.add(child.arg)
        elif isinstance(child, ast.Tuple) and len(child.elts) == 2 and isinstance(child.elts[0], ast.Constant):
            if not isinstance(child.elts[0].value, str):
                return None
            keys.add(child.elts[0].value)
        elif isinstance(child, ast.Dict):
            if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in child.keys):
                return None
            keys.update(k.value for k in child.keys)  # type: ignore[union-attr]
        elif isinstance(child, ast.Name) and child.id not in (name, "OrderedDict", "dict"):
            return None
    return keys
