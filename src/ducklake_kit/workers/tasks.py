"""A task of the worker plane: a list of SQL texts run on one worker's pooled lake connection, and its typed result.

`run_statements` is what a worker executes (the client submits it, see `client.WorkerPlane`). It never raises for
a failed statement: the result says which statement failed (its index and text, with DuckDB's own error) and
keeps the results of the statements before it, so the caller sees what did run.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from distributed import get_worker

from ducklake_kit import faults
from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake, StatementFailed, StatementResult
from ducklake_kit.lake.transactions import CommitTag, commit, snapshot_of_token
from ducklake_kit.workers.plugin import LakeLost, LakePlugin, plugin_on


@dataclass
class StatementOutcome:
    """One statement's result on a worker."""

    index: int
    statement: str
    statement_type: str
    columns: list[str]
    rows: list[tuple]
    affected_rows: int | None  # real counts for INSERT/UPDATE/DELETE; None where it has no meaning
    seconds: float
    snapshot_id: int | None  # the snapshot this statement committed, when it did

    @classmethod
    def of(cls, index: int, r: StatementResult) -> StatementOutcome:
        return cls(
            index, r.statement, r.statement_type, r.columns, r.rows, r.affected_rows, r.seconds or 0.0, r.snapshot_id
        )


@dataclass
class TaskError:
    """Why a task failed: a statement (its 0-based index and text, DuckDB's error), or the worker itself
    (`index` None: it died, or its lake is not attached)."""

    error: str
    index: int | None = None
    statement: str | None = None

    def line(self) -> str:
        where = f"statement {self.index + 1} failed: " if self.index is not None else ""
        return where + self.error


@dataclass
class TaskResult:
    worker: str  # the worker's name (w1, ...)
    address: str
    statements: list[StatementOutcome] = field(default_factory=list)
    error: TaskError | None = None
    seconds: float = 0.0
    message: str | None = None  # the commit message, when the task ran as one transaction
    snapshot_id: int | None = None  # the snapshot the task's transaction made (message=...), or the last one committed
    rolled_back: bool = False  # a transaction that was rolled back: what ran in it before the failure was undone
    started_at: float | None = None  # when the task started and finished on its worker (seconds since the epoch)
    finished_at: float | None = None
    timed_out: bool = False  # interrupted on its worker after `timeout_s`
    lost: bool = False  # its worker died while it held the task: whether it committed is for the lake to say

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rows(self) -> list[tuple]:
        """The rows of the last statement that returned rows."""
        with_rows = [s for s in self.statements if s.columns]
        return with_rows[-1].rows if with_rows else []

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for s in out["statements"]:
            s["rows"] = [list(r) for r in s["rows"]]
        out["ok"] = self.ok
        return out


def _outcomes(results: list[StatementResult], offset: int = 0) -> list[StatementOutcome]:
    return [StatementOutcome.of(offset + i, r) for i, r in enumerate(results)]


ALREADY_RAN = (
    "this task had already started once, on a worker that is gone with its result; it was not run "
    "again, because its statements may have committed: check the lake before re-running it"
)


def claim_once(token: str) -> bool:
    """True the first time a task with this token starts, False ever after. Dask runs a task again when the worker
    that held its RESULT is lost (allowed-failures only covers running tasks), and a user's cluster may send a
    running task elsewhere when it retires a worker; the claim, an atomic non-blocking lock at the scheduler that
    is never released, makes that second run refuse."""
    from distributed import Lock

    return bool(Lock(f"ducklake-kit-task-{token}").acquire(blocking=False))


def task_lake(plugin: str, token: str | None) -> tuple[LakePlugin | None, str | None]:
    """How every task of the plane starts on its worker: claim its token, find the worker's lake, count the task.
    (the plugin, None), or (None, why the task must not run)."""
    worker = get_worker()
    if token is not None and not claim_once(token):
        return None, ALREADY_RAN
    lake_plugin = plugin_on(worker, plugin)
    if lake_plugin is None or lake_plugin.lake is None:
        why = lake_plugin.error if lake_plugin else "the lake plugin is not installed"
        return None, f"worker {worker.name} has no lake attached ({why})"
    lake_plugin.count_task()
    return lake_plugin, None


def run_statements(
    plugin: str,
    texts: list[str],
    tag: CommitTag | None = None,
    token: str | None = None,
    timeout_s: float | None = None,
) -> TaskResult:
    """Run on a worker: each text (one or more statements) in order on the worker's pooled connection.

    Without `tag` every statement autocommits (a write is its own snapshot, reported per statement). With `tag`
    all of them run in ONE transaction with its commit message: one snapshot, or nothing; the commit carries the
    tag's token and extra in its commit_extra_info (the caller's token says later, from the lake alone, whether
    this transaction landed: see lake.transactions.snapshot_of_token). `token`: the submission's own, so that a
    second run of the same task refuses (`claim_once`). `timeout_s`: the running statement is interrupted after
    that long (DuckDB's own interrupt: it fails, and its transaction rolls back)."""
    message = tag.message if tag is not None else None
    worker = get_worker()
    start = time.perf_counter()
    result = TaskResult(str(worker.name), worker.address, message=message, started_at=time.time())
    lake_plugin, refused = task_lake(plugin, token)
    if lake_plugin is None:
        result.error = TaskError(refused or "")
        result.finished_at = time.time()
        return result
    lake: Lake = lake_plugin.lake
    deadline = None
    try:
        with lake_plugin.exclusive():  # one task at a time on the shared connection, whatever the worker's threads
            deadline = Deadline(lake, timeout_s)
            try:
                if lake_plugin.default_db != lake.alias:  # settled: the lake, or a catalog a step chose
                    lake.con.execute(f"USE {lake.alias}")
                lake_plugin.default_db = None  # the user's SQL below may USE anything (settled after the task)
                if message is not None:
                    _run_transaction(lake, texts, message, result, deadline, tag.token, tag.extra)
                else:
                    # each autocommit write's commit says which task and worker made it (its own token beside)
                    lake.autocommit_tag = {"run": "task", "task": token or uuid.uuid4().hex, "worker": result.worker}
                    try:
                        _run_autocommit(lake, texts, result, deadline)
                    finally:
                        lake.autocommit_tag = None
            finally:
                deadline.stop()  # before the lock goes: no interrupt can reach the next task
    except LakeLost as exc:
        result.error = TaskError(exc.what)
    if deadline is not None and deadline.interrupted and result.error is not None:
        result.timed_out = True
        result.error.error = f"interrupted after the task's timeout of {timeout_s:g}s ({result.error.error})"
    result.seconds = round(time.perf_counter() - start, 6)
    result.finished_at = time.time()
    return result


