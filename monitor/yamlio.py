"""Strict YAML for configuration files: read safely, report errors by file and line.

`compose(text, label)` builds the node tree with a SafeLoader subclass that refuses any tag
beyond plain strings, numbers, booleans, null, lists and mappings (so `!!python/object`
never reaches a constructor), refuses aliases that expand beyond a small budget (alias
bombs) or contain themselves, refuses duplicate keys (YAML silently keeps the last), and
bounds nesting depth and node count while composing (so "[" * 100000 is refused at its
65th bracket, before PyYAML, the checks here or pydantic recurse into it).
`construct(root, label)` turns the checked tree into Python data. `validation_lines`
maps pydantic errors back onto the tree, one line per problem:
``policies/bad.yaml:12: tasks[0].margin: value 'x' is not a number``.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from monitor.errors import PolicyError
from monitor.files import POLICY_FILE, FileKind, read_bounded_text

# A configuration file has no reason to expand aliases into more nodes than this.
ALIAS_EXPANSION_LIMIT = 10_000
# Nor to nest lists and mappings deeper than this (a route tree 30 levels deep still fits);
# every recursive walk of the tree (PyYAML's composer, the checks below, pydantic) stays far
# from Python's recursion limit.
NESTING_LIMIT = 64
# Nor to hold more nodes than this: composing is slow pure Python and keeps every node with
# its marks, so a 1 MiB file of tiny nodes would cost seconds and hundreds of MiB.
NODE_LIMIT = 50_000


# The node type of a composed tree, for modules that keep one (they never import yaml).
YamlNode = yaml.Node

_ALLOWED_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null",
                                                     "seq", "map", "merge")}


class YamlProblem(Exception):
    """A problem found while composing, with its 1-based line."""

    def __init__(self, line: int, text: str) -> None:
        super().__init__(text)
        self.line = line
        self.text = text


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that counts alias expansion and keeps dates as strings."""

    # Dates stay strings (no datetime surprises in string fields), and '=' is not special.
    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers
                if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str, what: FileKind = POLICY_FILE) -> None:
        super().__init__(stream)
        self.what = what   # the kind of file, as errors name it
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._depth = 0
        self._nodes = 0

    def _size(self, node: yaml.Node, stack: set[int]) -> int:
        """Nodes `node` expands to (memoised: linear in the composed graph)."""
        key = id(node)
        if key in self._sizes:
            return self._sizes[key]
        if key in stack:
            raise YamlProblem(node.start_mark.line + 1,
                              f"recursive alias; {self.what.plural} cannot refer to themselves")
        stack.add(key)
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._size(child, stack) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._size(k, stack) + self._size(v, stack) for k, v in node.value)
        else:
            size = 1
        stack.discard(key)
        self._sizes[key] = size
        return size

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._expanded += self._size(node, set())
                if self._expanded > ALIAS_EXPANSION_LIMIT:
                    raise YamlProblem(event.start_mark.line + 1,
                                   f"aliases expand to more than {ALIAS_EXPANSION_LIMIT:,} nodes "
                                   "(an alias bomb?); write the values out instead")
            return super().compose_node(parent, index)
        # Checked before descending: the composer recurses once per level, so the limit
        # must hold before the recursion does (the parser below it keeps an explicit stack).
        self._nodes += 1
        if self._nodes > NODE_LIMIT:
            raise YamlProblem(self.peek_event().start_mark.line + 1,
                              f"more than {NODE_LIMIT:,} values; configuration files are far smaller "
                              "than that")
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= NESTING_LIMIT:
            raise YamlProblem(self.peek_event().start_mark.line + 1,
                              f"lists and mappings nested more than {NESTING_LIMIT} levels deep; "
                              "flatten the structure")
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _display_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def check_tree(node: yaml.Node, path: str, done: set[int], stack: set[int],
               what: FileKind = POLICY_FILE) -> None:
    """Refuse unknown tags, recursive aliases and duplicate keys before anything is constructed
    (`what` names the kind of file in the errors)."""
    if id(node) in stack:
        raise YamlProblem(node.start_mark.line + 1,
                       f"{path + ': ' if path else ''}recursive alias; a value cannot contain itself")
    if id(node) in done:
        return
    if node.tag not in _ALLOWED_TAGS:
        where = f"{path}: " if path else ""
        raise YamlProblem(node.start_mark.line + 1,
                       f"{where}tag '{_display_tag(node.tag)}' is not allowed; {what.plural} hold "
                       "only strings, numbers, booleans, null, lists and mappings")
    stack.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, child in enumerate(node.value):
            check_tree(child, f"{path}[{i}]", done, stack, what)
    elif isinstance(node, yaml.MappingNode):
        keys: set[Any] = set()
        for key_node, value_node in node.value:
            check_tree(key_node, path, done, stack, what)
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            child = f"{path}.{key}" if path else str(key)
            if key_node.tag == "tag:yaml.org,2002:merge":
                check_tree(value_node, path, done, stack, what)
                continue
            if key in keys:
                raise YamlProblem(key_node.start_mark.line + 1, f"{child}: duplicate key")
            keys.add(key)
            check_tree(value_node, child, done, stack, what)
    stack.discard(id(node))
    done.add(id(node))


