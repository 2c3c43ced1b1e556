"""What runs inside each worker process: the plugin that attaches the lake once, when the worker joins, and keeps
that connection for every task (pooled: no per-task connect, LOAD, ATTACH or DETACH).

The same DuckDB connection also has an in-memory database attached as `local`: worker-local tables
(`CREATE TABLE local.zones AS ...`), visible to every task on this worker and to no other worker, gone when the
worker stops. Unqualified names are the lake's (`USE lake`).

Every task finds the connection as the kit made it (`LakePlugin.settle`, before and after each task): the lake and
`local` attached (again, when a task detached them), no other database a task attached, and the lake as the
default database. `workers` reports the lake as attached only when the connection really has it.

The plugin is registered at the scheduler by the client (`client.ensure_plugin`), so every worker that joins
later, a replacement included, gets it too. It travels pickled over the scheduler's connection with the lake's
endpoints (credentials included): never on a command line or in a log.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from distributed import WorkerPlugin, get_worker

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake, attach_statement, secret_statements
from ducklake_kit.lake.sql import quote_ident, quote_literal
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.workers.config import LOCAL_DB

# One DuckDB thread per worker: the plane's parallelism is its workers (one Dask thread each), and a commit with a
# second DuckDB thread costs twice the CPU (see lake.SMALL_WRITER_SETTINGS).
WORKER_SETTINGS: dict[str, Any] = {"threads": 1}


# DuckDB's own databases (always there) and the worker-local one: with the lake, and the catalogs steps attached
# (LakePlugin.catalogs), the only databases a worker's connection keeps between tasks
KEPT_DATABASES = {LOCAL_DB, "memory", "system", "temp"}


class LakeLost(KitError):
    """The lake was detached from a worker's connection and could not be attached again."""


def plugin_name(endpoints: Endpoints) -> str:
    """One plugin per lake: a name from the endpoints (credentials included, so new credentials re-attach)."""
    digest = hashlib.sha256(repr(endpoints).encode()).hexdigest()[:12]
    return f"ducklake-kit-lake-{digest}"


@dataclass
class WorkerState:
    """What a worker reports about its lake connection (`client.run(worker_state, ...)`)."""

    name: str
    pid: int
    attached: bool
    error: str | None
    tasks_run: int
    started: float  # time.time() when the plugin attached
    local_tables: list[str] = field(default_factory=list)
    memory_mib: float | None = None  # the worker process's resident memory


