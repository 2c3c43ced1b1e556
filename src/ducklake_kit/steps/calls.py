"""One call of a step's tool, for every kind but `ducklake` (which `runner` submits with its catalog and its commit
token): the step's templates rendered for the call's names, its credential resolved, then the kind run (`kinds`).

Where each runs: `python` on a worker of the plane (any worker); `postgres`, `http` and `duckdb` in the runner's own
process (they talk to other services, or, for `duckdb`, to the run's own database file, which one process at a time
may write). A `workbook` step runs the top-level workbook task it names, with its own tool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.steps import catalogs, kinds, sqltext, templates
from ducklake_kit.steps.model import DUCKDB, HTTP, NOOP, PLAYBOOK, POSTGRES, PYTHON, WORKBOOK, Playbook, Step
from ducklake_kit.workers.client import WorkerPlane
from ducklake_kit.workers.tasks import TaskResult

DUCKDB_FOLDER = "steps-duckdb"  # in the state folder: one database file per run (NoETL: one per execution)
_NOT_CONFIG = {"kind", "spec", "output", "input", "args", "auth", "command", "commands", "code", "name"}


@dataclass
class CallEnv:
    """What a call needs from its run."""

    playbook: Playbook
    plane: WorkerPlane
    endpoints: Endpoints
    home: Path
    execution_id: str


def call(step: Step, ctx: dict[str, Any], env: CallEnv) -> kinds.KindResult:
    """Run the step's tool once for `ctx`; KitError (one line naming the step) for what stops it before it runs."""
    where = f"step '{step.name}'"
    if step.tool == NOOP:
        return kinds.KindResult()
    if step.tool == POSTGRES:
        auth = templates.render_text(str(step.config.get("auth") or step.catalog.auth or ""), ctx).strip()
        pg = catalogs.postgres(where, auth or None, endpoints=env.endpoints, home=env.home)
        return kinds.run_postgres(pg, sql_commands(step, ctx))
    if step.tool == DUCKDB:
        return kinds.run_duckdb(duckdb_file(step, ctx, env), sql_commands(step, ctx))
    if step.tool == HTTP:
        config = {k: v for k, v in step.config.items() if k not in _NOT_CONFIG}
        return kinds.run_http(templates.render_value(config, ctx))
    if step.tool == PYTHON:
        return _python(step, ctx, env)
    if step.tool == PLAYBOOK:  # the runner runs it (a run of its own on the same plane)
        raise KitError(f"{where}: a sub-playbook is run by the runner, not as a call", "this is a bug of the kit")
    raise KitError(f"{where}: the kit's step runner does not run tool kind '{step.tool}'", "run it with NoETL")


def sql_commands(step: Step, ctx: dict[str, Any]) -> list[str]:
    """The step's commands rendered; a value pasted as it is that would change a statement is refused."""
    raw = step.commands or _listed(step.config.get("commands")) or _listed(step.config.get("command"))
    out = []
    for i, template in enumerate(raw):
        rendered = templates.render_sql(str(template), ctx)
        refused = sqltext.pasted_values_refused(rendered)
        if refused:
            raise KitError(f"step '{step.name}', command {i}: {refused}", "quote it with `| sql`")
        out.append(rendered.text)
    if not out:
        raise KitError(f"step '{step.name}' has no command", "give it `command:` (text) or `commands:` (a list)")
    return out


def _listed(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def duckdb_file(step: Step, ctx: dict[str, Any], env: CallEnv) -> Path | str:
    """The `database:` the step names, or the run's own file in the state folder."""
    named = step.config.get("database")
    if named:
        return templates.render_text(str(named), ctx).strip()
    folder = env.home / DUCKDB_FOLDER
    folder.mkdir(mode=0o700, exist_ok=True)  # the runs' data: the kit's user's alone, like the rest of the state
    folder.chmod(0o700)
    return folder / f"{env.execution_id}.duckdb"


def inputs(step: Step, ctx: dict[str, Any]) -> dict[str, Any]:
    """The step's `input` (or its tool's `input`/`args`), rendered: the names a python step's code sees."""
    bound = {**(step.config.get("args") or {}), **(step.config.get("input") or {}), **step.input}
    return templates.render_value(bound, ctx)


def _python(step: Step, ctx: dict[str, Any], env: CallEnv) -> kinds.KindResult:
    code = step.config.get("code")
    if not isinstance(code, str) or not code.strip():
        raise KitError(f"step '{step.name}' has no `code`", "give the python tool its code: `code: |` and the lines")
    given = inputs(step, ctx)
    workload = ctx.get("workload") or {}
    names = {**workload, "workload": workload, "ctx": ctx.get("ctx") or {}, "input": given, **given}
    if "iter" in ctx:
        names["iter"] = ctx["iter"]
    libs = step.config.get("libs") or {}
    res = env.plane.result(env.plane.submit_call(kinds.run_python, code, names, libs))
    if isinstance(res, TaskResult):  # its worker died holding it: python changes no lake, say what happened
        return kinds.KindResult().fail(res.error.error if res.error else "its worker died")
    return res


def workbook_task(step: Step, ctx: dict[str, Any], playbook: Playbook) -> Step:
    """A `tool: workbook` step as the workbook task it names (with the step's name and inputs), to run as a step."""
    name = templates.render_text(str(step.config.get("name") or ""), ctx).strip()
    task = playbook.workbook.get(name)
    if task is None:
        known = ", ".join(sorted(playbook.workbook)) or "none"
        raise KitError(
            f"step '{step.name}' names workbook task '{name}', which the playbook's `workbook:` does not define "
            f"(it has: {known})",
            "add it under `workbook:` or fix the name",
        )
    if task.tool == WORKBOOK:
        raise KitError(f"workbook task '{name}' is itself a `tool: workbook`", "give it a tool of its own")
    return replace(task, name=step.name, input={**task.input, **step.input})


def playbook_file(step: Step, ctx: dict[str, Any], folder: Path) -> Path:
    """The file a `tool: playbook` step's `path` names. NoETL's paths name a playbook in its catalog
    (`api_integration/auth0/get_auth0_token`); here, a file: the path itself, with `.yaml`, or its folder's
    `playbook.yaml` or `<last part>.yaml`, from the calling playbook's folder and then from the current one."""
    path = templates.render_text(str(step.config.get("path") or ""), ctx).strip()
    if not path:
        raise KitError(f"step '{step.name}' runs a sub-playbook but names no `path`", "give the playbook's path")
    tried = []
    for base in (folder, Path.cwd()):
        target = base / path
        for candidate in (
            target,
            target.with_name(target.name + ".yaml"),
            target / "playbook.yaml",
            target / f"{target.name}.yaml",
        ):
            tried.append(str(candidate))
            if candidate.is_file():
                return candidate
    raise KitError(
        f"step '{step.name}': no playbook at {path} (looked for {', '.join(tried[:4])}, ...)",
        "give the path of the sub-playbook's file (NoETL's catalog paths are read as files here)",
    )
