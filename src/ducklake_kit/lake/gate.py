"""The commit gate: a PostgreSQL advisory lock in the catalog database that a process holds around each DuckLake
commit it makes, so that the kit's writers queue for the catalog instead of racing for the next snapshot id.

Why: DuckLake commits optimistically. Two writers that commit at once both try to write snapshot N+1; the loser
rolls back, waits, checks for conflicts and tries again, and under sustained contention one writer keeps winning
while the others' waits grow (16 writers x 1,000 one-row inserts: median 6 ms, slowest 113 s; see
lake/connection.py RETRY_SETTINGS). pg_lake_ducklake serialises its commits with an advisory lock; so does this.

How: one small psycopg connection per process and catalog (`CommitGate.of`), autocommit, on which
`pg_advisory_lock(GATE_KEY)` is taken just before the DuckLake COMMIT and `pg_advisory_unlock` right after it,
in a `finally`: a COMMIT that raises gives the gate back too. The lock is a session lock, so a process that dies
holding it (SIGKILL included) ends its session and PostgreSQL releases it; nobody waits on a dead writer. A
session's advisory locks are re-entrant, so threads of one process sharing the connection would not exclude each
other: they queue on a process-local lock first. Reads never take the gate.

Choice: `DUCKLAKE_COMMIT_GATE=advisory` (the default) or `optimistic` (DuckLake's own retries only, as before), or
`Lake(..., commit_gate=...)`. Writers that do not use the kit (a user's DuckDB CLI, a Spark job) commit
optimistically and still correctly: the gate orders the kit's commits among themselves, DuckLake's conflict
check still guards everything.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import psycopg

from ducklake_kit.errors import KitError
from ducklake_kit.lake.locks import holder_of, lock_key
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.base import PgEndpoint

GATE_ENV = "DUCKLAKE_COMMIT_GATE"
ADVISORY, OPTIMISTIC = "advisory", "optimistic"
GATE_MODES = (ADVISORY, OPTIMISTIC)
GATE_KEY = lock_key("dlk-gate")  # its own key: the loads' commit lock is "dlk-load"
# A holder that keeps the gate this long is stuck (stopped, not dead: a dead one's session ends), and every writer
# would wait on it: a commit that cannot have the gate in time fails before it starts, so nothing was committed.
GATE_WAIT_S = 120


def gate_mode(mode: str | None = None) -> str:
    """`mode`, else $DUCKLAKE_COMMIT_GATE, else `advisory`; KitError for anything else."""
    value = (mode or os.environ.get(GATE_ENV) or ADVISORY).strip().lower()
    if value not in GATE_MODES:
        raise KitError(f"{GATE_ENV}={value} is not a commit gate mode", f"use {ADVISORY} (the default) or {OPTIMISTIC}")
    return value


class CommitGate:
    """The gate of one catalog database, for this process (`of`)."""

    _gates: ClassVar[dict[tuple, CommitGate]] = {}
    _gates_lock = threading.Lock()

    def __init__(self, pg: PgEndpoint):
        self.pg = pg
        self._conn: psycopg.Connection | None = None
        # re-entrant: a thread that holds the gate and commits again (another Lake of the same catalog) must not
        # deadlock on itself; PostgreSQL counts the session's advisory locks the same way
        self._local = threading.RLock()
        self.commits = 0  # commits made through the gate by this process (tests and benchmarks read it)

    @classmethod
    def of(cls, pg: PgEndpoint) -> CommitGate:
        """This process's gate for the catalog `pg` (one connection however many Lakes the process opens); keyed by
        pid too, so a forked child never shares its parent's session, and by password, so a new server on the same
        address (a reset and `up`, a test's new stack on a port another one had) is not asked with the old one."""
        key = (pg.host, pg.port, pg.dbname, pg.user, pg.password, os.getpid())
        with cls._gates_lock:
            gate = cls._gates.get(key)
            if gate is None:
                gate = cls._gates[key] = cls(pg)
            return gate

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = postgres.connect(self.pg, timeout=10)
            # who holds the gate, for the one who finds it held too long (holder_of reads it)
            conn.execute(
                "SELECT set_config('application_name', %s, false)", [f"ducklake-kit commit gate pid {os.getpid()}"]
            )
            conn.execute(f"SET lock_timeout = '{GATE_WAIT_S}s'")
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        """Close the session: whatever it held, PostgreSQL releases."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def _lock(self) -> None:
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.execute("SELECT pg_advisory_lock(%s)", [GATE_KEY])
                return
            except psycopg.errors.LockNotAvailable:
                who = None
                try:
                    with postgres.connect(self.pg, timeout=10) as probe:
                        who = holder_of(probe, GATE_KEY)
                except KitError:
                    pass
                raise KitError(
                    f"the lake's commit gate was held by {who or 'another session'} for {GATE_WAIT_S} s; "
                    "this transaction was not committed",
                    f"find that writer (is it stopped?), or set {GATE_ENV}={OPTIMISTIC} to commit without the gate",
                ) from None
            except psycopg.OperationalError:
                self._drop()  # the catalog restarted since the last commit: one new session, then give up
                if attempt == 2:
                    raise

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the gate for the block (a COMMIT); given back when it ends, raised or not."""
        with self._local:
            self._lock()
            try:
                yield
                self.commits += 1
            finally:
                try:
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", [GATE_KEY])  # type: ignore[union-attr]
                except psycopg.Error:
                    self._drop()  # the session ends, and the lock with it

    def close(self) -> None:
        with self._local:
            self._drop()
