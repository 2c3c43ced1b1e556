"""Running a playbook on the worker plane.

Steps run in route order (`noetl.order`): a step runs when the run reaches it, from `start` (or the first step)
through `next`; in a playbook where no step has `next`, every step leads to the one after it. A failed step is not followed by its
unconditional arcs, its `else` or the step after it: only by `when` branches that hold (they see
`status`), so a playbook handles an error only where it says so; every step not reached is reported as skipped,
with the reason. Any failed step makes the run fail.

Each step is one task on a worker (its commands on the worker's pooled connection); a loop's iterations are one
task each: `async` keeps up to `max_in_flight` of them running at once (default: one per worker thread, so all of
the workers), `sequential` runs them one after another. Every iteration runs and is reported; the loop fails if any did.

Exactly once (see `once`): a step or iteration that writes commits a token of its own; when its fate is unknown (its
worker died, the plane's scheduler was lost) the runner looks it up in the lake. `--resume RUN` runs a run again under
its execution id: what the lake says it committed is not run again. A lost scheduler ends the run `aborted`.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.steps import calls, catalogs, kinds, noetl, once, policy, sqltext, templates

# the checks before a run are reached through the runner too (runner.load, runner.parse_overrides ...)
from ducklake_kit.steps.checks import (  # the checks before a run are reached through the runner too
    declared_catalogs,
    paste_warnings,
)
from ducklake_kit.steps.checks import load as load  # runner.load, runner.parse_overrides: the CLI's and lessons' calls
from ducklake_kit.steps.checks import parse_overrides as parse_overrides
from ducklake_kit.steps.driven import Driven
from ducklake_kit.steps.model import (
    ASYNC,
    DUCKLAKE,
    EXCLUSIVE,
    TASKS,
    WORKBOOK,
    Playbook,
    Step,
)
from ducklake_kit.steps.results import ERROR, OK, SKIPPED, Attempt, Failure, Iteration, PlaybookRun, StepFailed, StepRun
from ducklake_kit.steps.task import StepOptions, StepTask, Target, run_step
from ducklake_kit.workers.client import WorkerPlane
from ducklake_kit.workers.config import PlaneConfig
from ducklake_kit.workers.tasks import TaskResult

Event = Callable[[str, dict[str, Any]], None]


# -- one step --------------------------------------------------------------------------------------------------
class PlaneLost(Exception):
    """The runner lost the plane's scheduler: no task's outcome can come from the plane any more. `task`: the step's
    own outcome, decided by the lake, when it was running."""

    def __init__(self, why: str, task: StepTask | None = None):
        super().__init__(why)
        self.why, self.task = why, task


class Runner(Driven):
    def __init__(
        self,
        playbook: Playbook,
        plane: WorkerPlane,
        endpoints: Endpoints,
        home: Path,
        *,
        overrides: dict[str, Any] | None = None,
        on_event: Event = lambda _k, _d: None,
        resume: str | None = None,
    ):
        self.playbook, self.plane, self.endpoints, self.home = playbook, plane, endpoints, home
        self.on_event = on_event
        self.resume = resume
        self.execution_id = resume or uuid.uuid4().hex[:12]
        self.fates = once.Fates(endpoints)
        self.aborted: str | None = None
        workload = {**playbook.workload, **(overrides or {})}
        self.vars: dict[str, Any] = {}
        self.ctx: dict[str, Any] = dict(workload)  # NoETL's ctx: the workload, then what `set:` writes
        self.jumps: dict[str, str] = {}  # step -> the step a policy rule's `jump` chose
        self.broken: set[str] = set()  # loop steps a policy rule's `break` ended
        self.depth = 0  # how deep in sub-playbooks (`tool: playbook`) this run is
        self.databases: set = set()  # the other catalogs' PostgreSQL databases known to exist in this run
        self.context: dict[str, Any] = {
            **workload,
            "workload": workload,
            "vars": self.vars,
            "ctx": self.ctx,
            "execution_id": self.execution_id,
            "playbook": {"name": playbook.name, "file": playbook.file},
        }
        self.env = calls.CallEnv(playbook, plane, endpoints, home, self.execution_id)
        if playbook.keychain:  # NoETL's keychain: each entry by its name, from the credentials file (never printed)
            self.context["keychain"] = catalogs.keychain(playbook.keychain, endpoints=endpoints, home=home)

    def _target(self, step: Step, ctx: dict[str, Any]) -> Target:
        c = step.catalog

        def text(value: str | None) -> str | None:
            return templates.render_text(value, ctx).strip() if value is not None else None

        rendered = replace(
            c,
            auth=text(c.auth),
            connection=text(c.connection),
            name=text(c.name) or "lake",
            data_path=text(c.data_path),
        )
        target = catalogs.resolve(f"step '{step.name}'", rendered, endpoints=self.endpoints, home=self.home)
        if target.pg is not None and target.create and target.pg not in self.databases:
            # DuckLake creates a catalog's tables, not its database: create that too, once per run, as `up` does
            try:
                postgres.ensure_database(target.pg)
            except psycopg.Error as exc:  # e.g. no CREATEDB right: the step's failure, said in one line
                pg = target.pg
                raise KitError(
                    f"step '{step.name}': cannot create the catalog's database {pg.dbname} on {pg.host}:{pg.port} "
                    f"({first_line(exc)})",
                    "create it, or give the user the CREATEDB right",
                ) from None
            self.databases.add(target.pg)
        return target

    def _commands(self, step: Step, target: Target, ctx: dict[str, Any], warnings: list[str]) -> list[str]:
        texts = []
        for i, template in enumerate(step.commands):
            rendered = templates.render_sql(template, ctx)
            refused = sqltext.pasted_values_refused(rendered) or sqltext.session_refused(
                rendered.text, declared_catalogs(self.playbook) | {target.alias}
            )
            if refused:
                raise StepFailed(Failure(f"command {i}: {refused}", None, rendered.text.strip()))
            text, rewrites = sqltext.rewrite_time_travel(rendered.text)
            for r in rewrites:
                warning = f"step '{step.name}', command {i}: {r.warning()}"
                if warning not in warnings:
                    warnings.append(warning)
            why = sqltext.unsupported_constraint(text)
            if why:
                why += " (or run the playbook with `steps run --drop-constraints`, which removes them with a warning)"
                raise StepFailed(Failure(why, None, text.strip()))
            texts.append(text)
        return texts

    def _unit(self, step: Step, prepared: tuple, index: int | None = None, element: Any = None) -> once.Unit:
        return once.Unit(
            self.playbook.name,
            self.execution_id,
            step.name,
            index,
            element,
            once.kind_of(step.transaction, prepared[1]),
        )

    def _submit(self, step: Step, prepared: tuple, unit: once.Unit, *, with_info: bool, label: str, retry=False):
        target, texts, params, settings = prepared
        decided = unit.kind == once.DECIDED  # one transaction, whose commit carries the unit's token
        message = f"steps {self.playbook.name}: {label} (run {self.execution_id})" if decided else None
        return self.plane.submit_call(
            run_step,
            target,
            texts,
            params,
            StepOptions(
                message=message,
                keep_going=step.on_error == "continue",
                settings=settings,
                with_info=with_info,
                commit_token=unit.token if decided else None,
                extra=unit.extra if decided else None,
                recheck=decided and (self.resume is not None or retry),  # a retry never lands a commit twice
            ),
        )

    def _outcome(self, future, unit: once.Unit, target: Target) -> StepTask:
        """The task's result; a task whose worker died, or that failed on the plane, decided by the lake (`once`).
        PlaneLost when the scheduler is gone (the caller settles what was running)."""
        try:
            res = self.plane.result(future)
        except Exception as exc:  # noqa: BLE001 - e.g. cancelled because the scheduler went away
            if self.plane.scheduler_lost():
                raise PlaneLost(
                    f"the worker plane's scheduler was lost ({type(exc).__name__}: {first_line(exc)})"
                ) from None
            return self.fates.settle(
                unit, target, f"the task failed on the worker plane ({type(exc).__name__}: {first_line(exc)})"
            )
        if isinstance(res, TaskResult):  # the worker died holding the task: never run again, the lake decides
            why = res.error.error.split(";")[0] if res.error else "its worker died"
            return self.fates.settle(unit, target, why, res.worker, res.address)
        return res

    def _one(
        self, step: Step, prepared: tuple, unit: once.Unit, *, with_info: bool, label: str, retry=False
    ) -> StepTask:
        """A step (or iteration) run on the plane, unless --resume finds it must not run again."""
        if self.resume is not None:
            known = self.fates.before(unit, prepared[0])
            if known is not None:
                return known
        future = self._submit(step, prepared, unit, with_info=with_info, label=label, retry=retry)
        try:
            return self._outcome(future, unit, prepared[0])
        except PlaneLost as exc:
            raise PlaneLost(
                exc.why, self.fates.settle(unit, prepared[0], f"{exc.why}, while this step ran", final=False)
            ) from None

    def _prepare(self, step: Step, ctx: dict[str, Any], warnings: list[str]) -> tuple:
        """(the catalog, the commands' text, the params, the step's settings), rendered for `ctx`."""
        try:
            target = self._target(step, ctx)
            if not target.kit and "://" not in (target.data_path or ""):
                warning = (
                    f"step '{step.name}': data_path {target.data_path} is a local folder: workers on other machines "
                    "will not see it (give the catalog an s3:// path to share it)"
                )
                if warning not in warnings:
                    warnings.append(warning)
            texts = self._commands(step, target, ctx, warnings)
            params = templates.render_value(step.params, ctx)
            settings: dict[str, Any] = {}
            if step.memory_limit is not None:
                settings["memory_limit"] = templates.render_text(step.memory_limit, ctx).strip()
            if step.threads is not None:
                settings["threads"] = step.threads
        except KitError as exc:
            raise StepFailed(Failure(exc.what)) from None
        return target, texts, {str(k): v for k, v in params.items()}, settings

    def run_step(self, step: Step) -> StepRun:
        run = StepRun(step.name, OK, step.desc, kind=step.tool)
        self.context["step"] = run.scope  # NoETL's `step` scope, for its templates until it is finished (_run)
        start = time.perf_counter()
        self.on_event("step", {"step": step.name, "desc": step.desc, "loop": step.loop is not None})
        try:
            allowed, line = policy.admitted(step.admit, self.context)
            if not allowed:
                run.status, run.reason = SKIPPED, f"not admitted: its admit rule at line {line} said no"
                return run
            if step.tool == WORKBOOK:
                step = calls.workbook_task(step, self.context, self.playbook)
                run.kind = f"{WORKBOOK}:{step.tool}"
            if step.tool is None:
                pass  # a step that only routes
            elif step.loop is not None and step.loop.cursor is not None:
                self._run_sequential(step, run, self._cursor(step), None)
            elif step.tool == TASKS and step.loop is None:
                run.attempt = self._pipeline(step, run, self.context)
            elif step.tool == TASKS:
                collection = self._collection(step)
                self._run_sequential(step, run, collection, len(collection))
            elif step.tool != DUCKLAKE:
                self._run_kind(step, run)
            elif step.loop is None:
                self._ducklake_step(step, run)
            else:
                self._run_loop(step, run)
        except KitError as exc:  # a template, a credential or a rule that cannot be rendered: the step fails
            run.failure = Failure(exc.what)
        except StepFailed as exc:
            run.failure = exc.failure
        except Exception as exc:  # the plane failed under the step: the run stops, saying so
            if not isinstance(exc, PlaneLost) and not self.plane.scheduler_lost():
                raise
            if isinstance(exc, PlaneLost) and exc.task is not None:
                run.attempt, run.catalog_info = Attempt.of(exc.task), None
            self.aborted = (
                exc.why
                if isinstance(exc, PlaneLost)
                else (f"the worker plane's scheduler was lost ({type(exc).__name__}: {first_line(exc)})")
            )
        run.status = ERROR if run.error else OK
        run.seconds = round(time.perf_counter() - start, 6)
        return run

    def _ducklake_step(self, step: Step, run: StepRun) -> None:
        prepared = self._prepare(step, self.context, run.warnings)
        unit = self._unit(step, prepared)

        def attempt(retry: bool) -> Attempt:
            task = self._one(step, prepared, unit, with_info=True, label=f"step {step.name}", retry=retry)
            run.catalog_info = task.catalog_info
            out = Attempt.of(task)
            out.data = kinds.sql_data(task.statements, len(prepared[1]))
            return out

        unsafe = once.UNDECIDED_WHY if unit.kind == once.UNDECIDED else None
        run.attempt = self._policied(step, run, attempt, unsafe)

    # -- loops ---------------------------------------------------------------------------------------------------
    def _run_loop(self, step: Step, run: StepRun) -> None:
        loop = step.loop
        assert loop is not None
        collection = self._collection(step)
        # async: at most `limit` iterations running at once. Dask itself runs one task per worker thread, so a limit of
        # at least the plane's threads is met by submitting every iteration at once (queued at the scheduler, each
        # handed to the next free worker without a round trip through this client); a lower one by a window
        threads = self.plane.threads()
        limit = 1 if loop.mode != ASYNC else (loop.max_in_flight or threads)
        if loop.mode == ASYNC and limit >= threads:
            limit = len(collection) or 1
        run.iterations = [Iteration(index=i, element=e) for i, e in enumerate(collection)]
        pending = list(run.iterations)
        running: dict[Any, tuple[Iteration, once.Unit, Target]] = {}
        target: Target | None = None
        from distributed import as_completed

        done_iter = as_completed([], loop=self.plane.client.loop)  # the plane's client is not Dask's default one

        def report(it: Iteration) -> None:
            self.on_event("iteration", {"step": step.name, "iteration": it.as_dict(), "total": len(collection)})

        def submit_next() -> None:
            nonlocal target
            while pending and len(running) < limit:
                it = pending.pop(0)
                ctx = {
                    **self.context,
                    loop.iterator: it.element,
                    "loop": {
                        "element": it.element,
                        "index": it.index,
                        "index1": it.index + 1,
                        "length": len(collection),
                    },
                }
                try:
                    prepared = self._prepare(step, ctx, run.warnings)
                except StepFailed as exc:
                    it.failure = exc.failure
                    report(it)
                    continue
                target = target or prepared[0]
                unit = self._unit(step, prepared, it.index, it.element)
                known = self.fates.before(unit, prepared[0]) if self.resume is not None else None
                if known is not None:  # --resume: committed before (or undecidable): not run again
                    it.take(known)
                    report(it)
                    continue
                future = self._submit(
                    step, prepared, unit, with_info=False, label=f"step {step.name} iteration {it.index}"
                )
                running[future] = (it, unit, prepared[0])
                done_iter.add(future)

        started = time.perf_counter()
        try:
            submit_next()
            while running:
                future = next(done_iter)
                it, unit, where = running[future]
                it.take(self._outcome(future, unit, where))
                it.data = kinds.sql_data(it.statements, len(step.commands))
                self._iteration_policy(step, run, it, collection)
                del running[future]
                report(it)
                submit_next()
        except Exception as exc:  # the scheduler went away: what ran is decided by the lake
            if not isinstance(exc, PlaneLost) and not self.plane.scheduler_lost():
                raise
            why = (
                exc.why
                if isinstance(exc, PlaneLost)
                else (f"the worker plane's scheduler was lost ({type(exc).__name__}: {first_line(exc)})")
            )
            for it, unit, where in running.values():
                it.take(self.fates.settle(unit, where, f"{why}, while this iteration ran", final=False))
            for it in pending:
                it.failure = Failure(f"not run: {why}")
            raise PlaneLost(why) from None
        run.iterations_seconds = round(time.perf_counter() - started, 6)
        if target is not None:  # the catalog's state once every iteration is done
            info = self.plane.result(self.plane.submit_call(run_step, target, [], {}, StepOptions(with_info=True)))
            run.catalog_info = info.catalog_info if isinstance(info, StepTask) else None

    # -- routing -------------------------------------------------------------------------------------------------
    def _route(self, step: Step, run: StepRun, ctx: dict[str, Any]) -> list[str]:
        if step.name in self.jumps:  # a policy rule's `jump` replaces the step's own routes
            return [self.jumps[step.name]]
        if step.next is None:  # the next step in the file, in a playbook without routes (noetl.routes)
            return [t for t, _ in noetl.routes(self.playbook)[step.name]] if run.status == OK else []
        chosen: list[str] = []
        if run.status == OK:
            chosen += [s for b in step.next.always for s in b.steps]
        held = []
        for branch in step.next.branches:
            try:
                if templates.condition(branch.when or "", ctx):
                    held.append(branch)
            except KitError as exc:
                raise StepFailed(Failure(f"its `next` condition at line {branch.line}: {exc.what}")) from None
        if step.next.mode == EXCLUSIVE:
            held = held[:1]
        taken = (step.next.always if run.status == OK else []) + held
        if not held and run.status == OK:
            taken += step.next.otherwise
        scopes = {"ctx": self.ctx, "iter": self.ctx, "step": run.scope}
        for branch in taken:  # an arc's `set:` is written when the arc is taken
            policy.apply_set(branch.set, ctx, scopes)
        return [s for b in taken for s in b.steps]

    def _finish(self, step: Step, run: StepRun) -> list[str]:
        """Publish the step's result and vars to later templates; where the run goes next."""
        mine = run.context()
        self.context[step.name] = mine
        ctx = {
            **self.context,
            "result": mine["result"],
            "catalog_info": mine["catalog_info"],
            "status": run.status,
            "event": {"name": "loop.done" if step.loop else "step.done", "status": run.status},
        }
        try:
            if run.status == OK:
                for name, template in step.vars.items():
                    value = templates.render_value(template, ctx)
                    run.vars[name] = self.vars[name] = self.context[name] = value
                scopes = {"ctx": self.ctx, "iter": self.ctx, "step": run.scope}
                policy.apply_set(step.set, {**ctx, "step": {**run.scope, **mine}}, scopes)
            return self._route(step, run, ctx)
        except KitError as exc:
            run.failure, run.status = Failure(f"its vars or set: {exc.what}"), ERROR
        except StepFailed as exc:
            if run.status == ERROR:  # the step's own error stays its error: a route that cannot be read is a warning
                run.warnings.append(f"step '{step.name}': {exc.failure.line()}")
            else:
                run.failure, run.status = exc.failure, ERROR
        self.context[step.name] = run.context()
        return []

    def run(self) -> PlaybookRun:
        try:
            return self._run()
        finally:
            self.fates.close()

    def _run(self) -> PlaybookRun:
        start = time.perf_counter()
        out = PlaybookRun(
            self.playbook.name,
            self.playbook.file,
            self.execution_id,
            self.playbook.shape,
            resumed=self.resume is not None,
        )
        reached = {self.playbook.start: "start"}
        failed_before: str | None = None
        for name in noetl.order(self.playbook):
            step = self.playbook.steps[name]
            if name not in reached or self.aborted:
                why = (
                    f"not run: {self.aborted}"
                    if self.aborted
                    else f"not run: step '{failed_before}' failed"
                    if failed_before
                    else "not reached: no route led to it"
                )
                out.steps.append(StepRun(name, SKIPPED, step.desc, reason=why))
                self.on_event("skipped", {"step": name, "reason": why})
                continue
            run = self.run_step(step)
            if self.aborted:  # no later step can run: its result is published, no route followed
                self.context[step.name] = run.context()
            else:
                for target in self._finish(step, run):
                    reached.setdefault(target, name)
            if self.context.get("step") is run.scope:  # its scope ends with it (unless a step named `step` published)
                del self.context["step"]
            if run.status == ERROR and failed_before is None:
                failed_before = name
            out.steps.append(run)
            self.on_event("done", {"step": name, "run": run})
        out.aborted = self.aborted
        out.vars = dict(self.vars)
        # what `set:` wrote into ctx (not the workload's own values: a --set DSN may hold a password)
        workload = self.context["workload"]
        out.ctx = {k: v for k, v in self.ctx.items() if k not in workload or workload[k] is not v}
        out.warnings = paste_warnings(self.playbook) + [w for s in out.steps for w in s.warnings]
        out.seconds = round(time.perf_counter() - start, 6)
        return out


