"""NoETL's playbook shapes mapped onto the kit's model (`model.Playbook`).

v1 (flat): `tool: ducklake` with the connection and commands on the step, `loop: {collection, element, mode}`,
`next: [{step}, {when, then: [{step}]}, {else: [...]}]`; NoETL's older flat steps of other kinds (`tool: postgres`,
or older still `type: postgres`) with the tool's keys on the step.
v2 and canonical v10: `tool: {kind, spec: {policy: {rules}}, output, input, ...the kind's keys}` (or a list of one
labelled task), `loop: {in | cursor, iterator, spec: {mode, max_in_flight}}`, `next: {spec: {mode, on_no_match},
arcs: [{step, when, set}]}`, step `set:` and `input:`, `spec.policy.admit`; top-level `keychain`, `workbook`,
`executor` and `metadata.labels/tags`.
NoETL's loop modes `parallel` and `cursor` are the kit's `async`. The kit adds `params`, `transaction` and `on_error`
to a ducklake tool's keys. A postgres or duckdb tool's `command`/`commands`/`query` become the step's commands.
"""

from __future__ import annotations

import graphlib
import itertools
from pathlib import Path
from typing import Any

from ducklake_kit.steps import model, schema
from ducklake_kit.steps.model import (
    ASYNC,
    CONTINUE,
    EXCLUSIVE,
    JUMP,
    SEQUENTIAL,
    Admit,
    Branch,
    Catalog,
    Loop,
    Next,
    Playbook,
    Policy,
    Rule,
    Step,
)
from ducklake_kit.steps.schema import Lines, PlaybookError

_SQL_KINDS = (model.POSTGRES, model.DUCKDB)  # their commands are SQL the kit checks as it checks a ducklake step's


def load(path: Path) -> Playbook:
    """Read, validate and map a playbook file; PlaybookError (one line, with the line number) on bad input."""
    doc, lines = schema.read(path)
    file = str(path)
    if not isinstance(doc, dict):
        raise PlaybookError(file, 1, "a playbook is a mapping with a `workflow:` list of steps")
    shapes = schema.validate(doc, lines, file)
    used = {s for s in shapes if s != "any"}
    meta = doc.get("metadata") or {}
    playbook = Playbook(
        name=str(meta.get("name") or path.stem),
        file=file,
        shape="+".join(sorted(used)) or "v1",
        api_version=doc.get("apiVersion"),
        workload=_workload(doc, lines, file),
        steps=_steps(doc, shapes, lines, file),
        description=str(meta.get("description") or "").strip(),
        labels=_labels(meta),
        keychain=list(doc.get("keychain") or []),
        workbook=_workbook(doc, lines, file),
        executor=dict(doc.get("executor") or {}),
    )
    check_references(playbook)  # first: check_routes follows the jumps
    check_routes(playbook)
    return playbook


def _steps(doc: dict[str, Any], shapes: list[str], lines: Lines, file: str) -> dict[str, Step]:
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
    return steps


def _workload(doc: dict[str, Any], lines: Lines, file: str) -> dict[str, Any]:
    """`workload:`, or `ctx:` as an early canonical v10 (noetl.io/v10) named it."""
    if "workload" in doc and "ctx" in doc:
        raise PlaybookError(
            file, schema.line_of(lines, ("ctx",)), "the playbook has both `workload:` and `ctx:`", "keep `workload:`"
        )
    return dict(doc.get("workload") or doc.get("ctx") or {})


def _labels(meta: dict[str, Any]) -> dict[str, Any]:
    labels = dict(meta.get("labels") or {})
    if "tags" in meta:
        labels["tags"] = meta["tags"]
    return labels


def _workbook(doc: dict[str, Any], lines: Lines, file: str) -> dict[str, Step]:
    """The top-level `workbook:` tasks, each mapped as a step of its own (a `tool: workbook` step runs one by name)."""
    out: dict[str, Step] = {}
    for j, task in enumerate(doc.get("workbook") or []):
        path = ("workbook", j)
        step = Step(name=task["name"], line=schema.line_of(lines, path) or 0, tool=task["tool"]["kind"])
        if step.name in out:
            raise PlaybookError(file, step.line, f"workbook task '{step.name}' is defined twice", "rename one")
        _apply_tool(step, task["tool"], path + ("tool",), lines, file)
        out[step.name] = step
    return out


