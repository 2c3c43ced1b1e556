"""A playbook run's results, in the seed's shape: per step `{status, result: {command_count, commands: [...]},
catalog_info}`, one entry per statement (a multi-statement `command` reports each), rows as {column: value},
real affected counts, durations and the snapshot each statement made. Loops report every iteration.

In templates a step's result is also reachable as the seed documents it: `result.data.command_2` is
`result.commands[2]`; and as NoETL's canonical v10 reads it: `{{ step.data }}` (a SQL step's rows as objects, a
python step's result, an HTTP body; a loop's, one per iteration) and `{{ step.status }}`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ducklake_kit.steps.kinds import KindResult
from ducklake_kit.steps.task import StatementRun, StepTask

OK, ERROR, SKIPPED = "ok", "error", "skipped"


@dataclass
class Failure:
    message: str
    command_index: int | None = None  # the entry of `result.commands` that failed
    sql: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"command_index": self.command_index, "sql": self.sql, "message": self.message}

    def line(self) -> str:
        where = f"command {self.command_index}: " if self.command_index is not None else ""
        return where + self.message


def command_entry(i: int, s: StatementRun) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "command_index": i,
        "command": s.command,
        "statement": s.statement,
        "sql": s.sql,
        "statement_type": s.statement_type,
        "status": "error" if s.error else "executed",
        "duration_ms": round(s.seconds * 1000, 3),
        "snapshot_id": s.snapshot_id,
    }
    if s.error:
        entry["error"] = s.error
    if s.columns:
        entry.update(columns=s.columns, rows=[dict(zip(s.columns, r)) for r in s.rows], row_count=len(s.rows))
    if s.affected_rows is not None:
        entry["affected_rows"] = s.affected_rows
    if s.retries:  # its commit failed and did not land, and it was tried again (steps/retries.py)
        entry["retries"] = s.retries
    return entry


class StepFailed(Exception):
    """A step (or iteration) failed before or outside its task: its template, catalog, loop, route or policy."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class Attempt:
    """One run of a step's commands on a worker: the step itself, or one iteration of its loop."""

    statements: list[StatementRun] = field(default_factory=list)
    worker: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    seconds: float = 0.0
    failure: Failure | None = None
    snapshot_id: int | None = None  # the transaction's snapshot (transaction: true)
    rolled_back: bool = False
    note: str | None = None  # how its fate was decided when its worker could not say (found in the lake by its token)
    data: Any = None  # NoETL's `data`: what later templates read as {{ step.data }}
    details: dict[str, Any] | None = None  # a kind's own detail (http: its status code and url); None for ducklake
    tries: list[str] = field(default_factory=list)  # the attempts a policy rule retried, each with why it failed

    @classmethod
    def of(cls, task: StepTask) -> Attempt:
        return cls().take(task)

    def take_kind(self, out: KindResult) -> Attempt:
        """Fill this attempt from a tool kind's result (postgres, duckdb, python, http, noop)."""
        self.statements, self.worker = out.statements, out.worker
        self.started_at, self.finished_at, self.seconds = out.started_at, out.finished_at, out.seconds
        self.data, self.details = out.data, out.details
        failed = next((i for i, s in enumerate(out.statements) if s.error), None)
        if out.error:
            self.failure = Failure(out.error, failed, out.statements[failed].sql if failed is not None else None)
        return self

    def take(self, task: StepTask) -> Attempt:
        """Fill this attempt from what its worker reported (an iteration keeps its index and element)."""
        self.statements, self.worker, self.started_at, self.finished_at = (
            task.statements,
            task.worker,
            task.started_at,
            task.finished_at,
        )
        self.seconds, self.snapshot_id, self.rolled_back = task.seconds, task.snapshot_id, task.rolled_back
        self.tries = [*self.tries, *task.retries]  # what its worker tried again (an ATTACH, a whole transaction)
        self.note = task.note or (
            f"an earlier attempt had already committed it (snapshot {task.snapshot_id}, found in "
            "the lake by its token): not committed again"
            if task.landed_before
            else None
        )
        failed = next((i for i, s in enumerate(task.statements) if s.error), None)
        if failed is not None:
            s = task.statements[failed]
            note = (
                " (the transaction was rolled back: nothing of this step committed)"
                if task.rolled_back and task.transaction
                else ""
            )
            self.failure = Failure(s.error + note, failed, s.sql)
        elif task.error:
            self.failure = Failure(task.error)
        return self

    @property
    def status(self) -> str:
        return ERROR if self.failure else OK

    def result(self) -> dict[str, Any]:
        out = {
            "command_count": len(self.statements),
            "commands": [command_entry(i, s) for i, s in enumerate(self.statements)],
        }
        if self.details is not None:
            out.update(data=self.data, details=self.details)
        if self.tries:
            out["retried"] = self.tries
        return out


