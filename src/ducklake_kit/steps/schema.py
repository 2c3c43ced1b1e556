"""Reading a playbook file: YAML with the line of every key and item, checked against a JSON Schema (NoETL's v1
or v2 step shape, unknown keys are errors), every error one line with the file's line number."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ducklake_kit.errors import KitError

Lines = dict[tuple, int]  # JSON path (keys and indexes) -> 1-based line

IDENT = "^[A-Za-z_][A-Za-z0-9_]*$"
_TEMPLATE_OR_LIST = {"type": ["string", "array"]}
_CATALOG = {  # the tool's connection keys, the same in v1 (on the step) and v2 (in `tool`)
    "auth": {"type": "string", "minLength": 1},
    "catalog_connection": {"type": "string", "minLength": 1},
    "catalog_name": {"type": "string", "minLength": 1},
    "data_path": {"type": "string", "minLength": 1},
    "command": {"type": "string"},
    "commands": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    "create_catalog": {"type": "boolean"},
    "use_catalog": {"type": "boolean"},
    "memory_limit": {"type": "string", "minLength": 1},
    "threads": {"type": "integer", "minimum": 1},
    # the kit's additions
    "params": {"type": "object"},
    "transaction": {"type": "boolean"},
    "on_error": {"enum": ["stop", "continue"]},
}
_STEP_REF = {
    "type": "object",
    "required": ["step"],
    "additionalProperties": False,
    "properties": {"step": {"type": "string", "minLength": 1}},
}
_VARS = {"type": "object", "additionalProperties": {"type": "string"}}
_COMMON = {"step": {"type": "string", "pattern": IDENT}, "desc": {"type": "string"}, "vars": _VARS}

STEP_V1 = {
    "type": "object",
    "required": ["step"],
    "additionalProperties": False,
    "properties": {
        **_COMMON,
        "tool": {"const": "ducklake"},
        **_CATALOG,
        "loop": {
            "type": "object",
            "required": ["collection", "element"],
            "additionalProperties": False,
            "properties": {
                "collection": _TEMPLATE_OR_LIST,
                "element": {"type": "string", "pattern": IDENT},
                "mode": {"enum": ["async", "sequential", "parallel"]},
                "max_in_flight": {"type": "integer", "minimum": 1},
            },
        },
        "next": {
            "type": "array",
            "minItems": 1,
            "items": {
                "anyOf": [
                    _STEP_REF,
                    {
                        "type": "object",
                        "required": ["when", "then"],
                        "additionalProperties": False,
                        "properties": {
                            "when": {"type": "string"},
                            "then": {"type": "array", "minItems": 1, "items": _STEP_REF},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["else"],
                        "additionalProperties": False,
                        "properties": {"else": {"type": "array", "minItems": 1, "items": _STEP_REF}},
                    },
                ]
            },
        },
    },
}
STEP_V2 = {
    "type": "object",
    "required": ["step"],
    "additionalProperties": False,
    "properties": {
        **_COMMON,
        "tool": {
            "type": "object",
            "required": ["kind"],
            "additionalProperties": False,
            "properties": {"kind": {"const": "ducklake"}, **_CATALOG},
        },
        "loop": {
            "type": "object",
            "required": ["in", "iterator"],
            "additionalProperties": False,
            "properties": {
                "in": _TEMPLATE_OR_LIST,
                "iterator": {"type": "string", "pattern": IDENT},
                "spec": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "mode": {"enum": ["async", "parallel", "sequential"]},
                        "max_in_flight": {"type": "integer", "minimum": 1},
                    },
                },
            },
        },
        "next": {
            "type": "object",
            "required": ["arcs"],
            "additionalProperties": False,
            "properties": {
                "spec": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"mode": {"enum": ["exclusive", "inclusive"]}},
                },
                "arcs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["step"],
                        "additionalProperties": False,
                        "properties": {"step": {"type": "string", "minLength": 1}, "when": {"type": "string"}},
                    },
                },
            },
        },
    },
}
PLAYBOOK = {
    "type": "object",
    "required": ["workflow"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"const": "Playbook"},
        "metadata": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+$"},
                "path": {"type": "string"},
                "description": {"type": "string"},
                "version": {"type": ["string", "number"]},
            },
        },
        "workload": {"type": "object"},
        "workflow": {"type": "array", "minItems": 1, "items": {"type": "object"}},
    },
}


# A playbook's nodes (mappings, lists, scalars, keys included) once YAML aliases (*name) are expanded. Real playbooks
# have hundreds, with small anchors reused a few times; 9 anchors of 9 references each ("billion laughs") have 9**9,
# which made `steps validate` grow to 5 GB. Counted on the composed graph, before anything is built.
MAX_NODES = 100_000


class PlaybookError(KitError):
    """Bad input in a playbook file, at a line."""

    def __init__(self, file: str, line: int | None, what: str, fix: str = ""):
        where = f"{file}:{line}" if line else file
        super().__init__(
            f"{where}: {what}", fix or "fix the playbook (`steps validate FILE` checks it without running)"
        )
        self.file, self.line_no = file, line


def read(path: Path) -> tuple[Any, Lines]:
    """The YAML document and the line of every key and item (a duplicate key is an error, not a silent overwrite)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KitError(f"no playbook file {path}", "give the path of a .yaml playbook, e.g. steps/basic.yaml") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise KitError(f"cannot read the playbook {path} ({exc})", "give the path of a .yaml text file") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise PlaybookError(str(path), None, "the file is empty")
        check_size(node, str(path))
        lines: Lines = {}
        return _construct(loader, node, (), lines, str(path)), lines
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlaybookError(str(path), mark.line + 1 if mark else None, f"not valid YAML: {problem}") from None
    except RecursionError:  # PyYAML's composer recurses once per level of nesting
        raise PlaybookError(
            str(path), None, "the YAML is nested too deeply", "flatten it: playbooks need a few levels"
        ) from None
    finally:
        loader.dispose()