class Deadline:
    """A task's timeout: DuckDB's interrupt for the statement running when it expires, and only while the task's
    own statements run (`armed`): never during a COMMIT, never after the task (the next one on this connection)."""

    def __init__(self, lake: Lake, timeout_s: float | None):
        self.lake, self.lock = lake, threading.Lock()
        self.armed = self.expired = self.interrupted = False
        self.timer = threading.Timer(timeout_s, self._expire) if timeout_s else None
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()

    def _expire(self) -> None:
        with self.lock:
            self.expired = True
            if self.armed:
                self.interrupted = True
                self.lake.con.interrupt()

    def arm(self) -> None:
        with self.lock:
            if self.expired:  # it ran out between two statements: an interrupt now would reach nothing
                self.interrupted = True
                raise TimeoutError("the timeout expired before this statement started")
            self.armed = True

    def disarm(self) -> None:
        with self.lock:
            self.armed = False

    def stop(self) -> None:
        self.disarm()
        if self.timer is not None:
            self.timer.cancel()


def _run_autocommit(lake: Lake, texts: list[str], result: TaskResult, deadline: Deadline) -> None:
    task = lake.autocommit_tag or {}
    for number, text in enumerate(texts, 1):
        offset = len(result.statements)
        lake.autocommit_tag = {**task, "text": number}  # beside each statement's own number in its text
        try:
            deadline.arm()
            try:
                result.statements.extend(_outcomes(lake.run(text, track_snapshots=True), offset))
            finally:
                deadline.disarm()
        except StatementFailed as exc:
            result.statements.extend(_outcomes(exc.results, offset))
            result.error = TaskError(exc.error, offset + exc.index, exc.statement)
            break
        except Exception as exc:  # noqa: BLE001 - text that does not parse, a lost connection: still a result
            result.error = TaskError(getattr(exc, "what", None) or first_line(exc), offset, text.strip())
            break
    if end_open_transaction(lake):
        # a BEGIN without COMMIT: what ran after it never committed, and must not leak into the next task
        result.rolled_back = True
        if result.error is None:
            result.error = TaskError(
                "the task left a transaction open (BEGIN without COMMIT or ROLLBACK); it was "
                "rolled back, so nothing after the BEGIN committed"
            )
    committed = [s.snapshot_id for s in result.statements if s.snapshot_id is not None]
    result.snapshot_id = committed[-1] if committed else None


def _run_transaction(
    lake: Lake,
    texts: list[str],
    message: str,
    result: TaskResult,
    deadline: Deadline,
    token: str | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    done: list[StatementResult] = []
    token = token or uuid.uuid4().hex
    try:
        deadline.arm()
        # the COMMIT is never interrupted
        made = commit(lake, texts, message, before_commit=deadline.disarm, token=token, extra=extra)
        done = made.results
        result.snapshot_id = made.snapshot_id
        _fault_after_commit()
    except (StatementFailed, TimeoutError) as exc:
        if isinstance(exc, StatementFailed):
            done = exc.results
            result.error = TaskError(exc.error, exc.index, exc.statement)
        else:
            result.error = TaskError(str(exc))
        result.rolled_back = True
    except Exception as exc:  # noqa: BLE001 - the commit message or the COMMIT itself failed
        # a COMMIT that failed may still have reached the catalog: its token in the lake says whether it did
        why = getattr(exc, "what", None) or first_line(exc)
        try:
            landed = snapshot_of_token(lake, token)
        except Exception:  # noqa: BLE001 - the catalog cannot say either: the fate stays unknown
            result.error = TaskError(
                f"the transaction's commit failed, so it may or may not have committed ({why}): "
                "check the lake before re-running it"
            )
        else:
            if landed is not None:
                result.snapshot_id = landed  # it did land: a success, whatever the error on the way back said
            else:
                result.error = TaskError(
                    f"the transaction's commit failed and did not land ({why}): nothing of it committed"
                )
                result.rolled_back = True
    finally:
        deadline.disarm()
    result.statements = _outcomes(done)


def _fault_after_commit() -> None:
    """Test hook (DUCKLAKE_FAULT=pause-after-commit=SECONDS, in the worker's environment): the window in which the
    transaction has landed but its result has not reached the client, where a test kills the worker. The pause ends
    early once the file DUCKLAKE_FAULT_RESUME_FILE names exists (the test has made its kill)."""
    fault = os.environ.get("DUCKLAKE_FAULT", "")
    if fault.startswith("pause-after-commit="):
        faults.pause(float(fault.split("=", 1)[1]))


def end_open_transaction(lake: Lake) -> bool:
    """Roll back a transaction the task opened (BEGIN) and did not end, so the worker's next task does not run
    inside it. True when there was one."""
    return lake.rollback()  # the lake's own, so that it knows no transaction is open (its commit gate asks)
