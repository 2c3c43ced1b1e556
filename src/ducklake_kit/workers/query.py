"""A query as the console asks it: SQL run as one task on a worker of the plane, and only a slice of its answer sent
back (Sord's slider: the worker runs the whole query, streaming; the first `rows` rows cross to the client, with the
full row count, the columns' types, the snapshot the answer was read at, the worker and the time).

Every statement but the last runs as `sql` runs it on a worker (the commit gate, real affected counts, a transaction
left open rolled back); a last statement that is a SELECT is read in one read-only transaction, so that the snapshot
reported is the one the rows came from.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake.connection import Lake, StatementResult

DEFAULT_ROWS = 100
MOST_ROWS = 10_000  # the most rows one answer sends back, whatever is asked
BATCH_ROWS = 8_192  # rows per Arrow batch while the worker counts the rest
CANCELLED = "cancelled"

# On each worker process: the queries running now (id -> the connection running them) and the ids cancelled lately
# (a query cancelled while it waited for its worker refuses to start). `cancel` reaches them through Dask's client.run.
_running: dict[str, Lake] = {}
_cancelled: deque[str] = deque(maxlen=1000)
_lock = threading.Lock()


@dataclass
class QueryAnswer:
    """What a query answered: the kept slice of its rows and everything about it."""

    worker: str = ""
    columns: list[str] = field(default_factory=list)
    types: list[str] = field(default_factory=list)  # DuckDB's type of each column (BIGINT, VARCHAR, DATE, ...)
    rows: list[tuple] = field(default_factory=list)  # the first `rows_asked` rows only
    total_rows: int | None = None  # every row the last statement returned (None: it returned no rows)
    statement_type: str = ""  # of the last statement (SELECT, INSERT, CREATE, ...)
    message: str = ""  # what a statement without rows did ("INSERT: 3 rows affected", "CREATE: ok")
    snapshot_id: int | None = None  # the snapshot the rows were read at, else the last one a statement committed
    seconds: float = 0.0  # on the worker, all statements
    error: str | None = None  # one line: DuckDB's own text (with the failing statement's number when not the first)

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["rows"] = [list(r) for r in self.rows]
        out["ok"] = self.ok
        return out


def clamp_rows(rows: int) -> int:
    return max(0, min(int(rows), MOST_ROWS))


def _message(r: StatementResult) -> str:
    if r.affected_rows is not None:
        return f"{r.statement_type}: {r.affected_rows} rows affected"
    return f"{r.statement_type}: ok"


def _read_slice(lake: Lake, stmt, rows: int, answer: QueryAnswer) -> None:
    """Run a SELECT in a read-only transaction of its own: the snapshot it read, its columns and types, its first
    `rows` rows and the count of all of them (the rest streamed in Arrow batches on the worker, never kept)."""
    lake.con.execute("BEGIN TRANSACTION")
    try:
        answer.snapshot_id = lake.current_snapshot()
        res = lake.con.execute(stmt)
        answer.columns = [d[0] for d in res.description]
        answer.types = [str(d[1]) for d in res.description]
        total = 0
        for batch in res.to_arrow_reader(BATCH_ROWS):
            if total < rows:
                wanted = batch.slice(0, rows - total).to_pylist()
                answer.rows.extend(tuple(r[c] for c in batch.schema.names) for r in wanted)
            total += batch.num_rows
        answer.total_rows = total
    finally:
        lake.con.execute("ROLLBACK")  # nothing to keep: it only read


def answer_on(lake: Lake, text: str, rows: int = DEFAULT_ROWS) -> QueryAnswer:
    """Run `text` on this connection (a worker's, or any Lake) and keep `rows` rows of the last statement's answer.
    Never raises for a failing statement: its DuckDB error is the answer's `error`."""
    import duckdb

    answer = QueryAnswer()
    rows = clamp_rows(rows)
    start = time.perf_counter()
    try:
        statements = lake.statements(text)
    except KitError as exc:
        answer.error = exc.what
        return answer
    if not statements:
        answer.error = "no SQL statement given"
        return answer
    before = lake.last_committed_snapshot()
    for index, stmt in enumerate(statements):
        where = f"statement {index + 1} failed: " if len(statements) > 1 else ""
        last = index == len(statements) - 1
        answer.statement_type = stmt.type.name
        try:
            if last and stmt.type.name == "SELECT" and not lake.in_transaction:
                _read_slice(lake, stmt, rows, answer)
            else:
                result = lake.execute(stmt)
                if last and result.columns:
                    answer.columns, answer.total_rows = result.columns, len(result.rows)
                    answer.types = [_type_of(result.rows, i) for i in range(len(result.columns))]
                    answer.rows = result.rows[:rows]
                elif last:
                    answer.message = _message(result)
        except duckdb.Error as exc:
            answer.error = where + first_line(exc)
            break
    if lake.in_transaction:  # a BEGIN without COMMIT: nothing after it may leak into the worker's next task
        lake.rollback()
        answer.error = answer.error or (
            "the query left a transaction open (BEGIN without COMMIT or ROLLBACK); it was rolled back"
        )
    if answer.snapshot_id is None:
        after = lake.last_committed_snapshot()
        answer.snapshot_id = after if after != before else lake.current_snapshot()
    answer.seconds = round(time.perf_counter() - start, 6)
    return answer


def _type_of(rows: list[tuple], i: int) -> str:
    """A column's type for rows that came without DuckDB's description (SHOW, DESCRIBE, PRAGMA): from its values."""
    values = [r[i] for r in rows if r[i] is not None]
    if values and all(isinstance(v, bool) for v in values):
        return "BOOLEAN"
    if values and all(isinstance(v, int) for v in values):
        return "BIGINT"
    if values and all(isinstance(v, (int, float)) for v in values):
        return "DOUBLE"
    return "VARCHAR"


def run_query(plugin: str, text: str, rows: int, query_id: str | None = None, token: str | None = None) -> QueryAnswer:
    """Run on a worker (submitted by `ask`): `answer_on` on the worker's pooled lake connection, one task at a time;
    `cancel(query_id)` interrupts it (DuckDB's own interrupt: the running statement fails and the later ones do not
    run; statements before it that autocommitted stay committed)."""
    from distributed import get_worker

    from ducklake_kit.workers.plugin import LakeLost
    from ducklake_kit.workers.tasks import task_lake

    worker = get_worker()
    lake_plugin, refused = task_lake(plugin, token)
    if lake_plugin is None:
        return QueryAnswer(worker=str(worker.name), error=refused)
    try:
        with lake_plugin.exclusive() as lake:
            if lake_plugin.default_db != lake.alias:
                lake.con.execute(f"USE {lake.alias}")
            lake_plugin.default_db = None  # the user's SQL may USE anything (settled after the task)
            with _lock:
                refused = query_id is not None and query_id in _cancelled
                if query_id is not None and not refused:
                    _running[query_id] = lake
            try:
                answer = QueryAnswer(error=f"{CANCELLED} before it started") if refused else answer_on(lake, text, rows)
            finally:
                with _lock:  # before the connection goes to the next task: no interrupt can reach that one
                    _running.pop(query_id, None)
                    interrupted = query_id in _cancelled
            if interrupted and answer.error and not refused:
                answer.error = f"{CANCELLED} ({answer.error})"
    except LakeLost as exc:
        answer = QueryAnswer(error=exc.what)
    answer.worker = str(worker.name)
    return answer


def _interrupt(query_id: str) -> bool:
    """Run on every worker by `cancel`: remember the id, and interrupt the statement running for it here, if any."""
    with _lock:
        _cancelled.append(query_id)
        lake = _running.get(query_id)
        if lake is not None:
            lake.con.interrupt()
    return lake is not None


def cancel(plane, query_id: str) -> bool:
    """Cancel the query `ask` runs under `query_id`: interrupted where it runs, refused where it has yet to start.
    True when a worker was running it."""
    return any(v is True for v in plane.client.run(_interrupt, query_id, on_error="return").values())


def ask(
    plane, text: str, *, worker: str | None = None, rows: int = DEFAULT_ROWS, query_id: str | None = None
) -> QueryAnswer:
    """Run `text` as one task on the plane (`plane`: a workers.client.WorkerPlane): on `worker` (a name) or any free
    worker; `query_id`: a name `cancel` can stop it by. A worker that died while it ran the task is the answer's
    error."""
    future = plane.submit_call(run_query, text, clamp_rows(rows), query_id, worker=worker)
    got = plane.result(future)
    if isinstance(got, QueryAnswer):
        return got
    return QueryAnswer(worker=got.worker, error=got.error.line() if got.error else "the task returned no answer")
