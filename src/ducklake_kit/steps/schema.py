"""Reading a playbook file: YAML with the line of every key and item, checked against JSON Schemas, every error one
line with the file's line number.

Which shapes are read: NoETL's v1 (flat `tool: ducklake` with the connection on the step, and NoETL's older flat
`tool: <kind>` / `type: <kind>` steps), NoETL's older v2 (`tool: {kind: ducklake}`, `loop: {in, iterator}`,
`next: {arcs}`) and NoETL's canonical v10 (files say `apiVersion: noetl.io/v2`): `tool: {kind, spec: {policy},
output}` for every kind in `model.KINDS`, step and arc `set:`, `spec.policy.admit`, cursor loops. A v10 step is
checked first against NoETL's own published schema (vendored as data: `noetl_playbook.schema.json`, see NOETL_SCHEMA),
then against the kit's stricter one (unknown keys are errors naming the allowed ones: NoETL's schema lets any key
through, so a typo would pass silently). A tool kind the kit does not run is refused before anything else is said
about its step (`refuse_kinds`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ducklake_kit.errors import KitError
from ducklake_kit.steps import model

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
# Canonical v10: the kit's strict shapes, checked after NoETL's own schema (which lets any key through).
_TEXT = {"type": "string"}
_OBJECT = {"type": "object"}
_ANY: dict[str, Any] = {}
# a `set:` target: ctx.x (the run's context), iter.x (the loop iteration's), step.x, or a bare name (ctx's)
_SET = {"type": "object", "propertyNames": {"pattern": r"^((ctx|iter|step)\.)?[A-Za-z_][A-Za-z0-9_]*$"}}
_THEN = {
    "type": "object",
    "required": ["do"],
    "additionalProperties": False,
    "properties": {
        "do": {"enum": [model.RETRY, model.JUMP, model.BREAK, model.FAIL, model.CONTINUE]},
        "attempts": {"type": "integer", "minimum": 1},
        "backoff": {"enum": ["none", "fixed", "linear", "exponential"]},  # NoETL's model says none; its e2e, fixed
        "delay": {"type": "number", "minimum": 0},
        "to": {"type": "string", "minLength": 1},
        "set": _SET,
        # the spellings of `set` before NoETL's model refused them (its ducklake_test used set_ctx in February 2026)
        "set_ctx": _SET,
        "set_iter": _SET,
    },
}
_ADMIT_THEN = {
    "type": "object",
    "required": ["allow"],
    "additionalProperties": False,
    "properties": {"allow": {"type": "boolean"}},
}
_MODE = {"enum": [model.EXCLUSIVE, model.INCLUSIVE]}


def _rules(then: dict[str, Any]) -> dict[str, Any]:
    """NoETL's rule list: `{when, then}` or `{else: {then}}` (which of the two: checked when mapped, for one clear
    line instead of jsonschema's 'not valid under any of the given schemas')."""
    orelse = {"type": "object", "required": ["then"], "additionalProperties": False, "properties": {"then": then}}
    rule = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"when": _TEXT, "then": then, "else": orelse},
    }
    return {"type": "array", "minItems": 1, "items": rule}


