"""The steps the runner drives itself, and the policies of every step: NoETL's tool kinds beside ducklake (`calls`),
their loops (one after another, or `mode: parallel` from threads), cursor loops, tool pipelines, sub-playbooks, and
a task's `spec.policy` (retries that never land a change twice, continue, fail, jump, break, set).

`Driven` is the runner's half for them: `runner.Runner` inherits it and provides the run's state (`plane`,
`context`, `ctx`, `jumps`, `broken`, `depth`, `env`, `resume`, `playbook`, `endpoints`, `home`) and the ducklake
path (`_prepare`, `_unit`, `_one`, `_collection`, `_iteration_ctx`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.steps import calls, catalogs, kinds, once, policy, sqltext, templates
from ducklake_kit.steps.checks import load
from ducklake_kit.steps.model import (
    ASYNC,
    BREAK,
    CONTINUE,
    DUCKLAKE,
    FAIL,
    HTTP,
    JUMP,
    NOOP,
    PLAYBOOK,
    POSTGRES,
    PYTHON,
    TASKS,
    Rule,
    Step,
)
from ducklake_kit.steps.results import Attempt, Failure, Iteration, StepFailed, StepRun

MAX_DEPTH = 5  # sub-playbooks in sub-playbooks: deeper than this is a playbook calling itself
MAX_CLAIMS = 100_000  # a cursor loop's claims: more is a claim that never marks its rows taken
MAX_HOPS = 10_000  # a tool pipeline's jumps (pagination): more is a rule that never stops jumping
# the kinds whose `mode: parallel` loops run their iterations at once (duckdb's file has one writer; ducklake's
# loops are submitted to the plane directly, see _run_loop)
CONCURRENT_KINDS = (PYTHON, HTTP, POSTGRES, NOOP)


class Driven:
    def _kind_attempt(self, step: Step, ctx: dict[str, Any]) -> Attempt:
        if self.resume is not None and step.tool not in (NOOP, PLAYBOOK):
            # only a ducklake commit carries a token the lake can be asked about: what a postgres, python, http or
            # duckdb step of the earlier run did cannot be known, so it is not run again behind the user's back
            return Attempt(
                failure=Failure(
                    f"not run again by --resume: whether run {self.resume} already ran this {step.tool} step cannot "
                    "be known (only ducklake commits carry a token); check what it does, then run the playbook afresh"
                )
            )
        try:
            out = self._sub_playbook(step, ctx) if step.tool == PLAYBOOK else calls.call(step, ctx, self.env)
            return Attempt().take_kind(out)
        except KitError as exc:
            return Attempt(failure=Failure(exc.what))

    def _sub_playbook(self, step: Step, ctx: dict[str, Any]) -> kinds.KindResult:
        """`tool: playbook`: the playbook `path` names, run to its end on the same plane with the step's `input`
        (or `payload`/`args`) as its workload, under an execution id of its own (in the step's details: `--resume`
        of this run does not run it again; resume it by its own id). Its data: its `return_step`'s, or its ctx."""
        if self.resume is not None:
            raise KitError(
                f"step '{step.name}' runs a sub-playbook, whose run has its own execution id: not run again by --resume",
                "resume the sub-playbook's run by the execution id its first run printed, or run it afresh",
            )
        if self.depth >= MAX_DEPTH:
            raise KitError(f"step '{step.name}': sub-playbooks nest deeper than {MAX_DEPTH}", "is one calling itself?")
        path = calls.playbook_file(step, ctx, Path(self.playbook.file).parent)
        given = {**templates.render_value(step.config.get("payload") or {}, ctx), **calls.inputs(step, ctx)}
        child = type(self)(load(path, given), self.plane, self.endpoints, self.home, overrides=given)
        child.depth = self.depth + 1
        done = child.run()
        back = str(step.config.get("return_step") or "")
        returned = next((s for s in done.steps if s.step == back), None)
        out = kinds.KindResult(data=returned.data if returned else done.ctx, worker="runner")
        out.details = {"playbook": str(path), "execution_id": done.execution_id, **done.summary()}
        if not done.ok:
            failed = next((s for s in done.steps if s.error), None)
            out.fail(
                f"sub-playbook {path} (run {done.execution_id}) failed"
                + (
                    f" at step '{failed.step}': {failed.error.line()}"
                    if failed and failed.error
                    else f": {done.aborted}"
                )
            )
        return out

    def _run_kind(self, step: Step, run: StepRun) -> None:
        if step.loop is None:
            run.attempt = self._policied(step, run, lambda _retry: self._kind_attempt(step, self.context), None)
            return
        collection = self._collection(step)
        assert step.loop is not None
        if step.loop.mode == ASYNC and step.tool in CONCURRENT_KINDS:
            self._run_concurrent(step, run, collection)
        else:
            self._run_sequential(step, run, collection, len(collection))

    def _iteration(self, step: Step, run: StepRun, index: int, element: Any, length: int | None) -> Iteration:
        """One iteration of a loop the runner drives, with its policy."""
        ctx = {**self._iteration_ctx(step, index, element, length), "iter": {}}
        kind: list[str] = []  # the ducklake iteration's once-kind, known once it is prepared

        def attempt(retry: bool) -> Attempt:
            return self._iteration_attempt(step, run, ctx, (index, element, retry), kind)

        done = self._policied(step, run, attempt, lambda: once.UNDECIDED_WHY if once.UNDECIDED in kind else None, ctx)
        it = Iteration(index=index, element=element)
        for name in Attempt.__dataclass_fields__:
            setattr(it, name, getattr(done, name))
        return it

    def _run_sequential(self, step: Step, run: StepRun, elements: Iterable[Any], length: int | None) -> None:
        """A loop's iterations one after another, in the runner (a loop of a kind other than ducklake in sequential
        mode, a duckdb one, or a cursor loop of any kind: its elements are claimed one by one)."""
        run.iterations = []
        started = time.perf_counter()
        try:
            for index, element in enumerate(elements):
                if step.name in self.broken:
                    run.policy.append(f"iterations from {index} not run: a `break` rule ended the loop")
                    break
                it = self._iteration(step, run, index, element, length)
                run.iterations.append(it)
                self.on_event("iteration", {"step": step.name, "iteration": it.as_dict(), "total": length or index + 1})
        finally:
            run.iterations_seconds = round(time.perf_counter() - started, 6)

    def _run_concurrent(self, step: Step, run: StepRun, collection: list[Any]) -> None:
        """`mode: parallel` for python, http and postgres: up to `max_in_flight` iterations at once (default: one per
        worker thread of the plane), each in a thread of the runner (a python one then runs on a worker); reported as
        they finish, listed in order. A `break` stops the iterations not started yet."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        assert step.loop is not None
        limit = step.loop.max_in_flight if isinstance(step.loop.max_in_flight, int) else None
        limit = max(1, limit or self.plane.threads())
        run.iterations, started, length = [], time.perf_counter(), len(collection)
        todo, running = list(enumerate(collection)), set()
        with ThreadPoolExecutor(max_workers=limit, thread_name_prefix=f"step-{step.name}") as pool:
            while todo or running:
                while todo and len(running) < limit and step.name not in self.broken:
                    index, element = todo.pop(0)
                    running.add(pool.submit(self._iteration, step, run, index, element, length))
                if step.name in self.broken and todo:
                    run.policy.append(f"{len(todo)} iteration(s) not run: a `break` rule ended the loop")
                    todo = []
                finished, running = wait(running, return_when=FIRST_COMPLETED) if running else (set(), set())
                for future in finished:
                    it = future.result()
                    run.iterations.append(it)
                    self.on_event("iteration", {"step": step.name, "iteration": it.as_dict(), "total": length})
        run.iterations.sort(key=lambda it: it.index)
        run.iterations_seconds = round(time.perf_counter() - started, 6)

    def _pipeline(self, step: Step, run: StepRun, ctx: dict[str, Any]) -> Attempt:
        """NoETL's tool pipeline: the step's tasks in order, each with its own policy, each later task reading the
        earlier ones' data by their names; a `jump` goes back (or on) to a task (pagination), a `break` ends it, a
        task that failed ends it and fails the step. The step's attempt is the last task's, its data the last data."""
        scope = {**ctx, "iter": ctx.get("iter", {})}
        names = [t.name for t in step.tasks]
        done: dict[str, str] = {}
        i, hops, out = 0, 0, Attempt()
        loop = ctx.get("loop") if step.loop else None  # in a loop: the iteration's index and element, for its token
        index, element = (loop["index"], loop["element"]) if loop else (None, None)
        while i < len(step.tasks):
            task = step.tasks[i]
            kind: list[str] = []
            # its commits' tokens name the step, the task and the iteration (two steps may have tasks of one name)
            qualified = replace(task, name=f"{step.name}.{task.name}")

            def attempt(retry: bool, t=qualified, k=kind) -> Attempt:
                return self._iteration_attempt(t, run, scope, (index, element, retry), k)

            out = self._policied(
                task, run, attempt, lambda k=kind: once.UNDECIDED_WHY if once.UNDECIDED in k else None, scope
            )
            scope[task.name], done[task.name] = out.data, out.status
            if out.failure:
                out.failure = replace(out.failure, message=f"task {task.name}: {out.failure.message}")
                break
            if task.name in self.broken:
                self.broken.discard(task.name)
                break
            target = self.jumps.pop(task.name, None)
            hops += target is not None
            if hops > MAX_HOPS:
                out.failure = Failure(f"task {task.name}: jumped more than {MAX_HOPS} times (does its rule ever stop?)")
                break
            i = names.index(target) if target is not None else i + 1
        out.details = {**(out.details or {}), "tasks": done}
        return out

    def _iteration_attempt(self, step: Step, run: StepRun, ctx: dict[str, Any], which: tuple, kind: list) -> Attempt:
        """One iteration's call: (index, element, whether it is a retry) in `which`."""
        if step.tool == TASKS:
            return self._pipeline(step, run, ctx)
        if step.tool != DUCKLAKE:
            return self._kind_attempt(step, ctx)
        index, element, retry = which
        try:
            prepared = self._prepare(step, ctx, run.warnings)
        except StepFailed as exc:
            return Attempt(failure=exc.failure)
        unit = self._unit(step, prepared, index, element)
        kind[:] = [unit.kind]
        label = f"step {step.name} iteration {index}"
        task = self._one(step, prepared, unit, with_info=False, label=label, retry=retry)
        out = Attempt.of(task)
        out.data = kinds.sql_data(task.statements, len(prepared[1]))
        return out

    def _cursor(self, step: Step) -> Iterator[Any]:
        """NoETL's cursor loop: the claim run on its PostgreSQL again and again, each row it returns one element,
        until it returns none (each claim marks its rows taken, as NoETL's `FOR UPDATE SKIP LOCKED` claims do)."""
        cursor = (step.loop.cursor if step.loop else None) or {}
        if cursor.get("kind") != POSTGRES:
            raise StepFailed(Failure(f"a cursor of kind '{cursor.get('kind')}' is not run by the kit: only postgres"))
        where = f"step '{step.name}' (its cursor)"
        auth = templates.render_text(str(cursor.get("auth") or ""), self.context).strip()
        pg = catalogs.postgres(where, auth or None, endpoints=self.endpoints, home=self.home)
        rendered = templates.render_sql(str(cursor.get("claim") or ""), self.context)
        refused = sqltext.pasted_values_refused(rendered)
        if refused:
            raise StepFailed(Failure(f"its cursor's claim: {refused}"))
        for _ in range(MAX_CLAIMS):
            got = kinds.run_postgres(pg, [rendered.text])
            if got.error:
                raise StepFailed(Failure(f"its cursor's claim failed: {got.error}", None, rendered.text.strip()))
            if not got.data:
                return
            yield from got.data
        raise StepFailed(Failure(f"its cursor gave rows for {MAX_CLAIMS} claims: does the claim mark them taken?"))

    def _collection(self, step: Step) -> list[Any]:
        loop = step.loop
        assert loop is not None
        try:
            collection = templates.render_value(loop.collection, self.context)
        except KitError as exc:
            raise StepFailed(Failure(f"its loop collection: {exc.what}")) from None
        if not isinstance(collection, (list, tuple)):
            raise StepFailed(
                Failure(f"its loop collection is {type(collection).__name__} {collection!r}, not a list", None, None)
            )
        return list(collection)

    def _iteration_ctx(self, step: Step, index: int, element: Any, length: int | None) -> dict[str, Any]:
        loop = step.loop
        assert loop is not None
        info = {"element": element, "index": index, "index1": index + 1, "length": length}
        return {**self.context, loop.iterator: element, "loop": info}

    def _policied(
        self, step: Step, run: StepRun, attempt, unsafe: str | Callable[[], str | None] | None, ctx=None
    ) -> Attempt:
        """One call of the step's tool (`attempt(retry)`), then its policy: retried while a `retry` rule holds and
        attempts remain (never when `unsafe` says a retry could land a change twice), then the other rules' effects."""
        ctx = ctx if ctx is not None else self.context
        tries: list[str] = []
        n = 1
        while True:
            out = attempt(n > 1)
            if step.policy is None:
                return out
            rule_ctx = self._rule_ctx(step, out, ctx)
            rules = policy.matching(step.policy, rule_ctx)
            retry = policy.retry_rule(rules)
            if retry is None:
                break
            if n >= policy.attempts_of(retry):
                run.policy.append(f"line {retry.line}: retry: {n} attempt(s) of {policy.attempts_of(retry)} made")
                break
            why_not = unsafe() if callable(unsafe) else unsafe
            if why_not is not None:
                run.policy.append(f"line {retry.line}: not retried: {why_not}")
                break
            wait = policy.delay_s(retry, n)
            why = out.failure.line() if out.failure else "its rule held"
            tries.append(f"attempt {n}: {why}")
            run.policy.append(f"line {retry.line}: retry {n + 1} of {policy.attempts_of(retry)} in {wait:g}s ({why})")
            self._sets(run, out, rules, rule_ctx)  # this attempt's `set:` is written before the next one reads it
            time.sleep(wait)
            n += 1
        out.tries = tries + out.tries  # the policy's attempts, then what the worker itself tried again
        self._effects(step, run, out, rules, rule_ctx)
        return out

    def _iteration_policy(self, step: Step, run: StepRun, it: Iteration, collection: list[Any]) -> None:
        """A ducklake loop's iteration, done: its policy's effects (its iterations run at once on the workers, so a
        `retry` is not waited for here: a failed commit is retried on its worker, see `task`)."""
        if step.policy is None:
            return
        scope: dict[str, Any] = {}
        ctx = {**self._iteration_ctx(step, it.index, it.element, len(collection)), "iter": scope}
        rule_ctx = self._rule_ctx(step, it, ctx)
        rules = policy.matching(step.policy, rule_ctx)
        retry = policy.retry_rule(rules)
        if retry is not None and it.failure:
            run.policy.append(f"line {retry.line}: iteration {it.index} not retried: a ducklake loop's are not")
        self._effects(step, run, it, rules, rule_ctx)

    def _rule_ctx(self, step: Step, out: Attempt, ctx: dict[str, Any]) -> dict[str, Any]:
        mine = {
            "status": out.status,
            "data": out.data,
            "result": out.result(),
            "error": out.failure.as_dict() if out.failure else None,
        }
        error = out.failure.line() if out.failure else None
        return {
            **ctx,
            step.name: mine,
            # NoETL's step scope (what `set: step.x` wrote in this step run) beside the outcome, which wins
            "step": {**(ctx.get("step") or {}), **mine},
            "output": policy.output(out.failure is None, out.data, error, out.details),
        }

    def _effects(self, step: Step, run: StepRun, out: Attempt, rules: list[Rule], ctx: dict[str, Any]) -> None:
        """What the held rules say beside a retry: `set`, and `continue` past an error (only a rule whose `when`
        held says so: an `else` does not hide a failure), `fail`, `jump`, `break`."""
        for rule in self._sets(run, out, rules, ctx):
            if rule.do == CONTINUE and out.failure:
                run.policy.append(f"line {rule.line}: continued past its error: {out.failure.line()}")
                out.failure = None
            elif rule.do == FAIL:
                out.failure = out.failure or Failure(f"its policy rule at line {rule.line} said fail")
            elif rule.do == JUMP and rule.to:
                self.jumps[step.name] = rule.to
            elif rule.do == BREAK:
                self.broken.add(step.name)

    def _sets(self, run: StepRun, out: Attempt, rules: list[Rule], ctx: dict[str, Any]) -> list[Rule]:
        """The held rules' `set:` written (into ctx, the iteration's `iter`, the step run's `step`), for every attempt
        (a retry rule's `set: {step.tries: ...}` counts each one); an `else` rule's is not when the task failed.
        Returns the rules applied."""
        scopes = {"ctx": self.ctx, "iter": ctx.get("iter", self.ctx), "step": run.scope}
        applied = []
        for rule in rules:
            if out.failure and rule.when is None:
                run.policy.append(f"line {rule.line}: `else` rule not applied: the task failed")
                continue
            policy.apply_set(rule.set, ctx, scopes)
            applied.append(rule)
        return applied