@dataclass
class Iteration(Attempt):
    index: int = 0
    element: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "element": self.element,
            "status": self.status,
            "worker": self.worker,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "seconds": self.seconds,
            "snapshot_id": self.snapshot_id,
            "note": self.note,
            "result": self.result(),
            "error": self.failure.as_dict() if self.failure else None,
        }


@dataclass
class StepRun:
    step: str
    status: str  # ok, error, skipped
    desc: str = ""
    attempt: Attempt | None = None  # a step without a loop
    iterations: list[Iteration] | None = None  # a loop step
    catalog_info: dict[str, Any] | None = None
    failure: Failure | None = None  # the step's own error (a template, its catalog, a vars that failed)
    reason: str | None = None  # why it was skipped
    vars: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    iterations_seconds: float | None = None  # a loop: from its first iteration submitted to its last result read
    kind: str | None = None  # the tool's kind (None: a step that only routes)
    policy: list[str] = field(default_factory=list)  # what its policy rules did: "line 12: retry (attempt 2 of 3)"
    # NoETL's `step` scope: the step run's own state, written by `set: {step.x: ...}` and read as `{{ step.x }}` by
    # its tasks, retries and rules while it runs (the step's result fields under `step` are read-only)
    scope: dict[str, Any] = field(default_factory=dict)

    @property
    def data(self) -> Any:
        """NoETL's `{{ step.data }}`: the attempt's, or a loop's, one per iteration."""
        if self.iterations is not None:
            return [it.data for it in self.iterations]
        return self.attempt.data if self.attempt else None

    @property
    def error(self) -> Failure | None:
        if self.failure:
            return self.failure
        if self.attempt and self.attempt.failure:
            return self.attempt.failure
        failed = [it for it in self.iterations or [] if it.failure]
        if failed:
            first = failed[0]
            return Failure(
                f"{len(failed)} of {len(self.iterations or [])} iteration(s) failed; the first, iteration "
                f"{first.index}: {first.failure.line()}"
            )
        return None

    def result(self) -> dict[str, Any]:
        if self.iterations is not None:
            return {
                "iteration_count": len(self.iterations),
                "iterations_seconds": self.iterations_seconds,
                "failed": sum(1 for it in self.iterations if it.failure),
                "iterations": [it.as_dict() for it in self.iterations],
            }
        return self.attempt.result() if self.attempt else {"command_count": 0, "commands": []}

    def as_dict(self) -> dict[str, Any]:
        error = self.error
        out = {
            "step": self.step,
            "desc": self.desc,
            "status": self.status,
            "result": self.result(),
            "catalog_info": self.catalog_info or {},
            "error": error.as_dict() if error else None,
            "seconds": self.seconds,
            "vars": self.vars,
            "warnings": self.warnings,
        }
        if self.attempt is not None:
            out.update(worker=self.attempt.worker, snapshot_id=self.attempt.snapshot_id, note=self.attempt.note)
        if self.reason:
            out["reason"] = self.reason
        if self.kind is not None:
            out["kind"] = self.kind
        if self.policy:
            out["policy"] = self.policy
        if self.scope:
            out["scope"] = self.scope
        return out

    def context(self) -> dict[str, Any]:
        """What later templates see under the step's name (and this step's `vars:` as `result`)."""
        result = self.result()
        if "commands" in result:
            result["data"] = {f"command_{c['command_index']}": c for c in result["commands"]}
        error = self.error
        return {
            "status": self.status,
            "result": result,
            "data": self.data,
            "catalog_info": self.catalog_info or {},
            "error": error.as_dict() if error else None,
        }


@dataclass
class PlaybookRun:
    playbook: str
    file: str
    execution_id: str
    shape: str
    steps: list[StepRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    vars: dict[str, Any] = field(default_factory=dict)
    ctx: dict[str, Any] = field(default_factory=dict)  # what the playbook's `set:` wrote into NoETL's ctx
    resumed: bool = False  # --resume: the same execution id, what its earlier run committed not run again
    aborted: str | None = None  # why the run stopped before every step was decided (the worker plane was lost)

    @property
    def ok(self) -> bool:
        return self.aborted is None and all(s.status != ERROR for s in self.steps)

    @property
    def catalog_info(self) -> dict[str, Any]:
        """The last catalog state a step reported."""
        return next((s.catalog_info for s in reversed(self.steps) if s.catalog_info), {})

    def summary(self) -> dict[str, Any]:
        count = {k: sum(1 for s in self.steps if s.status == k) for k in (OK, ERROR, SKIPPED)}
        return {
            "playbook": self.playbook,
            "file": self.file,
            "execution_id": self.execution_id,
            "shape": self.shape,
            "resumed": self.resumed,
            "aborted": self.aborted,
            "status": OK if self.ok else ERROR,
            "steps_ok": count[OK],
            "steps_failed": count[ERROR],
            "steps_skipped": count[SKIPPED],
            "seconds": self.seconds,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "steps": [s.as_dict() for s in self.steps],
            "vars": self.vars,
            "ctx": self.ctx,
            "warnings": self.warnings,
        }