_POLICY = {
    "type": "object",
    "required": ["rules"],
    "additionalProperties": False,
    "properties": {"mode": _MODE, "on_unmatched": {"enum": ["continue", "fail"]}, "rules": _rules(_THEN)},
}
_ADMIT = {"type": "object", "additionalProperties": False, "properties": {"mode": _MODE, "rules": _rules(_ADMIT_THEN)}}
_TOOL_SPEC = {"type": "object", "additionalProperties": False, "properties": {"policy": _POLICY}}
_STEP_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "policy": {"type": "object", "additionalProperties": False, "properties": {"admit": _ADMIT}},
    },
}
# `auth:` names a credential; NoETL's older files also wrote {type, credential}
_AUTH = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "object",
            "required": ["credential"],
            "additionalProperties": False,
            "properties": {"type": _TEXT, "credential": _TEXT},
        },
    ]
}
# NoETL's SQL tools take `commands` as a list or as one text of several statements
_SQL = {"command": _TEXT, "commands": {"type": ["array", "string"], "items": _TEXT, "minItems": 1}, "query": _TEXT}
# Each kind's own keys, as NoETL's tools read them (noetl/tools/<kind>) and its playbooks use them.
KIND_KEYS: dict[str, dict[str, Any]] = {
    model.DUCKLAKE: _CATALOG,
    model.POSTGRES: {"auth": _AUTH, **_SQL},
    model.DUCKDB: {"auth": {"type": ["string", "object"]}, "database": _TEXT, "gcs_credential": _TEXT, **_SQL},
    model.PYTHON: {"code": _TEXT, "args": _OBJECT, "libs": _OBJECT, "auth": {"type": ["string", "object"]}},
    model.HTTP: {
        "method": {"type": "string", "pattern": "^(?i:get|post|put|patch|delete|head|options)$"},
        "url": _TEXT,
        "endpoint": _TEXT,
        "headers": _OBJECT,
        "params": _OBJECT,
        "payload": _ANY,
        "data": _ANY,
        "json": _ANY,
        "body": _ANY,
        "timeout": {"type": ["number", "string"]},
        "auth": {"type": ["string", "object"]},
        "verify_ssl": {"type": ["boolean", "string"]},
    },
    model.NOOP: {},
    model.PLAYBOOK: {
        "path": {"type": "string", "minLength": 1},
        "args": _OBJECT,
        "payload": _OBJECT,
        "return_step": {"type": "string", "minLength": 1},  # whose data the sub-playbook's run returns
        "timeout": {"type": ["number", "string"]},  # NoETL's; the kit waits for the sub-playbook's end
    },
    model.WORKBOOK: {"name": {"type": "string", "minLength": 1}, "args": _OBJECT},
}
# NoETL's older flat steps (`tool: <kind>` or `type: <kind>` with the tool's keys on the step): python's input was `data`
FLAT_KEYS = {**KIND_KEYS, model.PYTHON: {**KIND_KEYS[model.PYTHON], "data": _OBJECT}}
_CURSOR = {
    "type": "object",
    "required": ["kind", "auth", "claim"],
    "additionalProperties": False,
    "properties": {"kind": {"const": model.POSTGRES}, "auth": _TEXT, "claim": _TEXT, "options": _OBJECT},
}
_LOOP_V10 = {
    "type": "object",
    "required": ["iterator"],
    "additionalProperties": False,
    "properties": {
        "in": _TEMPLATE_OR_LIST,
        "cursor": _CURSOR,
        "iterator": {"type": "string", "pattern": IDENT},
        "mode": {"enum": ["sequential", "parallel", "async"]},  # NoETL's v2 until January 2026, now spec.mode
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mode": {"enum": ["sequential", "parallel", "cursor", "async"]},
                "max_in_flight": {"type": ["integer", "string"], "minimum": 1},  # a number or a template
            },
        },
    },
}
_ARC = {
    "type": "object",
    "required": ["step"],
    "additionalProperties": False,
    "properties": {"step": {"type": "string", "minLength": 1}, "when": _TEXT, "set": _SET},
}
_NEXT_ROUTER = {
    "type": "object",
    "required": ["arcs"],
    "additionalProperties": False,
    "properties": {
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"mode": _MODE, "on_no_match": {"enum": ["complete", "quiet"]}},
        },
        "arcs": {"type": "array", "minItems": 1, "items": _ARC},
    },
}
# NoETL's v2 before canonical v10 wrote the arcs as a list right under `next:`
_NEXT_V10 = {
    "if": {"type": "array"},
    "then": {"type": "array", "minItems": 1, "items": _ARC},
    "else": _NEXT_ROUTER,
}


