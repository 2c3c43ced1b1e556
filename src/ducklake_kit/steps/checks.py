"""Checks of a playbook before anything runs (what `steps validate` does, and `steps run` before it asks a worker):
every name a template reads, the statements that would change a worker's connection, the values a command pastes
into its SQL; and `--set` values."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes

from ducklake_kit.errors import KitError
from ducklake_kit.lake import LAKE
from ducklake_kit.steps import noetl, sqltext, templates
from ducklake_kit.steps.model import DUCKLAKE, Playbook, Step
from ducklake_kit.steps.schema import PlaybookError, load_value
from ducklake_kit.workers.config import LOCAL_DB


def check_names(playbook: Playbook, extra: set[str] = frozenset()) -> None:
    """Every name a template reads exists somewhere: a workload key (or --set), a step, a var, a loop variable or a
    built-in; and every `ctx.x` read is a workload key, a --set value or set by some `set:` (a step's, a policy
    rule's or an arc's). PlaybookError at the line of the first that does not (a typo fails before anything runs)."""
    known = (
        set(playbook.workload)
        | set(extra)
        | set(playbook.steps)
        | templates.BUILTINS
        | {v for s in playbook.steps.values() for v in s.vars}
        | set(templates._TEXT.globals)
        | ({"keychain"} if playbook.keychain else set())  # {{ keychain.NAME.field }}: its entries, by name
    )
    ctx_known = set(playbook.workload) | set(extra) | ctx_set(playbook)
    # a workbook task runs as the step that names it, maybe in that step's loop
    iterators = {s.loop.iterator for s in playbook.steps.values() if s.loop} | {"loop_index"}
    tasks = {id(t) for t in tasks_of(playbook)}
    known |= {t.name for t in tasks_of(playbook)}  # a task reads the tasks before it by their names
    for step in every_step(playbook):
        _check_vars(playbook, step)
        if id(step) in tasks or (step.name in playbook.workbook and step is playbook.workbook[step.name]):
            mine = known | iterators
        elif step.loop:
            mine = known | {step.loop.iterator, "loop_index"}
        else:  # `iter` is a loop iteration's own scope: read in a step without a loop, it is a mistake
            mine = known - {"iter"}
        for template, line, is_condition in templates_of(step):
            try:
                used = templates.condition_names(template) if is_condition else templates.names_used(template)
                unset = sorted(ctx_reads(template, is_condition) - ctx_known)
            except templates.TemplateError as exc:
                raise PlaybookError(playbook.file, line, f"step '{step.name}': {exc.what}") from None
            _refuse_unknown(playbook.file, step, line, sorted(used - mine), unset)


def every_step(playbook: Playbook) -> list[Step]:
    """The workflow's steps, then the workbook's tasks (each runs as a step)."""
    return [*playbook.steps.values(), *tasks_of(playbook), *playbook.workbook.values()]


def tasks_of(playbook: Playbook) -> list[Step]:
    """The tasks of the steps whose tool is a list of them (each checked as a step)."""
    return [t for s in playbook.steps.values() for t in s.tasks]


def _check_vars(playbook: Playbook, step: Step) -> None:
    taken = sorted(v for v in step.vars if v in playbook.steps or v in templates.BUILTINS)
    if taken:
        what = "a step's name" if taken[0] in playbook.steps else "a name every template has"
        raise PlaybookError(
            playbook.file,
            step.lines.get("vars", step.line),
            f"step '{step.name}' sets vars.{taken[0]}, but {taken[0]} is {what}",
            "give the var another name",
        )


def _refuse_unknown(file: str, step: Step, line: int, unknown: list[str], unset: list[str]) -> None:
    if unknown == ["iter"]:
        raise PlaybookError(
            file,
            line,
            f"step '{step.name}' reads {{{{ iter }}}}, but it has no loop: `iter` is a loop iteration's own",
            "give the step a `loop:`, or read `ctx` or a step's result instead",
        )
    if unknown:
        raise PlaybookError(
            file,
            line,
            f"step '{step.name}' uses {{{{ {unknown[0]} }}}}, which is not "
            "defined: no workload key, step, var or loop variable has that name",
            "define it under `workload:` or with `--set name=value`, or fix the spelling",
        )
    if unset:
        raise PlaybookError(
            file,
            line,
            f"step '{step.name}' reads {{{{ ctx.{unset[0]} }}}}, but nothing sets ctx.{unset[0]}: no workload key, "
            "--set value or `set:` has that name",
            f"set it (`set: {{ctx.{unset[0]}: ...}}` on a step, a policy rule or an arc), or fix the spelling",
        )


# a tool's keys that are not templates: python's code runs as it is (NoETL does not render it), libs are imports;
# a SQL tool's commands are checked as the step's commands
_NOT_TEMPLATES = frozenset({"code", "libs", "command", "commands", "query"})


def templates_of(step: Step) -> list[tuple[Any, int, bool]]:
    """Every template of a step, with its line and whether it is a condition (`when`, read as an expression)."""
    at = step.lines.get
    out: list[tuple[Any, int, bool]] = list(zip(step.commands, step.command_lines, itertools.repeat(False)))
    out += [(step.params, at("params", step.line), False), (step.vars, at("vars", step.line), False)]
    cat = step.catalog
    named = (("auth", cat.auth), ("catalog_connection", cat.connection), ("catalog_name", cat.name))
    named += (("data_path", cat.data_path), ("memory_limit", step.memory_limit))
    out += [(v, at(k, step.line), False) for k, v in named if v]
    out += [(v, at(k, step.line), False) for k, v in step.config.items() if k not in _NOT_TEMPLATES]
    out += [(step.input, at("input", step.line), False), (step.set, at("set", step.line), False)]
    return out + _loop_templates(step) + _rule_templates(step)


def _loop_templates(step: Step) -> list[tuple[Any, int, bool]]:
    if step.loop is None:
        return []
    loop = step.loop
    return [
        (loop.collection, loop.line, False),
        (loop.max_in_flight, loop.line, False),
        (loop.cursor, loop.line, False),
    ]


def _rule_templates(step: Step) -> list[tuple[Any, int, bool]]:
    """The `when`s (conditions) and `set`s of the step's policy rules, admit rules and arcs."""
    out: list[tuple[Any, int, bool]] = []
    for rule in step.policy.rules if step.policy else []:
        out += [(rule.when, rule.line, True)] if rule.when else []
        out.append((rule.set, rule.line, False))
    out += [(when, line, True) for when, _, line in (step.admit.rules if step.admit else []) if when]
    for branch in (*step.next.always, *step.next.branches, *step.next.otherwise) if step.next else ():
        out += [(branch.when, branch.line, True)] if branch.when else []
        out.append((branch.set, branch.line, False))
    return out