class LakePlugin(WorkerPlugin):
    """Attaches the lake when the worker joins; `lake` is the pooled connection every task of the worker uses."""

    def __init__(self, endpoints: Endpoints, settings: dict[str, Any] | None = None):
        self.endpoints = endpoints
        self.settings = {**WORKER_SETTINGS, **(settings or {})}
        self.name = plugin_name(endpoints)
        self.lake: Lake | None = None
        self.error: str | None = None
        self.tasks_run = 0
        self.started = 0.0
        self.catalogs: dict[str, str] = {}  # catalogs tasks attached beside the lake (alias -> what), kept for the next
        # What the step runner knows of the connection between its tasks, so that it skips a `USE` or a
        # last_committed_snapshot() it already knows the answer to (each costs a catalog transaction, ~2 ms here):
        # the default database (None: unknown, after a task that ran a user's SQL), and per catalog alias the
        # instance's last committed snapshot as of the end of task number `tasks_run`.
        self.default_db: str | None = None
        self.snapshots: dict[str, tuple[int, int | None]] = {}
        self.turn = 0  # tasks that held the connection so far (see `exclusive`)
        self.worker_name = "?"
        self._inspect = None  # a second cursor, for listing from the worker's event loop while a task runs
        self._lock = threading.Lock()
        # tasks share one DuckDB connection: a worker with several threads (a user's cluster) runs them one by one
        self.task_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # only the configuration travels; the connection is made on the worker
        return {"endpoints": self.endpoints, "settings": self.settings, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["endpoints"], state["settings"])

    def setup(self, worker) -> None:
        # never raises: a worker whose lake failed to attach stays up and says why (tasks and `workers` report it)
        try:
            lake = Lake(self.endpoints, settings=self.settings)
            lake.con.execute(f"ATTACH ':memory:' AS {LOCAL_DB}")
            # SQL can say which worker runs it: getvariable('worker_name') (the seed's current_setting('worker_id'))
            lake.con.execute(f"SET VARIABLE worker_name = {quote_literal(str(worker.name))}")
            lake.con.execute(f"USE {lake.alias}")
            self.default_db = lake.alias
            self.worker_name = str(worker.name)
            self._inspect = lake.con.cursor()
            self.lake, self.started = lake, time.time()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            self.error = exc.what if isinstance(exc, KitError) else first_line(exc)

    def teardown(self, worker) -> None:
        if self.lake is not None:
            self.lake.close()
            self.lake = None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[Lake]:
        """The pooled connection for one task: tasks hold it one at a time (a user's worker may run several threads),
        and each holding is counted in `turn`, so a task can tell whether another one ran since a given turn. It is
        settled before the task (LakeLost when the lake cannot be attached again) and after it."""
        with self.task_lock:
            self.turn += 1
            if self.lake is not None:
                self.settle()
            try:
                yield self.lake
            finally:
                try:
                    self.settle()
                except Exception:  # noqa: BLE001 - the next task settles again, and reports what still fails
                    pass

    def databases(self, con=None) -> dict[str, str]:
        """Each database attached to the worker's DuckDB instance (attachments are the instance's, shared by its
        cursors), with its type (`ducklake`, `duckdb`)."""
        # qualified with system.main: an unqualified name is looked up in the default database first, which for the
        # lake is a catalog transaction (~2 ms here); these read only the instance's own state (~0.1 ms)
        rows = (
            (con or self.lake.con).execute("SELECT database_name, type FROM system.main.duckdb_databases()").fetchall()
        )
        return dict(rows)

    def lake_attached(self) -> bool:
        """Whether the lake's database is attached now (asked of the connection, not remembered)."""
        if self.lake is None or self._inspect is None:
            return False
        return self.databases(self._inspect).get(self.lake.alias) == "ducklake"

    def settle(self) -> None:
        """Put the pooled connection back as the kit made it, for the next task (whoever's it is): a task that ran
        `USE memory; DETACH lake` left every later task without the lake, one that ran `ATTACH ... AS evil` left
        `evil` to them all. Costs two queries of the instance's own state (~0.2 ms) when nothing changed."""
        lake, con = self.lake, self.lake.con
        attached = self.databases()
        current, schema = con.execute("SELECT system.main.current_database(), system.main.current_schema()").fetchone()
        if LOCAL_DB not in attached:
            con.execute(f"ATTACH ':memory:' AS {LOCAL_DB}")  # its tables went with it
        if attached.get(lake.alias) != "ducklake":
            if lake.alias in attached:  # the name now holds something else: it goes, never while it is the default
                con.execute(f"USE {LOCAL_DB}")
                current = LOCAL_DB
                con.execute(f"DETACH {quote_ident(lake.alias)}")
            try:
                for stmt in [*secret_statements(self.endpoints), attach_statement(self.endpoints, lake.alias)]:
                    con.execute(stmt)  # the secrets again too: a task may have dropped them
            except Exception as exc:  # noqa: BLE001 - said in one line by the task that needed the lake
                raise LakeLost(
                    f"worker {self.worker_name} lost the lake (a task detached it) and could not attach it "
                    f"again ({first_line(exc)})",
                    "run `workers`; `down` and `up` restart the workers",
                ) from None
            self.snapshots.pop(lake.alias, None)
        # the default stays only when a step of the kit chose one of its catalogs and no SQL has changed it since
        kept = current == lake.alias or (current == self.default_db and current in self.catalogs)
        if not kept or schema != "main":
            con.execute(f"USE {quote_ident(lake.alias)}")
            current = lake.alias
        self.default_db = current
        for name in set(attached) - KEPT_DATABASES - {lake.alias} - set(self.catalogs):
            con.execute(f"DETACH {quote_ident(name)}")
        for alias in set(self.catalogs) - set(attached):  # a step's catalog a task detached: attached again when used
            del self.catalogs[alias]
            self.snapshots.pop(alias, None)

    def count_task(self) -> None:
        with self._lock:
            self.tasks_run += 1

    def local_tables(self) -> list[str]:
        if self._inspect is None:
            return []
        rows = self._inspect.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = ? ORDER BY ALL", [LOCAL_DB]
        ).fetchall()
        return [f"{LOCAL_DB}.{t}" if s == "main" else f"{LOCAL_DB}.{s}.{t}" for s, t in rows]


def plugin_on(worker, name: str) -> LakePlugin | None:
    plugin = worker.plugins.get(name)
    return plugin if isinstance(plugin, LakePlugin) else None


def worker_state(name: str, dask_worker=None) -> WorkerState:
    """Run on a worker (`client.run`, in its event loop): its lake connection's state and worker-local tables."""
    worker = dask_worker or get_worker()
    plugin = plugin_on(worker, name)
    if plugin is None:
        return WorkerState(str(worker.name), os.getpid(), False, None, 0, 0.0)  # not installed yet (it is being set up)
    tables: list[str] = []
    error, attached = plugin.error, False
    try:
        attached = plugin.lake_attached()
        if plugin.lake is not None and not attached:
            error = "a task detached the lake's database; the worker attaches it again before its next task"
        tables = plugin.local_tables()
    except Exception as exc:  # noqa: BLE001 - listing must not break `workers`
        error = error or f"could not read the worker's databases ({first_line(exc)})"
    return WorkerState(
        str(worker.name),
        os.getpid(),
        attached,
        error,
        plugin.tasks_run,
        plugin.started,
        tables,
        round(psutil.Process().memory_info().rss / 2**20, 1),
    )