def tool_schema(kind: str, labelled: bool = False) -> dict[str, Any]:
    """The kit's schema of a v10 `tool:` of one kind (with `name:` when it is a task of a list)."""
    props = {"kind": {"const": kind}, "spec": _TOOL_SPEC, "output": _OBJECT, "input": _OBJECT, **KIND_KEYS[kind]}
    if labelled:
        props["name"] = _TEXT
    return {"type": "object", "required": ["kind"], "additionalProperties": False, "properties": props}


def step_v10(kind: str | None, listed: bool, kinds: tuple[str, ...] = ()) -> dict[str, Any]:
    """The kit's schema of a v10 step whose tool has `kind` (None: no tool, or one without a kind); `listed`: the
    tool is written as a list of labelled tasks, whose kinds are `kinds` (each task checked as its kind's tool, and
    named when there are several: later tasks read earlier ones by name)."""
    props = {**_COMMON, "spec": _STEP_SPEC, "input": _OBJECT, "set": _SET, "loop": _LOOP_V10, "next": _NEXT_V10}
    if kind is None:
        props["tool"] = {"type": "object", "required": ["kind"]}
    elif listed:
        tasks = [tool_schema(k, labelled=True) for k in (kinds or (kind,))]
        if len(tasks) > 1:
            tasks = [{**t, "required": ["kind", "name"]} for t in tasks]
        props["tool"] = {"type": "array", "minItems": 1, "prefixItems": tasks, "items": False}
    else:
        props["tool"] = tool_schema(kind)
    return {"type": "object", "required": ["step"], "additionalProperties": False, "properties": props}


def step_flat(kind: str, key: str) -> dict[str, Any]:
    """The schema of NoETL's flat step (`tool: <kind>` or, older, `type: <kind>`; the tool's keys on the step)."""
    if kind == model.DUCKLAKE and key == "tool":
        return STEP_V1
    props = {
        **_COMMON,
        key: {"const": kind},
        **FLAT_KEYS[kind],
        "loop": STEP_V1["properties"]["loop"],
        "next": STEP_V1["properties"]["next"],
    }
    return {"type": "object", "required": ["step"], "additionalProperties": False, "properties": props}


WORKBOOK_TASK = {
    "type": "object",
    "required": ["name", "tool"],
    "additionalProperties": False,
    "properties": {"name": {"type": "string", "pattern": IDENT}, "tool": {"type": "object", "required": ["kind"]}},
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
                "labels": {"type": "object"},
                "tags": {"type": ["array", "object"]},
            },
        },
        "workload": {"type": "object"},
        "ctx": {"type": "object"},  # an early canonical v10 (apiVersion noetl.io/v10) named the workload `ctx`
        "keychain": {"type": "array", "items": {"type": "object"}},
        "workbook": {"type": "array", "items": WORKBOOK_TASK},
        "executor": {"type": "object"},
        "workflow": {"type": "array", "minItems": 1, "items": {"type": "object"}},
    },
}

# NoETL's published JSON Schema of canonical v10, byte for byte: github:noetl/noetl at
# 3badb77adfda45a0048da4f2fb9ba498023e64ca (2026-07-27), noetl/core/dsl/playbook.schema.json (last changed in
# ec6be86e, 2026-05-20; NoETL generates it from its Pydantic models). NoETL is dual-licensed MIT / Apache-2.0.
NOETL_SCHEMA = Path(__file__).with_name("noetl_playbook.schema.json")