def node_line(root: yaml.Node, loc: Sequence[Any]) -> tuple[int, list[Any]]:
    """Line of the deepest node `loc` reaches (1-based), and the loc parts that resolved."""
    node, line, resolved = root, root.start_mark.line + 1, []
    for part in loc:
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        elif isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == part:
                    node, line = value_node, key_node.start_mark.line + 1
                    break
            else:
                break
        else:
            break
        resolved.append(part)
    return line, resolved


def format_key_path(loc: Sequence[Any]) -> str:
    """('tasks', 0, 'margin') -> 'tasks[0].margin'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_TYPE_WORDS = {
    "float_type": "a number", "float_parsing": "a number", "int_type": "an integer",
    "int_parsing": "an integer", "int_from_float": "an integer", "string_type": "a string",
    "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "timedelta_type": "a duration", "finite_number": "a finite number",
}


def _short(value: Any) -> str:
    return clip(repr(value), 80)


# What one error line may quote of a key path or a message: a key or a value may be a
# megabyte of file, or a list its aliases expanded; the line stays readable.
MAX_ERROR_PART = 240


def clip(text: str, limit: int = MAX_ERROR_PART) -> str:
    """`text`, cut to `limit` characters with '...' when longer."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def error_message(err: Mapping[str, Any]) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind in _TYPE_WORDS:
        return f"value {_short(value)} is not {_TYPE_WORDS[kind]}"
    if kind == "missing":
        return "missing required key"
    if kind == "literal_error":
        return f"value {_short(value)} is not one of {ctx.get('expected')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        words = {"greater_than": "greater than", "greater_than_equal": "at least",
                 "less_than": "less than", "less_than_equal": "at most"}[kind]
        bound = next(iter(ctx.values()), "?")
        return f"value {_short(value)} must be {words} {bound}"
    if kind == "string_pattern_mismatch":
        return f"value {_short(value)} does not match {ctx.get('pattern')}"
    if kind in ("too_short", "too_long"):
        return f"value {_short(value)} needs {'at least' if kind == 'too_short' else 'at most'} " \
               f"{ctx.get('min_length', ctx.get('max_length'))} item(s)"
    if kind == "value_error":
        msg = str(ctx.get("error") or err["msg"])
        return clip(msg.removeprefix("Value error, "))
    return f"value {_short(value)}: {err['msg']}"


def _allowed_keys(model: type[BaseModel] | None) -> list[str]:
    if model is None:
        return []
    return sorted(f.alias or name for name, f in model.model_fields.items())


