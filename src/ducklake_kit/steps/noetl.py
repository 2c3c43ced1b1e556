"""NoETL's playbook shapes mapped onto the kit's model (`model.Playbook`).

v1 (flat): `tool: ducklake` with the connection and commands on the step, `loop: {collection, element, mode}`,
`next: [{step}, {when, then: [{step}]}, {else: [...]}]`.
v2: `tool: {kind: ducklake, ...}`, `loop: {in, iterator, spec: {mode, max_in_flight}}`,
`next: {spec: {mode}, arcs: [{step, when}]}`.
NoETL's loop mode `parallel` is `async`. The kit adds `params`, `transaction` and `on_error` to the tool's keys.
"""

from __future__ import annotations

import graphlib
import itertools
from pathlib import Path
from typing import Any

from ducklake_kit.steps import schema
from ducklake_kit.steps.model import ASYNC, EXCLUSIVE, SEQUENTIAL, Branch, Catalog, Loop, Next, Playbook, Step
from ducklake_kit.steps.schema import Lines, PlaybookError


def load(path: Path) -> Playbook:
    """Read, validate and map a playbook file; PlaybookError (one line, with the line number) on bad input."""
    doc, lines = schema.read(path)
    file = str(path)
    if not isinstance(doc, dict):
        raise PlaybookError(file, 1, "a playbook is a mapping with a `workflow:` list of steps")
    shapes = schema.validate(doc, lines, file)
    steps: dict[str, Step] = {}
    for i, raw in enumerate(doc["workflow"]):
        step = _step(raw, shapes[i], ("workflow", i), lines, file)
        if step.name in steps:
            raise PlaybookError(
                file,
                step.line,
                f"step '{step.name}' is defined twice (first at line {steps[step.name].line})",
                "give each step its own name",
            )
        steps[step.name] = step
    used = {s for s in shapes if s != "any"}
    meta = doc.get("metadata") or {}
    playbook = Playbook(
        name=str(meta.get("name") or path.stem),
        file=file,
        shape="+".join(sorted(used)) or "v1",
        api_version=doc.get("apiVersion"),
        workload=dict(doc.get("workload") or {}),
        steps=steps,
        description=str(meta.get("description") or "").strip(),
    )
    check_routes(playbook)
    return playbook


def _tool_keys(raw: dict[str, Any], shape: str) -> tuple[dict[str, Any], tuple]:
    if shape == "v2" and isinstance(raw.get("tool"), dict):
        return raw["tool"], ("tool",)
    return raw, ()


def _step(raw: dict[str, Any], shape: str, path: tuple, lines: Lines, file: str) -> Step:
    line = schema.line_of(lines, path) or 0
    name = raw["step"]
    tool_raw, tool_path = _tool_keys(raw, shape)
    has_tool = raw.get("tool") is not None
    step = Step(
        name=name,
        line=line,
        desc=str(raw.get("desc") or ""),
        tool="ducklake" if has_tool else None,
        lines={k: schema.line_of(lines, path + tool_path + (k,)) or line for k in tool_raw},
    )
    step.lines.update({k: schema.line_of(lines, path + (k,)) or line for k in raw})
    if not has_tool:
        stray = sorted(k for k in raw if k in schema._CATALOG or k == "loop")
        if stray:
            raise PlaybookError(
                file,
                step.lines[stray[0]],
                f"step '{name}' has `{stray[0]}` but no `tool: ducklake`",
                "add `tool: ducklake`, or remove the key",
            )
    else:
        _tool(step, tool_raw, path + tool_path, lines, file)
    step.vars = dict(raw.get("vars") or {})
    if raw.get("loop") is not None:
        key = "in" if shape == "v2" else "collection"
        step.loop = _loop(raw["loop"], shape, schema.line_of(lines, path + ("loop", key)) or line)
    if raw.get("next") is not None:
        step.next = _next(raw["next"], shape, path + ("next",), lines)
    return step


def _tool(step: Step, t: dict[str, Any], path: tuple, lines: Lines, file: str) -> None:
    if ("command" in t) == ("commands" in t):
        raise PlaybookError(
            file, step.line, f"step '{step.name}' needs `command` (text) or `commands` (a list), exactly one of them"
        )
    if "command" in t:
        step.commands = [t["command"]]
        step.command_lines = [schema.line_of(lines, path + ("command",)) or step.line]
    else:
        step.commands = list(t["commands"])
        step.command_lines = [
            schema.line_of(lines, path + ("commands", i)) or step.line for i in range(len(t["commands"]))
        ]
    if "auth" in t and "catalog_connection" in t:
        raise PlaybookError(
            file,
            step.lines["catalog_connection"],
            f"step '{step.name}' names both `auth` and `catalog_connection`",
            "keep one: a credential name (auth) or a PostgreSQL DSN",
        )
    step.catalog = Catalog(
        auth=t.get("auth"),
        connection=t.get("catalog_connection"),
        name=t.get("catalog_name", "lake"),
        data_path=t.get("data_path"),
        create=t.get("create_catalog", True),
        use=t.get("use_catalog", True),
    )
    step.params = dict(t.get("params") or {})
    step.memory_limit, step.threads = t.get("memory_limit"), t.get("threads")
    step.transaction, step.on_error = bool(t.get("transaction", False)), t.get("on_error", "stop")
    if step.transaction and step.on_error == "continue":
        raise PlaybookError(
            file,
            step.lines["on_error"],
            f"step '{step.name}' has `transaction: true` and `on_error: continue`: a transaction is all or nothing",
            "drop one of them",
        )