@functools.cache
def noetl_def(name: str) -> dict[str, Any]:
    """One definition of NoETL's schema (Step, Executor, WorkbookTask, ...) as a schema of its own."""
    root = json.loads(NOETL_SCHEMA.read_text(encoding="utf-8"))
    return {"$defs": root["$defs"], "$ref": f"#/$defs/{name}"}


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
    """Check the document; PlaybookError at the first problem. Returns each step's shape ("v1", "v2" for NoETL's
    v2 and canonical v10, or "any" for a step with neither a tool nor a loop nor a next)."""
    _check(doc, PLAYBOOK, (), lines, file)
    refuse_kinds(doc, lines, file)
    _check_top(doc, lines, file)
    shapes = []
    for i, step in enumerate(doc["workflow"]):
        shape = _shape(step)
        for schema, part, origin in _step_schemas(step, shape):
            _check(step[part[0]] if part else step, schema, ("workflow", i, *part), lines, file, origin)
        shapes.append(shape)
    return shapes


def _check_top(doc: dict[str, Any], lines: Lines, file: str) -> None:
    """`executor` and the `workbook` tasks as NoETL's schema defines them; each task's tool as the kit reads it."""
    if "executor" in doc:
        _check(doc["executor"], noetl_def("Executor"), ("executor",), lines, file, NOETL)
    for j, task in enumerate(doc.get("workbook") or []):
        _check(task, noetl_def("WorkbookTask"), ("workbook", j), lines, file, NOETL)
        _check(task["tool"], tool_schema(task["tool"]["kind"]), ("workbook", j, "tool"), lines, file)


def _step_schemas(step: dict[str, Any], shape: str) -> list[tuple[dict[str, Any], tuple, str]]:
    """The schemas a step is checked against, in order: (schema, the part of the step it checks, whose it is)."""
    kinds = tool_kinds(step)
    kind = kinds[0][0] if kinds and isinstance(kinds[0][0], str) else None
    if shape != "v2":
        key = "type" if "type" in step and "tool" not in step else "tool"
        return [(step_flat(kind, key) if kind else STEP_V1, (), "")]
    noetl = [(noetl_def(name), (key,), NOETL) for key, name in _noetl_parts(step)]
    listed = isinstance(step.get("tool"), list)
    each = tuple(k for k, _ in kinds if isinstance(k, str)) if listed else ()
    return [*noetl, (step_v10(kind, listed, each), (), "")]


# the parts of a v2 step NoETL's schema defines, and the name of its definition
_NOETL_PARTS = {"tool": "ToolSpec", "next": "NextRouter", "loop": "Loop", "spec": "StepSpec"}


def _noetl_parts(step: dict[str, Any]) -> list[tuple[str, str]]:
    """The parts of a step written as canonical v10, which NoETL's schema can check. The older v2 shapes the kit
    still reads (a list under `next:`, a literal list in `loop.in`, loop mode `async`) are not canonical v10, and
    NoETL's schema would refuse them: those parts are left to the kit's schema."""
    out = []
    for key, name in _NOETL_PARTS.items():
        value = step.get(key)
        if not isinstance(value, dict):
            continue
        spec = value.get("spec")
        older = key == "loop" and (
            not isinstance(value.get("in", ""), str) or (isinstance(spec, dict) and spec.get("mode") == "async")
        )
        if not older:
            out.append((key, name))
    return out


_V2_KEYS = ("spec", "set", "input")  # step keys only canonical v10 has


def _shape(step: dict[str, Any]) -> str:
    tool, loop, nxt = step.get("tool"), step.get("loop"), step.get("next")
    if (
        isinstance(tool, (dict, list))
        or isinstance(nxt, dict)
        or (isinstance(loop, dict) and ("in" in loop or "iterator" in loop or "cursor" in loop))
        or any(k in step for k in _V2_KEYS)
    ):
        return "v2"
    if tool is not None or "type" in step or loop is not None or nxt is not None or any(k in step for k in _CATALOG):
        return "v1"
    return "any"


