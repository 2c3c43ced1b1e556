"""Checks of a playbook before anything runs (what `steps validate` does, and `steps run` before it asks a worker):
every name a template reads, the statements that would change a worker's connection, the values a command pastes
into its SQL; and `--set` values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.lake import LAKE
from ducklake_kit.steps import noetl, sqltext, templates
from ducklake_kit.steps.model import Playbook
from ducklake_kit.steps.schema import PlaybookError, load_value
from ducklake_kit.workers.config import LOCAL_DB


def check_names(playbook: Playbook, extra: set[str] = frozenset()) -> None:
    """Every name a template reads exists somewhere: a workload key (or --set), a step, a var, a loop variable or a
    built-in. PlaybookError at the line of the first that does not (a typo fails before anything runs)."""
    known = (
        set(playbook.workload)
        | set(extra)
        | set(playbook.steps)
        | templates.BUILTINS
        | {v for s in playbook.steps.values() for v in s.vars}
        | set(templates._TEXT.globals)
    )
    for step in playbook.steps.values():
        taken = sorted(v for v in step.vars if v in playbook.steps or v in templates.BUILTINS)
        if taken:
            what = "a step's name" if taken[0] in playbook.steps else "a name every template has"
            raise PlaybookError(
                playbook.file,
                step.lines.get("vars", step.line),
                f"step '{step.name}' sets vars.{taken[0]}, but {taken[0]} is {what}",
                "give the var another name",
            )
        mine = known | ({step.loop.iterator} if step.loop else set())
        checks: list[tuple[Any, int, bool]] = [(c, ln, False) for c, ln in zip(step.commands, step.command_lines)]
        checks += [
            (step.params, step.lines.get("params", step.line), False),
            (step.vars, step.lines.get("vars", step.line), False),
        ]
        cat = step.catalog
        checks += [
            (v, step.lines.get(k, step.line), False)
            for k, v in (
                ("auth", cat.auth),
                ("catalog_connection", cat.connection),
                ("catalog_name", cat.name),
                ("data_path", cat.data_path),
                ("memory_limit", step.memory_limit),
            )
            if v
        ]
        if step.loop:
            checks.append((step.loop.collection, step.loop.line, False))
        if step.next:
            checks += [(b.when, b.line, True) for b in step.next.branches]
        for template, line, is_condition in checks:
            try:
                used = templates.condition_names(template) if is_condition else templates.names_used(template)
            except templates.TemplateError as exc:
                raise PlaybookError(playbook.file, line, f"step '{step.name}': {exc.what}") from None
            unknown = sorted(used - mine)
            if unknown:
                raise PlaybookError(
                    playbook.file,
                    line,
                    f"step '{step.name}' uses {{{{ {unknown[0]} }}}}, which is not "
                    "defined: no workload key, step, var or loop variable has that name",
                    "define it under `workload:` or with `--set name=value`, or fix the spelling",
                )


def declared_catalogs(playbook: Playbook) -> frozenset[str]:
    """The databases a step may USE: the catalogs the playbook names (catalog_name, when it is not a template), the
    kit's lake and the worker-local database."""
    return frozenset({LAKE, LOCAL_DB} | {s.catalog.name for s in playbook.steps.values() if "{" not in s.catalog.name})


def check_session(playbook: Playbook) -> None:
    """A command (one without templates: the others are checked when rendered) that would change the worker's
    connection for later tasks is an error at its line (sqltext.session_refused)."""
    declared = declared_catalogs(playbook)
    for step in playbook.steps.values():
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


def paste_warnings(playbook: Playbook) -> list[str]:
    """A warning per value a command pastes into its SQL as it is: `steps run` refuses one that would change the
    statement, but a quoted literal (`| sql`) or a parameter is what keeps every value a value."""
    out = []
    for step in playbook.steps.values():
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
    check_session(playbook)
    return playbook