def _tool_of(raw: dict[str, Any]) -> tuple[str | None, dict[str, Any], tuple]:
    """The step's tool kind, the mapping that holds the tool's keys, and its path in the step."""
    tool = raw.get("tool")
    if isinstance(tool, dict):
        return tool["kind"], tool, ("tool",)
    if isinstance(tool, list) and len(tool) == 1:  # a list of one labelled task: that task
        return tool[0]["kind"], tool[0], ("tool", 0)
    if isinstance(tool, list):  # NoETL's tool pipeline: the tasks, each mapped as a step of its own (`_tasks`)
        return model.TASKS, {}, ("tool",)
    if tool is not None:
        return tool, raw, ()
    return raw.get("type"), raw, ()


def _step(raw: dict[str, Any], shape: str, path: tuple, lines: Lines, file: str) -> Step:
    line = schema.line_of(lines, path) or 0
    kind, tool_raw, tool_path = _tool_of(raw)
    step = Step(
        name=raw["step"],
        line=line,
        desc=str(raw.get("desc") or ""),
        tool=kind,
        lines={k: schema.line_of(lines, path + tool_path + (k,)) or line for k in tool_raw},
    )
    step.lines.update({k: schema.line_of(lines, path + (k,)) or line for k in raw})
    if kind is None:
        _no_tool(step, raw, file)
    elif kind == model.TASKS:
        step.tasks = _tasks(step, raw["tool"], path + ("tool",), lines, file)
    else:
        _apply_tool(step, tool_raw, path + tool_path, lines, file)
        step.label = tool_raw.get("name") if tool_path[-1:] == (0,) else None
    step.vars, step.set = dict(raw.get("vars") or {}), dict(raw.get("set") or {})
    _step_input(step, raw, tool_raw if tool_path else {}, file)
    admit = ((raw.get("spec") or {}).get("policy") or {}).get("admit")
    if admit is not None:
        step.admit = _admit(admit, path + ("spec", "policy", "admit"), lines, file)
    if raw.get("loop") is not None:
        step.loop = _loop(raw["loop"], shape, path + ("loop",), lines, file)
    if raw.get("next") is not None:
        step.next = _next(raw["next"], shape, path + ("next",), lines)
    return step


def _tasks(step: Step, tools: list[dict[str, Any]], path: tuple, lines: Lines, file: str) -> list[Step]:
    """A tool pipeline's tasks, each a step of its own kind named by its label (in the order they run)."""
    out: list[Step] = []
    for i, t in enumerate(tools):
        at = schema.line_of(lines, path + (i,)) or step.line
        task = Step(name=str(t["name"]), line=at, tool=t["kind"], label=str(t["name"]))
        task.lines = {k: schema.line_of(lines, path + (i, k)) or at for k in t}
        if task.name in {o.name for o in out}:
            raise PlaybookError(file, at, f"step '{step.name}' has two tasks named '{task.name}'", "rename one")
        _apply_tool(task, t, path + (i,), lines, file)
        task.input = dict(t.get("input") or {})
        out.append(task)
    return out


def _no_tool(step: Step, raw: dict[str, Any], file: str) -> None:
    """A step without a tool only routes: a tool's key on it is a mistake, said at its line."""
    stray = sorted(k for k in raw if k in schema._CATALOG or k in ("loop", "input"))  # `set:` may stand alone
    if stray:
        raise PlaybookError(
            file,
            step.lines[stray[0]],
            f"step '{step.name}' has `{stray[0]}` but no tool",
            "add a tool (e.g. `tool: {kind: ducklake, ...}`), or remove the key",
        )


def _step_input(step: Step, raw: dict[str, Any], tool_raw: dict[str, Any], file: str) -> None:
    """The step's `input:` or its tool's (NoETL reads either); both at once would leave one unread."""
    if "input" in raw and "input" in tool_raw:
        raise PlaybookError(
            file, step.lines["input"], f"step '{step.name}' has `input:` on the step and on its tool", "keep one"
        )
    step.input = dict(raw.get("input") or tool_raw.get("input") or {})