def _model_at(root: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model whose mapping holds the key at the end of `loc` (for unknown keys)."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        model = _inner_model(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        for sub in typing.get_args(arg):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                return sub
    return None


def _expectation(err: Mapping[str, Any]) -> str:
    """What a union member wanted, as words ("a mapping", "one of 'main'")."""
    kind = err["type"]
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    if kind == "literal_error":
        return f"one of {(err.get('ctx') or {}).get('expected')}"
    return error_message(err)


def validation_lines(exc: ValidationError, root: yaml.Node, label: str, model: type[BaseModel]) -> list[str]:
    """One `LABEL:LINE: key.path: message` line per problem, sorted by line."""
    found: dict[str, tuple[int, str]] = {}
    unions: dict[str, tuple[int, Any, list[str]]] = {}
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        line, resolved = node_line(root, loc)
        if err["type"] == "missing":
            path = format_key_path(resolved + loc[len(resolved):len(resolved) + 1])
            message = error_message(err)
        elif err["type"] == "extra_forbidden":
            path = format_key_path(loc)
            allowed = _allowed_keys(_model_at(model, loc))
            close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
            message = "unknown key" + (f" (did you mean '{close[0]}'?)" if close else "") + \
                (f"; allowed: {', '.join(allowed)}" if allowed else "")
        elif len(resolved) < len(loc):
            # A union member's tag (e.g. revisions: main | {branches, tags}): one message
            # per value listing what each member would have accepted.
            path = format_key_path(resolved)
            entry = unions.setdefault(path, (line, err.get("input"), []))
            wanted = _expectation(err)
            if wanted not in entry[2]:
                entry[2].append(wanted)
            continue
        else:
            path = format_key_path(loc)
            message = error_message(err)
        found.setdefault(path, (line, message))
    for path, (line, value, wanted) in unions.items():
        found.setdefault(path, (line, f"value {_short(value)} is not {' or '.join(wanted)}"))
    ordered = sorted(found.items(), key=lambda item: item[1][0])
    return [f"{label}:{line}: {clip(path)}: {clip(message)}" if path else f"{label}:{line}: {clip(message)}"
            for path, (line, message) in ordered]


def compose(text: str, label: str, *, what: FileKind = POLICY_FILE) -> yaml.Node | None:
    """The checked node tree of `text` (None for an empty document); raises PolicyError
    naming the file (`label`) and, where it says what such files may hold, their kind (`what`)."""
    try:
        # The reader checks every character as the loader is made: a NUL or other control byte
        # is refused here, and must be a one-line error like any other.
        loader = StrictLoader(text, what)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{label}: not YAML: {' '.join(str(exc).split())}",
                          hint="remove the control characters (the file must be printable UTF-8 text)") from None
    try:
        root = loader.get_single_node()
    except YamlProblem as exc:
        raise PolicyError(f"{label}:{exc.line}: {clip(exc.text)}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "not valid YAML"
        raise PolicyError(f"{label}:{line}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"{label}: YAML syntax error: {exc}") from None
    finally:
        loader.dispose()
    if root is None:
        return None
    try:
        check_tree(root, "", set(), set(), what)
    except YamlProblem as exc:
        raise PolicyError(f"{label}:{exc.line}: {clip(exc.text)}") from None
    return root


def compose_mapping(text: str, label: str, *, empty: str, keys: str = "",
                    what: FileKind = POLICY_FILE) -> tuple[yaml.Node, dict[str, Any]]:
    """The composed tree and constructed data of a file whose top level must be a mapping.

    `empty` ends the message for an empty file ("a policy needs name, route and receivers");
    `keys`, when given, names the expected top-level keys in the message for a non-mapping.
    """
    root = compose(text, label, what=what)
    if root is None:
        raise PolicyError(f"{label}:1: the file is empty; {empty}")
    data = construct(root, label)
    if not isinstance(data, dict):
        raise PolicyError(f"{label}:{root.start_mark.line + 1}: expected a mapping at the top "
                          f"level{keys}, got {type(data).__name__}")
    return root, data


def construct(root: yaml.Node, label: str) -> Any:
    """Python data from a checked node tree."""
    loader = StrictLoader("")
    try:
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise PolicyError(f"{label}:{line}: {exc.problem or exc.context}") from None
    finally:
        loader.dispose()


def load_yaml_file(path: Path, label: str | None = None, *, what: FileKind = POLICY_FILE) -> Any:
    """Python data of a small YAML file read with the policy files' defences (regular file,
    bounded size, UTF-8, bounded nesting and node count, no tags, no alias bombs); None for
    an empty document. Raises PolicyError naming the file and line, and the kind of file
    (`what`) where it says what is allowed: a file that is not a regular one, too large, or
    holds a tag or an alias to itself."""
    label = label or str(path)
    root = compose(read_bounded_text(Path(path), label, what=what), label, what=what)
    return construct(root, label) if root is not None else None