def load_value(text: str, where: str) -> Any:
    """One YAML value (a --set value), with the same bound on aliases as a playbook file."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_size(node, where)
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    finally:
        loader.dispose()


def check_size(root: yaml.Node, file: str, limit: int = MAX_NODES) -> int:
    """How many nodes the document has once every alias is expanded; PlaybookError past `limit`, or when an alias
    refers to a node that contains it (a recursive alias expands forever).

    An alias is the anchored node object itself, met again, so the graph's sizes are memoized per node: the count
    is linear in the text (never in the expansion), and saturates at limit + 1."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            open_.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(c)] for c in children))
            continue
        if key in open_:
            raise PlaybookError(
                file,
                node.start_mark.line + 1,
                "an alias refers to a node that contains it, so it expands forever",
                "point the alias (*name) at an anchor outside itself",
            )
        open_.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_:
                raise PlaybookError(
                    file,
                    child.start_mark.line + 1,
                    "an alias refers to a node that contains it, so it expands forever",
                    "point the alias (*name) at an anchor outside itself",
                )
            if id(child) not in sizes:
                stack.append((child, False))
    total = sizes[id(root)]
    if total > limit:
        raise PlaybookError(
            file,
            None,
            f"the YAML expands to more than {limit:,} nodes once its aliases (*name) are expanded",
            "use fewer references to large anchors (a playbook needs a few hundred nodes)",
        )
    return total


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: tuple, lines: Lines, file: str) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # YAML merge keys (<<)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:
                raise PlaybookError(file, key_node.start_mark.line + 1, f"a key must be a plain name, not {key!r}")
            if key in out:
                raise PlaybookError(file, key_node.start_mark.line + 1, f"the key '{key}' appears twice in one mapping")
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(loader, value_node, path + (key,), lines, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, path + (i,), lines, file) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def line_of(lines: Lines, path: tuple) -> int | None:
    """The line of `path`, or of its nearest enclosing key or item."""
    path = tuple(path)
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path)


def validate(doc: Any, lines: Lines, file: str) -> list[str]:
    """Check the document; PlaybookError at the first problem. Returns each step's shape ("v1", "v2", or "any"
    for a step with neither a tool nor a loop nor a next)."""
    _check(doc, PLAYBOOK, (), lines, file)
    shapes = []
    for i, step in enumerate(doc["workflow"]):
        shape = _shape(step)
        _check(step, STEP_V2 if shape == "v2" else STEP_V1, ("workflow", i), lines, file)
        shapes.append(shape)
    return shapes


def _shape(step: dict[str, Any]) -> str:
    tool, loop, nxt = step.get("tool"), step.get("loop"), step.get("next")
    if (
        isinstance(tool, dict)
        or isinstance(nxt, dict)
        or (isinstance(loop, dict) and ("in" in loop or "iterator" in loop))
    ):
        return "v2"
    if tool is not None or loop is not None or nxt is not None or any(k in step for k in _CATALOG):
        return "v1"
    return "any"


def _check(instance: Any, schema: dict[str, Any], base: tuple, lines: Lines, file: str) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: line_of(lines, base + tuple(e.absolute_path)) or 0)
    if not errors:
        return
    error = jsonschema.exceptions.best_match(errors, key=jsonschema.exceptions.relevance)
    path = base + tuple(error.absolute_path)
    where = ".".join(str(p) for p in path) or "the playbook"
    if error.validator == "additionalProperties":
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(str(k) for k in error.instance if k not in allowed)
        key = unknown[0] if unknown else ""
        line = line_of(lines, path + (key,))
        raise PlaybookError(
            file,
            line,
            f"unknown key '{key}' in {where}",
            f"use one of: {', '.join(sorted(allowed))} (or check its indentation)",
        )
    if error.validator == "const" and path[-1:] in (("tool",), ("kind",)):
        raise PlaybookError(
            file,
            line_of(lines, path),
            f"{where} is {error.instance!r}: the kit's step runner runs only `tool: ducklake` steps",
            "run other tools with NoETL itself, or drop the step",
        )
    if error.validator == "required":
        raise PlaybookError(file, line_of(lines, path), f"{where}: {error.message}")
    raise PlaybookError(file, line_of(lines, path), f"{where}: {error.message}")