def _apply_tool(step: Step, t: dict[str, Any], path: tuple, lines: Lines, file: str) -> None:
    """The tool's own keys onto the step: a ducklake tool's as the kit models them, another kind's as written in
    `config` (a SQL kind's commands also as the step's commands); its `spec.policy` and `output`."""
    kind = step.tool
    if kind == model.DUCKLAKE:
        _tool(step, t, path, lines, file)
    else:
        step.config = {k: v for k, v in t.items() if k in schema.FLAT_KEYS[kind]}
    if kind in _SQL_KINDS:
        _commands(step, t, path, lines, file)
    policy = (t.get("spec") or {}).get("policy") if isinstance(t.get("spec"), dict) else None
    if policy is not None:
        step.policy = _policy(policy, path + ("spec", "policy"), lines, file)
    step.output = dict(t.get("output") or {})


def _commands(step: Step, t: dict[str, Any], path: tuple, lines: Lines, file: str) -> None:
    """`command` (text), `commands` (a list) or NoETL's `query` (text): exactly one of them."""
    given = [k for k in ("command", "commands", "query") if k in t]
    if len(given) != 1:
        raise PlaybookError(
            file,
            step.line,
            f"step '{step.name}' needs `command` (text) or `commands` (a list), exactly one of them",
            "NoETL's `query:` counts as `command:`",
        )
    key = given[0]
    if key == "commands" and isinstance(t[key], list):
        step.commands = list(t["commands"])
        step.command_lines = [schema.line_of(lines, path + (key, i)) or step.line for i in range(len(t[key]))]
    else:
        step.commands = [t[key]]
        step.command_lines = [schema.line_of(lines, path + (key,)) or step.line]


def _tool(step: Step, t: dict[str, Any], path: tuple, lines: Lines, file: str) -> None:
    if "query" in t or ("command" in t) == ("commands" in t):
        raise PlaybookError(
            file, step.line, f"step '{step.name}' needs `command` (text) or `commands` (a list), exactly one of them"
        )
    _commands(step, t, path, lines, file)
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


def _rule_parts(raw: dict[str, Any], path: tuple, lines: Lines, file: str) -> tuple[str | None, dict[str, Any], int]:
    """A rule's `when` (None for `else`), its `then` and its line: `{when, then}` or `{else: {then}}`."""
    line = schema.line_of(lines, path) or 0
    if "else" in raw:
        if len(raw) > 1:
            raise PlaybookError(
                file, line, "a rule is `{when, then}` or `{else: {then}}`, not both", "split it into two rules"
            )
        return None, raw["else"]["then"], line
    if "then" not in raw:
        raise PlaybookError(file, line, "a rule without `then:`", "add `then: {do: continue}` (or the action meant)")
    return raw.get("when"), raw["then"], line


def _rules(raw: list[dict[str, Any]], path: tuple, lines: Lines, file: str) -> list[tuple[str | None, dict, int]]:
    """Every rule's parts; an `else` rule comes last (a rule after it could never hold)."""
    parts = [_rule_parts(r, path + (i,), lines, file) for i, r in enumerate(raw)]
    for when, _, line in parts[:-1]:
        if when is None:
            raise PlaybookError(file, line, "an `else` rule that is not the last rule", "move it to the end")
    return parts


def _policy(raw: dict[str, Any], path: tuple, lines: Lines, file: str) -> Policy:
    """`tool.spec.policy`: the rules with their actions; a jump names where it goes."""
    rules = []
    for when, then, line in _rules(raw["rules"], path + ("rules",), lines, file):
        rule = Rule(when, then["do"], then.get("attempts"), then.get("backoff"), then.get("delay"), then.get("to"))
        rule.set, rule.line = _rule_set(then), line
        if rule.do == JUMP and not rule.to:
            raise PlaybookError(file, line, "a `do: jump` rule without `to:`", "add `to: <step>`, the step to go to")
        rules.append(rule)
    line = schema.line_of(lines, path) or 0
    return Policy(rules, raw.get("mode", EXCLUSIVE), raw.get("on_unmatched", CONTINUE), line)


def _rule_set(then: dict[str, Any]) -> dict[str, Any]:
    """`set`, with the older `set_ctx: {x}` read as `ctx.x` and `set_iter: {x}` as `iter.x`."""
    out = dict(then.get("set") or {})
    for key, scope in (("set_ctx", "ctx"), ("set_iter", "iter")):
        out.update({f"{scope}.{name}": value for name, value in (then.get(key) or {}).items()})
    return out