# what a rule reads under `step` of the step's own outcome: a `set: step.x` of these would be hidden by it
STEP_RESULT = ("status", "data", "result", "error")


def check_step_sets(playbook: Playbook) -> None:
    """A `set: {step.x: ...}` writes NoETL's step scope; `step.status`, `.data`, `.result` and `.error` are the step's
    outcome as its rules read it, so a write there could never be read back: PlaybookError at its line."""
    for step in every_step(playbook):
        sets = [(step.set, step.lines.get("set", step.line))]
        sets += [(r.set, r.line) for r in (step.policy.rules if step.policy else [])]
        sets += (
            [(b.set, b.line) for b in (*step.next.always, *step.next.branches, *step.next.otherwise)]
            if step.next
            else []
        )
        for written, line in sets:
            for name in written:
                if str(name).startswith("step.") and str(name)[len("step.") :] in STEP_RESULT:
                    raise PlaybookError(
                        playbook.file,
                        line,
                        f"step '{step.name}': `set: {name}` names a field of the step's outcome, which its rules read as "
                        f"`{name}`: the value written could never be read",
                        f"give it another name (`step.my_{name.removeprefix('step.')}`), or use ctx.x / iter.x",
                    )


def ctx_set(playbook: Playbook) -> set[str]:
    """The ctx names some `set:` writes (a step's, a policy rule's, an arc's): `ctx.x`, or a bare `x`."""
    sets: list[dict[str, Any]] = []
    for step in every_step(playbook):
        sets.append(step.set)
        sets += [r.set for r in (step.policy.rules if step.policy else [])]
        sets += [b.set for b in (*step.next.always, *step.next.branches, *step.next.otherwise)] if step.next else []
    keys = {k for s in sets for k in s}
    return {k.removeprefix("ctx.") for k in keys if k.startswith("ctx.") or "." not in k}