def tool_kinds(step: dict[str, Any]) -> list[tuple[Any, tuple]]:
    """Each tool kind a step names (as written: maybe not a string), with its path in the step."""
    tool = step.get("tool")
    if isinstance(tool, dict):
        return [(tool.get("kind"), ("tool", "kind"))]
    if isinstance(tool, list):
        return [(t.get("kind"), ("tool", i, "kind")) for i, t in enumerate(tool) if isinstance(t, dict)]
    if tool is not None:
        return [(tool, ("tool",))]
    return [(step["type"], ("type",))] if "type" in step else []


def refuse_kinds(doc: dict[str, Any], lines: Lines, file: str) -> None:
    """A tool kind the kit does not run is one line naming the kind, the step and the line, before anything else
    is said about that step (its other keys are the other tool's, not typos)."""
    for i, step in enumerate(doc["workflow"]):
        name = step.get("step")
        for kind, path in tool_kinds(step):
            if isinstance(kind, str) and kind not in model.KINDS:
                raise _unrun(file, line_of(lines, ("workflow", i, *path)), f"step '{name}'", kind)
        cursor = (step.get("loop") or {}).get("cursor") if isinstance(step.get("loop"), dict) else None
        if isinstance(cursor, dict) and cursor.get("kind") not in (None, model.POSTGRES):
            where = line_of(lines, ("workflow", i, "loop", "cursor", "kind"))
            raise _unrun(file, where, f"step '{name}'", cursor["kind"], "loop cursor kind", "a postgres cursor")
    for j, task in enumerate(doc.get("workbook") or []):
        kind = (task.get("tool") or {}).get("kind") if isinstance(task.get("tool"), dict) else None
        if isinstance(kind, str) and kind not in model.KINDS:
            where = line_of(lines, ("workbook", j, "tool", "kind"))
            raise _unrun(file, where, f"workbook task '{task.get('name')}'", kind)


def noetl_kinds() -> list[str]:
    """The tool kinds NoETL's schema names (ToolSpec.kind)."""
    return noetl_def("ToolSpec")["$defs"]["ToolSpec"]["properties"]["kind"]["enum"]


def _unrun(file: str, line: int | None, who: str, kind: str, what: str = "tool kind", alt: str = "") -> PlaybookError:
    if what == "tool kind" and kind not in noetl_kinds() and kind != "iterator":  # a typo, most likely
        return PlaybookError(
            file,
            line,
            f"{who} uses tool kind '{kind}', which neither NoETL nor the kit knows",
            f"use one of the kinds the kit runs: {', '.join(model.KINDS)}",
        )
    if kind == "iterator":  # NoETL's older loop step: the kit's (and NoETL's canonical) loop is a key of the step
        fix = "write it as a step with `loop: {in, iterator}` and the task's tool, or run it with NoETL"
    else:
        fix = f"use {alt}, or run it with NoETL" if alt else "run it with NoETL, or remove the step"
    return PlaybookError(file, line, f"{who} uses {what} '{kind}', which the kit's step runner does not run", fix)


NOETL = "NoETL's playbook schema"
# keys NoETL's canonical v10 retired, and what replaced them (noetl/core/dsl/engine/parser/validation.py)
RETIRED = {
    "when": "NoETL's canonical v10 admits a step with `spec.policy.admit.rules`",
    "case": "NoETL's canonical v10 splits `case` into spec.policy.admit, tool.spec.policy.rules and next.arcs[].when",
    "eval": "NoETL's canonical v10 handles a task's output with `tool.spec.policy.rules`",
    "expr": "NoETL's canonical v10 writes a guard as `when`",
}


def _check(instance: Any, schema: dict[str, Any], base: tuple, lines: Lines, file: str, origin: str = "") -> None:
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
        hint = f" ({RETIRED[key]})" if key in RETIRED else ""
        raise PlaybookError(
            file,
            line,
            f"unknown key '{key}' in {where}{hint}",
            f"use one of: {', '.join(sorted(allowed))} (or check its indentation)",
        )
    said = f" ({origin})" if origin else ""
    raise PlaybookError(file, line_of(lines, path), f"{where}: {error.message}{said}")