def _admit(raw: dict[str, Any], path: tuple, lines: Lines, file: str) -> Admit:
    rules = [(when, then["allow"], line) for when, then, line in _rules(raw["rules"], path + ("rules",), lines, file)]
    return Admit(rules, raw.get("mode", EXCLUSIVE))


def _loop(raw: dict[str, Any], shape: str, path: tuple, lines: Lines, file: str) -> Loop:
    if shape != "v2":
        line = schema.line_of(lines, path + ("collection",)) or 0
        mode = ASYNC if raw.get("mode") in ("async", "parallel") else SEQUENTIAL
        return Loop(raw["collection"], raw["element"], mode, raw.get("max_in_flight"), line)
    spec = {"mode": raw.get("mode"), **(raw.get("spec") or {})}  # `loop.mode`: NoETL's v2 until January 2026
    source = "cursor" if "cursor" in raw else "in"
    line = schema.line_of(lines, path + (source,)) or schema.line_of(lines, path) or 0
    if ("in" in raw) == ("cursor" in raw):
        raise PlaybookError(file, line, "a loop takes `in:` (a list) or `cursor:` (a claim), exactly one of them")
    if (spec.get("mode") == "cursor") != (source == "cursor"):
        raise PlaybookError(file, line, "`spec.mode: cursor` goes with `cursor:`, and only with it", "fix one of them")
    mode = ASYNC if spec.get("mode") in ("async", "parallel", "cursor") else SEQUENTIAL  # cursor: workers claim at once
    return Loop(raw.get("in"), raw["iterator"], mode, spec.get("max_in_flight"), line, raw.get("cursor"))


def _next(raw: Any, shape: str, path: tuple, lines: Lines) -> Next:
    out = Next()
    if shape == "v2":
        listed = isinstance(raw, list)  # NoETL's v2 before canonical v10: the arcs right under `next:`
        spec = {} if listed else raw.get("spec") or {}
        out.mode, out.on_no_match = spec.get("mode", EXCLUSIVE), spec.get("on_no_match", "complete")
        for i, arc in enumerate(raw if listed else raw["arcs"]):
            line = schema.line_of(lines, path + ((i,) if listed else ("arcs", i))) or 0
            branch = Branch([arc["step"]], arc.get("when"), line, dict(arc.get("set") or {}))
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


def _all_steps(playbook: Playbook) -> list[Step]:
    return [*playbook.steps.values(), *playbook.workbook.values()]


def check_references(playbook: Playbook) -> None:
    """A policy's `jump` goes to a step of the playbook; a `tool: workbook` step names a task of its `workbook:`
    (unless the name is a template, known when it runs)."""
    for step in _all_steps(playbook):
        for task in step.tasks:  # a task of a tool pipeline jumps to a task of its step (NoETL's pagination)
            for rule in task.policy.rules if task.policy else []:
                if rule.do == JUMP and rule.to not in {t.name for t in step.tasks}:
                    raise PlaybookError(
                        playbook.file,
                        rule.line,
                        f"task '{task.name}' of step '{step.name}' jumps to '{rule.to}', which is not a task of it",
                        f"use one of: {', '.join(t.name for t in step.tasks)}",
                    )
        for rule in step.policy.rules if step.policy else []:
            if rule.do == JUMP and rule.to not in playbook.steps:
                raise PlaybookError(
                    playbook.file,
                    rule.line,
                    f"step '{step.name}' jumps to '{rule.to}', which is not a step of this playbook",
                    f"use one of: {', '.join(playbook.steps)}",
                )
        name = step.config.get("name") if step.tool == model.WORKBOOK else None
        if isinstance(name, str) and "{" not in name and name not in playbook.workbook:
            raise PlaybookError(
                playbook.file,
                step.lines.get("name", step.line),
                f"step '{step.name}' names workbook task '{name}', which the playbook's `workbook:` does not define",
                f"use one of: {', '.join(playbook.workbook) or '(none: add a `workbook:` list)'}",
            )


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
        name = todo.pop()
        for target, _ in graph[name] + _jumps(playbook.steps[name]):
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


def _jumps(step: Step) -> list[tuple[str, int]]:
    """Where a step's policy may jump to (a jump reaches a step, but is not a route: it may go back)."""
    return [(r.to, r.line) for r in (step.policy.rules if step.policy else []) if r.do == JUMP and r.to]


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