def ctx_reads(template: Any, is_condition: bool = False) -> set[str]:
    """The names a template reads from `ctx` (`ctx.x`, `ctx['x']`); TemplateError when it does not parse."""
    if isinstance(template, (list, tuple)):
        return set().union(set(), *(ctx_reads(v) for v in template))
    if isinstance(template, dict):
        return set().union(set(), *(ctx_reads(v) for v in template.values()))
    if not isinstance(template, str) or "ctx" not in template:
        return set()
    text = template.strip()
    if is_condition and "{{" not in text and "{%" not in text:
        text = "{{ " + text + " }}"
    try:
        tree = templates._TEXT.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise templates.TemplateError(f"template syntax error: {exc.message}") from None
    return {n.attr for n in tree.find_all(jinja2.nodes.Getattr) if _is_ctx(n.node)} | {
        n.arg.value
        for n in tree.find_all(jinja2.nodes.Getitem)
        if _is_ctx(n.node) and isinstance(n.arg, jinja2.nodes.Const) and isinstance(n.arg.value, str)
    }


def _is_ctx(node: jinja2.nodes.Node) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.name == "ctx"


def declared_catalogs(playbook: Playbook) -> frozenset[str]:
    """The databases a step may USE: the catalogs the playbook names (catalog_name, when it is not a template), the
    kit's lake and the worker-local database."""
    return frozenset({LAKE, LOCAL_DB} | {s.catalog.name for s in every_step(playbook) if "{" not in s.catalog.name})


def check_session(playbook: Playbook) -> None:
    """A command (one without templates: the others are checked when rendered) that would change the worker's
    connection for later tasks is an error at its line (sqltext.session_refused)."""
    declared = declared_catalogs(playbook)
    for step in every_step(playbook):
        if step.tool != DUCKLAKE:  # a postgres or duckdb tool has a connection of its own, for this call only
            continue
        for i, (command, line) in enumerate(zip(step.commands, step.command_lines)):
            if "{{" in command or "{%" in command:
                continue
            why = sqltext.session_refused(command, declared)
            if why:
                raise PlaybookError(
                    playbook.file,
                    line,
                    f"step '{step.name}', command {i}: {why}",
                    "remove the statement, or declare the catalog as docs/step-runner.md (Catalogs) shows",
                )


def check_upserts(playbook: Playbook) -> None:
    """An upsert into a lake table (`INSERT ... ON CONFLICT`, `INSERT OR REPLACE`) in a ducklake step is an error at
    its line, with the MERGE INTO that does the same on DuckLake (sqltext.on_conflict_refusal): DuckLake tables have
    no keys to conflict on, so it could only fail when the step runs."""
    for step in every_step(playbook):
        if step.tool != DUCKLAKE:  # PostgreSQL and a duckdb tool's own database have keys: ON CONFLICT works there
            continue
        for i, (command, line) in enumerate(zip(step.commands, step.command_lines)):
            why = sqltext.on_conflict_refusal(command)
            if why:
                raise PlaybookError(
                    playbook.file, line, f"step '{step.name}', command {i}: {why}", "run the MERGE INTO instead"
                )


def paste_warnings(playbook: Playbook) -> list[str]:
    """A warning per value a command pastes into its SQL as it is: `steps run` refuses one that would change the
    statement, but a quoted literal (`| sql`) or a parameter is what keeps every value a value."""
    out = []
    for step in every_step(playbook):
        for i, (template, line) in enumerate(zip(step.commands, step.command_lines)):
            for expression, offset in templates.pasted(template):
                out.append(
                    f"{playbook.file}:{line + offset - 1}: step '{step.name}', command {i} pastes "
                    f"{{{{ {expression} }}}} into its SQL as it is: write {{{{ {expression} | sql }}}} for a quoted "
                    "literal, or bind it as a parameter (params: and $name in the SQL)"
                )
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """--set key=value (the value read as YAML: 3 is a number, [1, 2] a list, text stays text)."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise KitError(f"--set {pair!r} is not name=value", "e.g. --set batch_ids=[1,2,3] --set region=eu")
        try:
            out[key] = load_value(value, f"--set {key}") if value.strip() else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def load(file: Path, overrides: dict[str, Any] | None = None) -> Playbook:
    """Read, validate and name-check a playbook (what `steps validate` does): PlaybookError at the first problem."""
    playbook = noetl.load(file)
    check_names(playbook, set(overrides or {}))
    check_step_sets(playbook)
    check_session(playbook)
    check_upserts(playbook)
    return playbook