def without_constraints(playbook: Playbook) -> list[str]:
    """`steps run --drop-constraints`: every ducklake step's PRIMARY KEY and UNIQUE constraints removed from its
    commands (DuckLake cannot enforce them), in place; one warning per table, naming the step."""
    warnings = []
    for step in playbook.steps.values():
        if step.tool != DUCKLAKE:
            continue
        for i, command in enumerate(step.commands):
            step.commands[i], dropped = sqltext.drop_constraints(command)
            warnings += [f"step '{step.name}': {w}" for w in dropped]
    return warnings


def run(
    playbook: Playbook,
    plane: WorkerPlane,
    home: Path,
    *,
    overrides: dict[str, Any] | None = None,
    on_event: Event = lambda _k, _d: None,
    resume: str | None = None,
) -> PlaybookRun:
    """Run a playbook read (and name-checked, with the same overrides) by `load` on `plane`, against the lake the
    plane's workers attach (its endpoints); `home`: the state folder (a step's local catalogs live there). `resume`:
    an earlier run's execution id, run again: what the lake says that run committed is not run again (see `once`)."""
    return Runner(playbook, plane, plane.endpoints, home, overrides=overrides, on_event=on_event, resume=resume).run()


def run_file(
    file: Path | Playbook,
    kit: Kit,
    *,
    scheduler: str | None = None,
    overrides: dict[str, Any] | None = None,
    on_event: Event = lambda _k, _d: None,
    resume: str | None = None,
) -> PlaybookRun:
    """`steps run FILE`: the playbook on the kit's worker plane (`scheduler`: the address of a plane already
    brought up; default, where the kit's settings say it is), against the kit's lake."""
    playbook = file if isinstance(file, Playbook) else load(file, overrides)
    if resume is not None and not re.fullmatch(r"[0-9a-f]{12}", resume):
        raise KitError(
            f"--resume {resume!r} is not a run's execution id",
            "give the 12 hex digits `steps run` printed as its run (execution_id in --json)",
        )
    address = scheduler or PlaneConfig.of(kit.state, kit.scheduler).address
    with WorkerPlane(address, kit.platform.endpoints()) as plane:
        return run(playbook, plane, kit.state.home, overrides=overrides, on_event=on_event, resume=resume)
