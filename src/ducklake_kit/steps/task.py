"""What a worker runs for a step (or one loop iteration): the step's commands on the worker's pooled connection,
against the step's catalog, with its settings, then the catalog's state (`catalog_info`).

The connection is the worker's own, made once when it joined (no connect, LOAD, ATTACH or DETACH per task). A
catalog other than the kit's `lake` is ATTACHed the first time a step names it and kept for the next steps; the
kit's own catalog under another name (`catalog_name: analytics`) is the same catalog attached again under that
alias. `memory_limit` and `threads` apply to the step only: the worker's settings are put back after it.

A write whose DuckLake commit failed is tried again only when its token is not in the lake (steps/retries.py): each
autocommit write statement is its own transaction carrying a token, a `transaction: true` step's is the step's, and
the ATTACH of a fresh catalog that two workers raced to create is tried again too. Each retry is recorded with its
reason (`StatementRun.retries`, `StepTask.retries`).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import duckdb
from distributed import get_worker

from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake, StatementFailed, attach_statement
from ducklake_kit.lake.connection import WRITE_KINDS, bound_params
from ducklake_kit.lake.sql import quote_ident, quote_literal
from ducklake_kit.lake.transactions import commit_with, snapshot_of_token
from ducklake_kit.platforms.base import PgEndpoint
from ducklake_kit.steps import retries as retrying
from ducklake_kit.steps.retries import WriteFailed, attach_retrying, write_once
from ducklake_kit.workers.plugin import LakeLost, LakePlugin
from ducklake_kit.workers.tasks import _fault_after_commit, end_open_transaction, task_lake


@dataclass(frozen=True)
class Target:
    """The catalog a step runs against, resolved: the kit's own (`pg` None) or another PostgreSQL catalog."""

    alias: str
    pg: PgEndpoint | None = field(default=None, repr=False)  # its password never reaches a repr, a log or a result
    data_path: str | None = None
    create: bool = True
    use: bool = True

    @property
    def kit(self) -> bool:
        return self.pg is None

    def key(self) -> str:
        """Changes when the same alias must be attached to something else."""
        return hashlib.sha256(repr((self.alias, self.pg, self.data_path, self.create)).encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.pg is None:
            return f"the kit's catalog as {self.alias}"
        return f"postgresql://{self.pg.user}@{self.pg.host}:{self.pg.port}/{self.pg.dbname} as {self.alias}"


@dataclass
class StatementRun:
    """One statement of a step, as it ran on the worker."""

    command: int  # which item of the step's `command`/`commands`
    statement: int  # its place within that command
    sql: str
    statement_type: str | None
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    affected_rows: int | None = None  # real counts for INSERT/UPDATE/DELETE
    seconds: float = 0.0
    snapshot_id: int | None = None  # the snapshot it committed (autocommit), or the step's transaction's
    error: str | None = None
    retries: list[str] = field(default_factory=list)  # why each earlier try failed (its commit did not land)


@dataclass
class StepTask:
    worker: str
    address: str
    statements: list[StatementRun] = field(default_factory=list)
    error: str | None = None  # a failure outside the statements: the catalog's ATTACH, a setting, the worker
    rolled_back: bool = False
    transaction: bool = False  # the step ran as one transaction (transaction: true)
    snapshot_id: int | None = None  # the snapshot the step's transaction made (transaction: true)
    landed_before: bool = (
        False  # its token was already in the lake (an earlier attempt committed it): not committed again
    )
    note: str | None = None  # how the runner decided a task whose fate its worker could not report (never the worker)
    retries: list[str] = field(default_factory=list)  # what was tried again outside the statements (the ATTACH)
    catalog_info: dict[str, Any] | None = None
    last_snapshot: int | None = None  # the instance's last committed snapshot for the step's catalog, at its end
    started_at: float = 0.0
    finished_at: float = 0.0
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None or any(s.error for s in self.statements)


@dataclass(frozen=True)
class StepOptions:
    """How a step task runs its commands. `message`: every command in ONE transaction with that commit message,
    carrying `commit_token` and `extra` in its commit_extra_info (the runner finds it in the lake by the token when
    the task's fate is unknown). `recheck`: before the COMMIT, look the token up: an attempt that is already in the
    lake is not committed again. `keep_going`: a failed statement does not stop the later ones (on_error: continue).
    `settings`: DuckDB settings for this step only. `with_info`: add the catalog's state after it."""

    message: str | None = None
    keep_going: bool = False
    settings: dict[str, Any] | None = None
    with_info: bool = True
    commit_token: str | None = None
    extra: dict[str, Any] | None = None
    recheck: bool = False


def run_step(
    plugin: str,
    target: Target,
    commands: list[str],
    params: dict[str, Any],
    how: StepOptions = StepOptions(),
    *,
    token: str | None = None,
) -> StepTask:
    """Run on a worker (submitted with `WorkerPlane.submit_call`, which passes `plugin` and the task's `token`):
    `commands` against `target` with `params`, as `how` says."""
    worker = get_worker()
    # the worker's name in the commit too: which worker made a step's snapshot is in the lake's own record
    extra = {**how.extra, "worker": str(worker.name)} if how.extra is not None else None
    gate = _Gate(how.commit_token, extra, how.recheck)
    start = time.perf_counter()
    out = StepTask(str(worker.name), worker.address, started_at=time.time())
    lake_plugin, refused = task_lake(plugin, token)
    if lake_plugin is None:
        out.error = refused
    else:
        try:
            with lake_plugin.exclusive():  # settled first: LakeLost when the lake cannot be attached again
                _run_held(lake_plugin, target, commands, params, how, out, gate)
        except LakeLost as exc:
            out.error = exc.what
    out.finished_at = time.time()
    out.seconds = round(time.perf_counter() - start, 6)
    return out


@dataclass
class _Gate:
    """What a step's transaction carries: its token and extra info, and whether to look the token up first."""

    token: str | None = None
    extra: dict[str, Any] | None = None
    recheck: bool = False


class _AlreadyLanded(Exception):
    def __init__(self, snapshot: int):
        super().__init__(f"already committed as snapshot {snapshot}")
        self.snapshot = snapshot


def _run_held(
    lake_plugin: LakePlugin,
    target: Target,
    commands: list[str],
    params: dict[str, Any],
    how: StepOptions,
    out: StepTask,
    gate: _Gate,
) -> None:
    """The step on the worker's connection, held by this task."""
    lake: Lake = lake_plugin.lake
    try:
        view = _attached(lake_plugin, target, out.retries)
        restore = _apply_settings(lake.con, how.settings or {})
        try:
            _use(lake_plugin, target.alias if target.use else lake.alias)
            if how.message is not None:
                _transaction(view, commands, params, how.message, out, gate)
            else:
                _autocommit(view, commands, params, how.keep_going, out, _known_snapshot(lake_plugin, target.alias))
                lake_plugin.snapshots[target.alias] = (lake_plugin.turn, out.last_snapshot)
            if any(s.statement_type in ("SET", "ATTACH", "DETACH") for s in out.statements):
                lake_plugin.default_db = None  # the step's own SQL may have changed it (USE is a SET)
            if any(s.statement_type in ("ATTACH", "DETACH") for s in out.statements):
                lake_plugin.catalogs.clear()  # ... and what is attached: check again before the next use
                lake_plugin.snapshots.clear()
            if how.with_info:
                out.catalog_info = catalog_info(view)
        finally:
            restore()
    except Exception as exc:  # noqa: BLE001 - reported as the step's error, never raised to Dask
        lake_plugin.default_db = None
        out.error = getattr(exc, "what", None) or first_line(exc)


def _use(plugin: LakePlugin, database: str) -> None:
    """`USE database`, unless the connection's default is known to be it already (LakePlugin.settle says what it is
    before every task)."""
    if plugin.default_db != database:
        plugin.lake.con.execute(f"USE {quote_ident(database)}")
        plugin.default_db = database


def _known_snapshot(plugin: LakePlugin, alias: str) -> tuple[bool, int | None]:
    """(True, the instance's last committed snapshot for `alias`) when the previous task of this worker was a step
    that read it at its end: no commit can have happened since, as tasks hold the connection one at a time and
    each holding is counted (LakePlugin.exclusive). (False, None) otherwise."""
    seen = plugin.snapshots.get(alias)
    if seen is not None and seen[0] == plugin.turn - 1:
        return True, seen[1]
    return False, None


def _attached(plugin: LakePlugin, target: Target, retries: list[str]) -> Lake:
    """The worker's connection aimed at the step's catalog, attaching it the first time (`retries`: why an ATTACH
    was tried again)."""
    lake: Lake = plugin.lake
    if target.kit and target.alias == lake.alias:
        return lake
    key = target.key()
    con = lake.con
    if plugin.catalogs.get(target.alias) != key:
        # the alias may be attached to something else (another step's catalog, or the user's own ATTACH): detach it
        # first, never while it is the default database (DuckDB refuses that)
        _use(plugin, lake.alias)
        attached = con.execute(
            "SELECT count(*) FROM duckdb_databases() WHERE database_name = ?", [target.alias]
        ).fetchone()[0]
        if attached:
            con.execute(f"DETACH {quote_ident(target.alias)}")
        plugin.catalogs.pop(target.alias, None)
        plugin.snapshots.pop(target.alias, None)  # another catalog's snapshot ids mean nothing here
        if target.kit:
            con.execute(attach_statement(plugin.endpoints, target.alias))
        else:
            pg, secret = target.pg, f"step_catalog_{key}"
            con.execute(
                f"CREATE OR REPLACE SECRET {secret} (TYPE postgres, HOST {quote_literal(pg.host)}, PORT {pg.port}, "
                f"DATABASE {quote_literal(pg.dbname)}, USER {quote_literal(pg.user)}, "
                f"PASSWORD {quote_literal(pg.password)})"
            )
            attach = (
                f"ATTACH {quote_literal('ducklake:postgres:dbname=' + pg.dbname)} AS {quote_ident(target.alias)} "
                f"(DATA_PATH {quote_literal(target.data_path)}, METADATA_PARAMETERS MAP {{'SECRET': '{secret}'}}, "
                f"CREATE_IF_NOT_EXISTS {'true' if target.create else 'false'})"
            )
            if target.create:
                attach_retrying(con, attach, pg.dbname, retries)
            else:
                con.execute(attach)
        plugin.catalogs[target.alias] = key
    return lake.on(target.alias)


def _apply_settings(con: duckdb.DuckDBPyConnection, settings: dict[str, Any]):
    """SET each setting for the step; returns what puts the worker's own values back."""
    old = {name: con.execute("SELECT current_setting(?)", [name]).fetchone()[0] for name in settings}
    for name, value in settings.items():
        con.execute(f"SET {name} = {int(value) if isinstance(value, int) else quote_literal(value)}")

    def restore() -> None:
        for name, value in old.items():
            con.execute(f"SET {name} = {int(value) if isinstance(value, int) else quote_literal(value)}")

    return restore


def _parsed(view: Lake, commands: list[str]) -> list[tuple[int, int, Any]]:
    return [(c, s, stmt) for c, text in enumerate(commands) for s, stmt in enumerate(view.statements(text))]


def _autocommit(
    view: Lake,
    commands: list[str],
    params: dict[str, Any],
    keep_going: bool,
    out: StepTask,
    known: tuple[bool, int | None] = (False, None),
) -> None:
    last = known[1] if known[0] else view.last_committed_snapshot()
    worker = out.worker
    for c, text in enumerate(commands):
        try:
            statements = view.statements(text)
        except Exception as exc:  # noqa: BLE001 - a command that does not parse is that command's error
            out.statements.append(
                StatementRun(c, 0, text.strip(), None, error=getattr(exc, "what", None) or first_line(exc))
            )
            if keep_going:
                continue
            break
        stopped = False
        for s, stmt in enumerate(statements):
            tried: list[str] = []
            landed = None
            try:
                bound = bound_params(stmt, params, s, len(statements), [])
                if stmt.type.name in WRITE_KINDS and not view.in_transaction:
                    # its own transaction, whose commit carries a token: tried again when it did not land
                    written = write_once(view, stmt, bound, {"worker": worker, "statement": [c, s]})
                    r, tried, landed = written.result, written.retries, written.landed
                else:
                    r = view.execute(stmt, bound)
            except (duckdb.Error, StatementFailed, WriteFailed) as exc:
                why = exc.error if isinstance(exc, (StatementFailed, WriteFailed)) else first_line(exc)
                tried = exc.retries if isinstance(exc, WriteFailed) else tried
                out.statements.append(StatementRun(c, s, stmt.query.strip(), stmt.type.name, error=why, retries=tried))
                if not keep_going:
                    stopped = True
                    break
                continue
            run = StatementRun(
                c, s, r.statement, r.statement_type, r.columns, r.rows, r.affected_rows, r.seconds or 0.0
            )
            run.retries = tried
            now = view.last_committed_snapshot()
            if landed is not None:  # its COMMIT reported a failure, but its token is in the lake
                run.snapshot_id, last = landed, now
            elif now != last:
                run.snapshot_id, last = now, now
            out.statements.append(run)
        if stopped:
            break
    out.last_snapshot = last
    if end_open_transaction(view):  # a BEGIN without COMMIT must not leak into the worker's next task
        out.rolled_back = True
        out.error = out.error or "the step left a transaction open (BEGIN without COMMIT); it was rolled back"


def _transaction(
    view: Lake, commands: list[str], params: dict[str, Any], message: str, out: StepTask, gate: _Gate
) -> None:
    out.transaction = True
    done: list[StatementRun] = []
    token = gate.token or uuid.uuid4().hex  # the same for every try: whichever landed, the lake finds it

    def work(_con) -> None:
        for c, s, stmt in _parsed(view, commands):
            try:
                r = view.execute(stmt, bound_params(stmt, params, s, 0, []))
            except duckdb.Error as exc:
                done.append(StatementRun(c, s, stmt.query.strip(), stmt.type.name, error=first_line(exc)))
                raise
            except StatementFailed as exc:
                done.append(StatementRun(c, s, stmt.query.strip(), stmt.type.name, error=exc.error))
                raise
            done.append(
                StatementRun(c, s, r.statement, r.statement_type, r.columns, r.rows, r.affected_rows, r.seconds or 0.0)
            )

    def before_commit(fault) -> None:
        fault()
        # a re-run (--resume) of an attempt whose worker may have finished it after its plane was lost: the token in
        # the lake says it landed, so this one rolls back instead of committing the same change twice
        landed = snapshot_of_token(view, token) if gate.recheck else None
        if landed is not None:
            raise _AlreadyLanded(landed)

    for attempt in range(1, retrying.ATTEMPTS + 1):
        done, started = [], time.time()
        try:
            with retrying.fault_at_commit(view) as fault:  # test hook: a competing commit fails it (else no-op)
                made = commit_with(
                    view, work, message, token=token, extra=gate.extra, before_commit=lambda: before_commit(fault)
                )
            out.snapshot_id = made.snapshot_id
            for run in done:  # every statement that wrote is part of the one snapshot the transaction made
                run.snapshot_id = made.snapshot_id if run.statement_type != "SELECT" else None
            _fault_after_commit()  # test hook: the window between a landed commit and its result reaching the runner
        except _AlreadyLanded as exc:
            out.snapshot_id, out.landed_before, done = exc.snapshot, True, []
        except (duckdb.Error, StatementFailed) as exc:
            out.rolled_back = True
            if not any(r.error for r in done):  # the COMMIT itself failed: it may have reached the catalog
                landed = _failed_commit(view, token, first_line(exc), out)
                sql = "; ".join(r.sql for r in done)
                if landed is False and not retrying.token_decides(view, sql):
                    out.error = (
                        f"the step's commit failed ({first_line(exc)}) and it names a table outside catalog "
                        f"{view.alias}, where its token is not, so the lake cannot say whether it landed: check "
                        "before running it again"
                    )
                elif landed is False:  # the lake says it committed nothing: the whole transaction may run again
                    why = f"{retrying.conflict(view, sql, started) or 'its commit failed'}"
                    why += f" ({first_line(exc)}); it did not land (its token is not in the lake)"
                    if attempt < retrying.ATTEMPTS and not retrying.DISABLED:
                        out.retries.append(f"try {attempt}: {why}, so the transaction ran again")
                        out.rolled_back = False
                        retrying.pause(attempt)
                        continue
                    out.error = f"the step's commit failed: {why} after {attempt} tries: nothing of it committed"
                for run in done if not out.rolled_back else []:
                    run.snapshot_id = out.snapshot_id if run.statement_type != "SELECT" else None
        except Exception as exc:  # noqa: BLE001 - a command that does not parse: nothing ran
            out.rolled_back = True
            out.error = getattr(exc, "what", None) or first_line(exc)
        break
    out.statements = done


def _failed_commit(view: Lake, token: str, why: str, out: StepTask) -> bool | None:
    """A COMMIT that raised may still have reached the catalog: the token in the lake says whether it did. True: it
    landed (a success, whatever the error on the way back said); False: it did not, nothing of it committed; None:
    the lake could not be asked (the fate stays unknown, and `out.error` says so)."""
    try:
        landed = snapshot_of_token(view, token)
    except Exception:  # noqa: BLE001 - the catalog cannot say either: the fate stays unknown, and is said so
        out.error = (
            f"the step's commit failed, so it may or may not have committed ({why}): check the lake before "
            "running it again"
        )
        return None
    if landed is None:
        return False
    out.snapshot_id, out.rolled_back = landed, False
    return True


def catalog_info(view: Lake) -> dict[str, Any]:
    """The catalog's state, read on the step's own connection: its latest snapshot (every column, by its real
    name), how many snapshots it has, and its tables."""
    con, alias = view.con, view.alias
    rel = con.execute(f"SELECT * FROM ducklake_snapshots({quote_literal(alias)}) ORDER BY snapshot_id DESC LIMIT 1")
    columns = [d[0] for d in rel.description]
    row = rel.fetchone()
    count = con.execute(f"SELECT count(*) FROM ducklake_snapshots({quote_literal(alias)})").fetchone()[0]
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY 1, 2", [alias]
    ).fetchall()
    return {
        "catalog_name": alias,
        "snapshot_count": int(count),
        "latest_snapshot": dict(zip(columns, row)) if row else None,
        "table_count": len(tables),
        "tables": [f"{s}.{t}" for s, t in tables],
    }