def _loop(raw: dict[str, Any], shape: str, line: int) -> Loop:
    if shape == "v2":
        spec = raw.get("spec") or {}
        collection, iterator, mode, max_in_flight = (
            raw["in"],
            raw["iterator"],
            spec.get("mode"),
            spec.get("max_in_flight"),
        )
    else:
        collection, iterator, mode, max_in_flight = (
            raw["collection"],
            raw["element"],
            raw.get("mode"),
            raw.get("max_in_flight"),
        )
    return Loop(collection, iterator, ASYNC if mode in ("async", "parallel") else SEQUENTIAL, max_in_flight, line)


def _next(raw: Any, shape: str, path: tuple, lines: Lines) -> Next:
    out = Next()
    if shape == "v2":
        out.mode = (raw.get("spec") or {}).get("mode", EXCLUSIVE)
        for i, arc in enumerate(raw["arcs"]):
            branch = Branch([arc["step"]], arc.get("when"), schema.line_of(lines, path + ("arcs", i)) or 0)
            (out.branches if branch.when is not None else out.always).append(branch)
        return out
    for i, item in enumerate(raw):
        line = schema.line_of(lines, path + (i,)) or 0
        if "step" in item:
            out.always.append(Branch([item["step"]], None, line))
        elif "when" in item:
            out.branches.append(Branch([t["step"] for t in item["then"]], item["when"], line))
        else:
            out.otherwise.append(Branch([t["step"] for t in item["else"]], None, line))
    return out


def routed(playbook: Playbook) -> bool:
    """A playbook where some step has `next` is routed (NoETL's way: a step without `next` ends its branch);
    one without any runs its steps top to bottom."""
    return any(s.next is not None for s in playbook.steps.values())


def routes(playbook: Playbook) -> dict[str, list[tuple[str, int]]]:
    """Each step -> the steps it may lead to (with the line naming each)."""
    names = list(playbook.steps)
    by_next = routed(playbook)
    out: dict[str, list[tuple[str, int]]] = {}
    for i, (name, step) in enumerate(playbook.steps.items()):
        if step.next is not None:
            out[name] = step.next.targets()
        else:
            out[name] = [(names[i + 1], step.line)] if i + 1 < len(names) and not by_next else []
    return out


def check_routes(playbook: Playbook) -> None:
    """Every `next` names a step of the playbook, and the routes have no cycle (each step runs at most once)."""
    graph = routes(playbook)
    for name, targets in graph.items():
        for target, line in targets:
            if target not in playbook.steps:
                raise PlaybookError(
                    playbook.file,
                    line,
                    f"step '{name}' goes next to '{target}', which is not a step of this playbook",
                    f"use one of: {', '.join(playbook.steps)}",
                )
    reached, todo = {playbook.start}, [playbook.start]
    while todo:
        for target, _ in graph[todo.pop()]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    lost = [s for s in playbook.steps.values() if s.name not in reached]
    if lost:
        raise PlaybookError(
            playbook.file,
            lost[0].line,
            f"no route reaches step '{lost[0].name}' from "
            f"'{playbook.start}': in a playbook with `next`, a step without `next` ends its branch",
            f"add `next: [{{step: {lost[0].name}}}]` to the step that should lead to it",
        )
    sorter = graphlib.TopologicalSorter({n: [t for t, _ in graph[n]] for n in graph})  # edges reversed: fine for cycles
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = list(reversed(exc.args[1]))
        pairs = list(itertools.pairwise(cycle))
        back = next(((a, b) for a, b in reversed(pairs) if playbook.steps[a].next is not None), pairs[-1])
        line = next((ln for t, ln in graph[back[0]] if t == back[1]), None)
        raise PlaybookError(
            playbook.file,
            line,
            "the steps' `next` routes form a cycle: " + " -> ".join(cycle),
            "a step runs at most once: use a loop for repetition",
        ) from None


def order(playbook: Playbook) -> list[str]:
    """The steps in an order where every step comes after all the steps that may lead to it (file order breaks
    ties), so a step reached from two branches runs once, after both were decided."""
    graph = routes(playbook)
    preds: dict[str, set[str]] = {n: set() for n in graph}
    for name, targets in graph.items():
        for target, _ in targets:
            preds[target].add(name)
    sorter = graphlib.TopologicalSorter(preds)
    sorter.prepare()
    position = {n: i for i, n in enumerate(playbook.steps)}
    out: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready(), key=position.__getitem__)
        out.extend(ready)
        sorter.done(*ready)
    return out
