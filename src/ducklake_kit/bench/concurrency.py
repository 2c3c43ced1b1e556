"""`bench --suite concurrency`: the seed's benchmark, made honest.

N worker PROCESSES (spawn) each do M one-row INSERTs, starting together at a barrier, so the figures are the
concurrent part only (process start, imports and ATTACH happen before the barrier):

(a) `file`: one DuckDB database file, opened and closed around every INSERT, as the seed's tool had to. DuckDB
    lets one process hold a database file for writing, so an open that meets another process's lock fails
    ("Conflicting lock is held"). Like the seed, nothing is retried: the error is counted and the row is lost.
(b) `ducklake`: DuckLake with the PostgreSQL catalog, one connection (`Lake`) per worker, reused for every
    INSERT, into one table created before the workers start (concurrent CREATE TABLE of the same table
    conflicts). A commit that loses the race for the next snapshot is retried by DuckLake itself
    (`RETRY_SETTINGS`); one that exhausts those retries is run again by the writer (`execute_retrying`, counted
    as `reruns`: nothing had been committed). DuckLake does not report its retries to the client, so they are
    counted on the server:
    every failed commit attempt is a rolled-back catalog transaction (`pg_stat_database.xact_rollback` of
    the catalog database, before vs after; exact when nothing else uses the catalog meanwhile).

    The workers use `SMALL_WRITER_SETTINGS` (one DuckDB thread: see lake/connection.py) on top of RETRY_SETTINGS.
    `ducklake` commits through the kit's commit gate (lake/gate.py: a PostgreSQL advisory lock, so commits queue
    instead of racing); `ducklake-optimistic` without it, on DuckLake's own retries alone (as before the gate).
(c) `workers`: the same inserts as tasks of the worker plane (Dask): one task per writer doing all its M inserts
    on the worker's pooled connection (so Dask's per-task cost is not inside the per-insert times), pinned one
    writer per worker w1..wN, released together by a Dask Event once every task has started. Workers the plane
    lacks are started for the run and stopped after it; `workers-optimistic` again on the same workers, without
    the commit gate (for those tasks only). Its `retries` may under-count: the workers' catalog
    connections stay open, and PostgreSQL publishes a live connection's counters only every few seconds.

Per mode: total wall time of the concurrent part, inserts/s, median, p95, p99 and max latency of the successful operations,
errors (by kind), retries, and rows: expected (writers x ops), actual (counted in the table afterwards), lost
(expected - actual), and `silently_lost` (rows whose INSERT reported success but are not there: must be 0).
DuckLake also: the CPU an insert cost the writers (`client_cpu_ms_per_insert`) and the kit's PostgreSQL
(`catalog_cpu_ms_per_insert`, local platform only).

Before the concurrent run, one writer alone (`single_writer`) measures what an insert costs without contention;
`floor` turns that into lower bounds for the concurrent run on this machine (writers share `cores` cores), and
`goals.reachable_here` says whether the time goals are reachable here at all, so a goal that is not met is
reported with the reason measured beside it.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import queue as queue_mod
import shutil
import statistics
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import duckdb

from ducklake_kit.bench.results import BENCH_SCHEMA, NOT_WRITTEN, Machine, Outputs, load_average, write_outputs
from ducklake_kit.errors import KitError
from ducklake_kit.lake import RETRY_SETTINGS, SMALL_WRITER_SETTINGS, Lake, execute_retrying
from ducklake_kit.lake.gate import ADVISORY, OPTIMISTIC
from ducklake_kit.lake.profile import catalog_statements
from ducklake_kit.platforms import postgres, procs
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.state import State

MODES = ("file", "ducklake", "ducklake-optimistic", "workers", "workers-optimistic")
TABLE = "concurrency"  # lake.bench.concurrency: recreated by every run, before the workers start
GOALS = {"total_s": 1.0, "median_ms": 5.0, "errors": 0, "rows_lost": 0}  # DuckLake, 3 writers x 100 inserts
# Under contention (issue 29, set at 16 writers x 1,000 inserts), for every DuckLake mode: no writer starves (p99 and
# the slowest insert), at least the optimistic mode's throughput measured before the gate (16,000 inserts in 140 s),
# every row once.
CONTENTION_GOALS = {"p99_ms": 50.0, "max_ms": 1000.0, "ops_per_s": 114.0, "rows_lost": 0, "duplicate_rows": 0}


def commit_gate_of(mode: str) -> str:
    """The commit gate a DuckLake mode runs with: `<target>-optimistic` without it, the others through it."""
    return OPTIMISTIC if mode.endswith("-optimistic") else ADVISORY


CALIBRATE_OPS = 100  # one writer alone, before the concurrent run: the CPU an insert costs (see `floor`)
BARRIER_TIMEOUT_S = 300  # 16 writers each loading DuckDB and its extensions on 2 cores take a while
_INSERT = "INSERT INTO {table} VALUES (?, ?, now())"


@dataclass
class SingleWriter:
    """One writer alone, before the concurrent run: what an insert costs without contention."""

    ops_per_writer: int
    median_ms: float
    p95_ms: float
    min_ms: float
    client_cpu_ms_per_insert: float
    catalog_cpu_ms_per_insert: float | None  # None when the catalog is not the kit's own process (k3d, external)


@dataclass
class WriterFigures:
    """One mode's figures: time, latency, errors, and the rows counted in the table afterwards."""

    mode: str
    writers: int
    ops_per_writer: int
    total_s: float
    ops_per_s: float | None
    median_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    succeeded: int
    errors: int
    errors_by_kind: dict[str, int]
    expected_rows: int
    actual_rows: int
    rows_lost: int  # expected - actual
    silently_lost: int  # INSERTs that reported success but whose row is missing: must be 0
    duplicate_rows: int
    slowest_ops: list[dict[str, Any]]
    retries: int = 0
    retries_note: str = ""
    p99_ms: float | None = None
    # DuckLake only (the file mode has none of these)
    commit_gate: str | None = None  # advisory (the kit's default) or optimistic (see lake/gate.py)
    contention_goals_met: dict[str, bool] | None = None
    reruns: int | None = None
    reruns_note: str | None = None
    catalog_commits: int | None = None
    snapshots: int | None = None
    client_cpu_ms_per_insert: float | None = None
    catalog_cpu_ms_per_insert: float | None = None
    data_inlining: bool | None = None
    insert_profile: dict[str, Any] | None = None
    synchronous_commit: str | None = None
    retry_settings: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    catalog_settings: dict[str, Any] | None = None
    single_writer: SingleWriter | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.mode == "file":
            for name in _DUCKLAKE_ONLY:
                out.pop(name)
        return out


_DUCKLAKE_ONLY = [
    f.name
    for f in fields(WriterFigures)
    if f.name
    not in {
        "mode",
        "writers",
        "ops_per_writer",
        "total_s",
        "ops_per_s",
        "median_ms",
        "p95_ms",
        "max_ms",
        "succeeded",
        "errors",
        "errors_by_kind",
        "expected_rows",
        "actual_rows",
        "rows_lost",
        "silently_lost",
        "duplicate_rows",
        "slowest_ops",
        "retries",
        "retries_note",
        "p99_ms",
    }
]


@dataclass
class Floor:
    """Lower bounds for the concurrent run on this machine, from one writer measured alone (see `floor`)."""

    cpu_ms_per_insert: float
    catalog_cpu_counted: bool
    total_s_at_least: float
    median_ms_at_least: float
    ops_per_s_at_most: float = 0.0  # cores / CPU per insert
    mean_ms_at_least: float = 0.0  # Little's law: N writers in a closed loop wait N / throughput
    # through the commit gate commits go one at a time, each holding it about as long as the fastest lone insert
    gated_ops_per_s_at_most: float = 0.0
    gated_mean_ms_at_least: float = 0.0
    note: str = (
        "lower bounds from one writer measured alone: its CPU per insert (total) and its median latency; "
        "the mean latency of N writers in a closed loop is N / throughput (Little's law)"
    )


@dataclass
class Goals:
    """The goals for DuckLake at 3 writers x 100 inserts: which the run met, and which this machine can reach."""

    met: dict[str, bool]
    reachable_here: dict[str, bool] | None = None
    contention_met: dict[str, dict[str, bool]] = field(default_factory=dict)  # per DuckLake mode
    contention_reachable_here: dict[str, bool] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**GOALS, "applies_to": "ducklake, 3 writers x 100 inserts", "met": self.met}
        if self.reachable_here is not None:
            out["reachable_here"] = self.reachable_here
        out["contention"] = {
            **CONTENTION_GOALS,
            "applies_to": "every DuckLake mode, set at 16 writers x 1,000 inserts",
            "met": self.contention_met,
        }
        if self.contention_reachable_here is not None:
            out["contention"]["reachable_here"] = self.contention_reachable_here
        return out


@dataclass
class ConcurrencyRun:
    writers: int
    ops_per_writer: int
    machine: Machine
    results: dict[str, WriterFigures] = field(default_factory=dict)
    floor: Floor | None = None
    goals: Goals | None = None
    vs_floor: dict[str, float] = field(default_factory=dict)  # each lake mode's total over the floor's (goal: <= 1.5)

    @property
    def ducklake(self) -> WriterFigures | None:
        return self.results.get("ducklake")

    def lake_defect(self) -> str | None:
        """The suite's correctness claim (not its speed goals): every DuckLake insert, direct or from the worker
        plane, that reported success is in the table, exactly once. What broke it, or None."""
        for mode, d in self.results.items():
            if mode == "file":
                continue
            label = ("DuckLake" if mode.startswith("ducklake") else "DuckLake through the worker plane") + (
                " without the commit gate" if d.commit_gate == OPTIMISTIC else ""
            )
            if d.rows_lost or d.duplicate_rows:
                return (
                    f"{label} lost {d.rows_lost} and duplicated {d.duplicate_rows} of {d.expected_rows} rows "
                    f"({d.errors} inserts reported an error, {d.silently_lost} lost silently)"
                )
        return None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "suite": "concurrency",
            "writers": self.writers,
            "ops_per_writer": self.ops_per_writer,
            **self.machine.as_dict(),
            "results": {m: r.as_dict() for m, r in self.results.items()},
        }
        if self.floor is not None:
            out["floor"] = asdict(self.floor)
        if self.goals is not None:
            out["goals"] = self.goals.as_dict()
        if self.vs_floor:
            out["total_vs_floor"] = self.vs_floor
        return out


def _error_kind(exc: BaseException) -> str:
    msg = str(exc)
    if "Conflicting lock" in msg:
        return "conflicting lock"
    return f"{type(exc).__name__}: {msg.strip().splitlines()[0][:120] if msg.strip() else ''}"


def _timed_inserts(insert: Callable[[int], int], ops: int) -> dict[str, Any]:
    """Run `insert(op)` for op in 0..ops-1 (it returns how many times it re-ran the statement), timing each; a
    failed insert is counted by kind, not retried. The report's figures for one writer."""
    errors: Counter = Counter()
    latencies = []
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process on this machine
    cpu_start = time.process_time()  # this process's CPU (all its threads): what an insert costs the client
    reruns = 0  # inserts run again after DuckLake gave up its own retries (nothing had been committed)
    for op in range(ops):
        t = time.perf_counter()
        try:
            reruns += insert(op)
        except duckdb.Error as exc:
            errors[_error_kind(exc)] += 1
            continue
        latencies.append((op, time.perf_counter() - t))
    return {
        "start": start,
        "end": time.monotonic(),
        "cpu_s": time.process_time() - cpu_start,
        "reruns": reruns,
        "latencies_s": latencies,
        "errors": dict(errors),
    }


def _writer(mode: str, target: Any, worker: int, ops: int, barrier, queue, options: dict[str, Any]) -> None:
    """One process: set up, wait at the barrier, do `ops` INSERTs, send back its timings and errors."""
    report: dict[str, Any] = {"worker": worker, "latencies_s": [], "errors": {}, "setup_error": None}
    lake = None
    try:
        # a process's first parametrised execute imports pandas and numpy (~2 s here): a start-up cost, not an operation
        duckdb.connect().execute("SELECT ?", [0]).fetchall()
        if mode.startswith("ducklake"):
            # one connection for every operation of this worker; settings SET before the ATTACH
            lake = Lake(
                target,
                settings=options.get("settings"),
                catalog_settings=options.get("catalog_settings"),
                commit_gate=options.get("commit_gate"),
            )
            table = f"{BENCH_SCHEMA}.{TABLE}"
            lake.con.execute(f"SELECT count(*) FROM {table}").fetchall()  # catalog loaded before the clock starts
        else:
            table = TABLE
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        report["setup_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        barrier.abort()
        queue.put(report)
        return
    sql = _INSERT.format(table=table)
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - another worker failed its setup: nothing to measure
        queue.put({**report, "setup_error": "the barrier broke (another worker failed to start)"})
        return
    if lake is not None:
        # through the Lake: its commit gate, unless the mode is optimistic
        report.update(_timed_inserts(lambda op: execute_retrying(lake, sql, [worker, op]), ops))
    else:

        def open_write_close(op: int) -> int:
            con = duckdb.connect(target)  # the seed's pattern: open, write, close, for every operation
            try:
                con.execute(sql, [worker, op])
            finally:
                con.close()
            return 0

        report.update(_timed_inserts(open_write_close, ops))
    if lake is not None:
        lake.close()
    queue.put(report)


def _run_writers(
    mode: str,
    target: Any,
    writers: int,
    ops: int,
    options: dict[str, Any] | None = None,
    on_release: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Start the writers, release them together once all are ready, collect one report from each.
    `on_release` runs just before the release (e.g. to read the catalog server's CPU counter)."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process holding DuckDB or JVM threads
    barrier = ctx.Barrier(writers + 1)
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(mode, target, w, ops, barrier, queue, options or {}), daemon=True)
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    reports: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while barrier.n_waiting < writers:  # a writer that died while starting never arrives: stop waiting
            if barrier.broken or any(p.exitcode is not None for p in procs) or time.monotonic() > deadline:
                barrier.abort()
                break
            time.sleep(0.02)
        on_release()
        try:
            barrier.wait(BARRIER_TIMEOUT_S)  # every writer is ready: they start together
        except threading.BrokenBarrierError:
            pass
        while len(reports) < writers:
            try:
                reports.append(queue.get(timeout=1))
            except queue_mod.Empty:
                if all(p.exitcode is not None for p in procs):
                    break  # everyone exited: nothing more will come
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    failed = [r["setup_error"] for r in reports if r.get("setup_error")]
    if failed:
        real = [f for f in failed if "barrier broke" not in f] or failed
        raise KitError(
            f"a {mode} writer could not start ({real[0].splitlines()[-1][:300]})", "run `status`; see the error above"
        )
    if len(reports) < writers:
        codes = [p.exitcode for p in procs]
        raise KitError(
            f"{writers - len(reports)} {mode} writer(s) died without a report (exit codes {codes})",
            "a script that runs the bench needs `if __name__ == '__main__':` (writers are spawned)",
        )
    return reports


def _percentile(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(p * len(sorted_values)) - 1))]


def _summary(
    mode: str, reports: list[dict[str, Any]], writers: int, ops: int, actual: int, distinct: int
) -> WriterFigures:
    lat = sorted(s for r in reports for _, s in r["latencies_s"])
    slowest = sorted(((s, r["worker"], op) for r in reports for op, s in r["latencies_s"]), reverse=True)[:5]
    errors: Counter = Counter()
    for r in reports:
        errors.update(r["errors"])
    total = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    expected = writers * ops
    n_errors = sum(errors.values())
    return WriterFigures(
        mode=mode,
        writers=writers,
        ops_per_writer=ops,
        total_s=round(total, 3),
        ops_per_s=round(len(lat) / total, 1) if total else None,
        median_ms=round(statistics.median(lat) * 1000, 2) if lat else None,
        p95_ms=round(_percentile(lat, 0.95) * 1000, 2) if lat else None,
        p99_ms=round(_percentile(lat, 0.99) * 1000, 2) if lat else None,
        max_ms=round(lat[-1] * 1000, 2) if lat else None,  # same precision as median and p95, so they stay ordered
        succeeded=len(lat),
        errors=n_errors,
        errors_by_kind=dict(errors),
        expected_rows=expected,
        actual_rows=actual,
        rows_lost=expected - actual,
        silently_lost=expected - n_errors - actual,  # INSERTs that reported success but whose row is missing
        duplicate_rows=actual - distinct,
        slowest_ops=[{"writer": w, "op": op, "ms": round(s * 1000, 1)} for s, w, op in slowest],
    )


# -- (a) one DuckDB file -------------------------------------------------------------------------------------


def run_file(home: Path, writers: int, ops: int) -> WriterFigures:
    folder = Path(tempfile.mkdtemp(prefix="bench-concurrency-", dir=home))
    path = str(folder / "seed.duckdb")
    try:
        with duckdb.connect(path) as con:
            con.execute(f"CREATE TABLE {TABLE} (worker INTEGER, op INTEGER, inserted_at TIMESTAMP)")
        reports = _run_writers("file", path, writers, ops)
        with duckdb.connect(path) as con:
            actual, distinct = con.execute(f"SELECT count(*), count(DISTINCT (worker, op)) FROM {TABLE}").fetchone()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = _summary("file", reports, writers, ops, int(actual), int(distinct))
    out.retries = 0  # the seed did not retry; neither does this mode
    out.retries_note = "none: a failed open is not retried (as in the seed)"
    return out


# -- (b) DuckLake, PostgreSQL catalog ------------------------------------------------------------------------


def _catalog_counters(ep: Endpoints) -> tuple[int, int]:
    """(committed, rolled back) transactions of the catalog database, as PostgreSQL counts them."""
    with postgres.connect(ep.pg) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", (ep.pg.dbname,)
        ).fetchone()
    return int(row[0]), int(row[1])


def _catalog_setting(ep: Endpoints, name: str) -> str | None:
    with postgres.connect(ep.pg) as conn:
        return conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()[0]


def profile_insert(lake: Lake, table: str) -> dict[str, Any]:
    """The catalog statements one INSERT commits with: `pg_debug_show_queries` prints each round trip."""
    trips, seconds = catalog_statements(lake.con, _INSERT.format(table=table), [-1, -2])
    return {
        "catalog_round_trips": len(trips),
        "seconds": round(seconds, 4),
        "statements": [t.split("\n")[0][:100] for t in trips],
    }


def catalog_cpu_reader(state: State) -> Callable[[], float | None]:
    """CPU seconds used so far by the kit's own PostgreSQL (postmaster and its backends), or None when the catalog
    is not a process of this machine that the kit started (k3d, external)."""
    import psutil  # only where the catalog's CPU is read

    def read() -> float | None:
        rec = procs.live_pid(state.pid_file("postgres"))
        if rec is None:
            return None
        try:
            root = psutil.Process(rec.pid)
            family = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in family:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system  # exited backends count too
        return total

    return read


def _prepare_table(ep: Endpoints, inlining: bool, profile: bool = False) -> dict[str, Any] | None:
    """(Re)create the table the writers insert into; the profile of one INSERT's catalog round trips if asked."""
    table = f"{BENCH_SCHEMA}.{TABLE}"
    with Lake(ep) as lake:
        lake.con.execute(f"CREATE SCHEMA IF NOT EXISTS {BENCH_SCHEMA}")
        lake.con.execute(f"CREATE OR REPLACE TABLE {table} (worker INTEGER, op INTEGER, inserted_at TIMESTAMP)")
        lake.con.execute(
            f"CALL {lake.alias}.set_option('data_inlining_row_limit', {10 if inlining else 0}, "
            f"schema => '{BENCH_SCHEMA}', table_name => '{TABLE}')"
        )
        # setup rows (op < 0, not counted): the first INSERT creates the inlined-data table in the catalog, once;
        # the second is profiled (catalog round trips of an ordinary INSERT)
        lake.con.execute(_INSERT.format(table=table), [-1, -1])
        return profile_insert(lake, table) if profile else None


def _counted(ep: Endpoints) -> tuple[int, int, int]:
    """(rows, distinct (worker, op), distinct snapshots) the concurrent run left in the table."""
    with Lake(ep) as lake:
        actual, distinct, snapshots = lake.con.execute(
            f"SELECT count(*), count(DISTINCT (worker, op)), count(DISTINCT snapshot_id) FROM {BENCH_SCHEMA}.{TABLE} "
            "WHERE op >= 0"
        ).fetchone()
    return int(actual), int(distinct), int(snapshots)


def _lake_figures(
    mode: str,
    ep: Endpoints,
    reports: list[dict[str, Any]],
    writers: int,
    ops: int,
    before: tuple[int, int],
    after: tuple[int, int],
    catalog_cpu_s: tuple[float | None, float | None],
    inlining: bool,
    retries_note: str,
) -> WriterFigures:
    """A DuckLake side's figures: the writers' reports, the rows counted in the table, the catalog's transaction
    counters and CPU (before, after) around the concurrent part."""
    actual, distinct, snapshots = _counted(ep)
    out = _summary(mode, reports, writers, ops, actual, distinct)
    out.retries = after[1] - before[1]
    out.retries_note = retries_note
    out.reruns = sum(r.get("reruns", 0) for r in reports)
    out.reruns_note = (
        f"inserts run again by the writer after DuckLake gave up its {RETRY_SETTINGS['ducklake_max_retry_count']} "
        "retries (lake.execute_retrying: nothing had been committed; capped, jittered waits)"
    )
    out.catalog_commits = after[0] - before[0]
    out.snapshots = snapshots  # one per INSERT: fewer would mean two INSERTs shared a snapshot id
    ok = out.succeeded or 1
    out.client_cpu_ms_per_insert = round(sum(r.get("cpu_s", 0.0) for r in reports) / ok * 1000, 2)
    start, end = catalog_cpu_s
    out.catalog_cpu_ms_per_insert = (
        round((end - start) / ok * 1000, 2) if start is not None and end is not None else None
    )
    out.data_inlining = inlining
    out.synchronous_commit = _catalog_setting(ep, "synchronous_commit")
    out.retry_settings = RETRY_SETTINGS
    return out


@dataclass(frozen=True)
class WriterTuning:
    """How the DuckLake writers are set up: data inlining on the bench table; `settings`, DuckDB settings of every
    writer (over SMALL_WRITER_SETTINGS, before the ATTACH); `catalog_settings`, PostgreSQL settings of their
    catalog connections (e.g. synchronous_commit); `calibrate_ops`, inserts of one writer alone measured first
    (0: none); `profile`, the catalog round trips of one INSERT."""

    inlining: bool = True
    settings: dict[str, Any] | None = None
    catalog_settings: dict[str, str] | None = None
    calibrate_ops: int = 0
    profile: bool = True


def run_ducklake(
    ep: Endpoints,
    writers: int,
    ops: int,
    tuning: WriterTuning = WriterTuning(),
    catalog_cpu: Callable[[], float | None] = lambda: None,
    mode: str = "ducklake",
) -> WriterFigures:
    """`mode`: `ducklake` (commits through the commit gate) or `ducklake-optimistic` (without it)."""
    inlining, settings, catalog_settings = tuning.inlining, tuning.settings, tuning.catalog_settings
    profile, calibrate_ops = tuning.profile, tuning.calibrate_ops
    gate = commit_gate_of(mode)
    table = f"{BENCH_SCHEMA}.{TABLE}"
    worker_settings = {**SMALL_WRITER_SETTINGS, **(settings or {})}
    insert_profile = _prepare_table(ep, inlining, profile)
    single = (
        single_writer(ep, table, calibrate_ops, worker_settings, catalog_settings, catalog_cpu)
        if calibrate_ops
        else None
    )
    before = _catalog_counters(ep)
    cpu: dict[str, float | None] = {}
    reports = _run_writers(
        mode,
        ep,
        writers,
        ops,
        {"settings": worker_settings, "catalog_settings": catalog_settings, "commit_gate": gate},
        on_release=lambda: cpu.update(start=catalog_cpu()),
    )
    cpu["end"] = catalog_cpu()
    after = _catalog_counters(ep)  # the workers have exited, so their statistics are flushed
    out = _lake_figures(
        mode,
        ep,
        reports,
        writers,
        ops,
        before,
        after,
        (cpu.get("start"), cpu.get("end")),
        inlining,
        "rolled-back catalog transactions during the run (pg_stat_database.xact_rollback): each is a "
        "commit attempt that lost the race and was retried by DuckLake (exact if nothing else used the catalog)",
    )
    out.insert_profile = insert_profile
    if catalog_settings and catalog_settings.get("synchronous_commit"):
        out.synchronous_commit = catalog_settings["synchronous_commit"]  # this run's, not the server's default
    out.settings = worker_settings  # DuckDB settings of the workers (on top of RETRY_SETTINGS)
    out.catalog_settings = catalog_settings or {}
    out.single_writer = single
    out.commit_gate = gate
    return out


# -- (c) the same inserts as tasks of the worker plane ---------------------------------------------------------


def _plane_writer(
    plugin: str, writer: int, ops: int, ready: str, go: str, token: str, commit_gate: str = ADVISORY
) -> dict[str, Any]:
    """A worker plane task (runs on a Dask worker): warm up on the worker's pooled connection, say so on the `ready`
    queue, wait for the `go` event, then do `ops` INSERTs, through the worker's commit gate or, for this task only,
    without it (`commit_gate`). Returns the same report as a writer process."""
    from distributed import Event, Queue

    from ducklake_kit.lake.gate import CommitGate
    from ducklake_kit.workers.tasks import task_lake

    report: dict[str, Any] = {"worker": writer, "latencies_s": [], "errors": {}, "setup_error": None}
    lake_plugin, refused = task_lake(plugin, token)  # a second run by Dask (a lost result) refuses: never insert twice
    if lake_plugin is None:
        report["setup_error"] = refused
        Queue(ready).put(writer)
        return report
    lake = lake_plugin.lake
    con = lake.con
    table = f"{BENCH_SCHEMA}.{TABLE}"
    con.execute(f"SELECT count(*) FROM {table}").fetchall()  # the table's catalog entry read before the clock starts
    sql = _INSERT.format(table=table)
    Queue(ready).put(writer)
    if not Event(go).wait(BARRIER_TIMEOUT_S):
        report["setup_error"] = "never released (another writer failed to start)"
        return report
    with lake_plugin.exclusive():
        kept = lake.gate  # the worker's own, put back after this task
        lake.gate = CommitGate.of(lake.endpoints.pg) if commit_gate == ADVISORY else None
        try:
            report.update(_timed_inserts(lambda op: execute_retrying(lake, sql, [writer, op]), ops))
        finally:
            lake.gate = kept
    return report


def _wait_ready(wp, ready, futures) -> None:
    """Until every writer task said it is ready; a task that ended before (it failed, or its worker died) stops
    the wait at once with its own error instead of the barrier's timeout."""
    deadline, waiting = time.monotonic() + BARRIER_TIMEOUT_S, len(futures)
    while waiting:
        try:
            ready.get(timeout=1)
            waiting -= 1
            continue
        except TimeoutError:
            pass
        ended = [f for f in futures if f.done() and f.status != "finished"]  # erred, or its worker died
        if ended:
            r = wp.result(ended[0])  # a TaskResult naming a dead worker, or the task's own exception raised here
            raise KitError(
                f"a writer on the worker plane could not start ({r.error.line()})", "run `workers` to see their state"
            )
        if time.monotonic() > deadline:
            raise KitError(
                f"{waiting} writer task(s) did not start within {BARRIER_TIMEOUT_S} s",
                "run `workers`: the plane may have fewer free workers than writers",
            )


def run_plane(
    kit: Kit,
    writers: int,
    ops: int,
    inlining: bool = True,
    catalog_cpu: Callable[[], float | None] = lambda: None,
    modes: tuple[str, ...] = ("workers",),
) -> dict[str, WriterFigures]:
    """The inserts as worker plane tasks, one writer per worker w1..wN, once per mode (`workers`: through the
    workers' commit gate; `workers-optimistic`: without it), on the same workers. Workers the kit's plane lacks are
    started (not remembered as its size) and stopped afterwards, the scheduler too when the run started it."""
    import uuid

    from distributed import Event, Queue

    from ducklake_kit.workers import WorkerPlane
    from ducklake_kit.workers import plane as plane_mod
    from ducklake_kit.workers.client import name_order
    from ducklake_kit.workers.plugin import WORKER_SETTINGS

    out: dict[str, WriterFigures] = {}
    ep = kit.platform.endpoints()
    with plane_mod.borrowed(kit.state, ep, writers, kit.scheduler) as status, WorkerPlane(status.address, ep) as wp:
        names = sorted(wp.names(), key=name_order)[:writers]
        if len(names) < writers:
            raise KitError(
                f"the Dask cluster at {status.address} has {len(names)} workers, the run needs {writers}",
                f"start more workers there, or run {len(names)} writers",
            )
        for mode in modes:
            _prepare_table(ep, inlining)
            token = uuid.uuid4().hex[:12]
            ready, go = Queue(f"bench-ready-{token}", client=wp.client), Event(f"bench-go-{token}", client=wp.client)
            futures = [
                wp.client.submit(
                    _plane_writer,
                    wp.plugin,
                    i,
                    ops,
                    ready.name,
                    go.name,
                    uuid.uuid4().hex,
                    commit_gate_of(mode),
                    pure=False,
                    retries=0,
                    workers=[wp.address_of(n)],
                    allow_other_workers=False,
                )
                for i, n in enumerate(names)
            ]
            _wait_ready(wp, ready, futures)
            before, cpu_start = _catalog_counters(ep), catalog_cpu()
            go.set()
            results = [wp.result(f) for f in futures]
            cpu_end = catalog_cpu()
            time.sleep(1.5)  # let the workers' catalog connections publish their transaction counters
            after = _catalog_counters(ep)
            failed = [r for r in results if not isinstance(r, dict) or r.get("setup_error")]
            if failed:
                first = failed[0]
                why = first.get("setup_error") if isinstance(first, dict) else first.error.line()
                raise KitError(
                    f"a writer on the worker plane could not run ({why})", "run `workers` to see the workers' state"
                )
            fig = _lake_figures(
                mode,
                ep,
                results,
                writers,
                ops,
                before,
                after,
                (cpu_start, cpu_end),
                inlining,
                "rolled-back catalog transactions during the run (pg_stat_database.xact_rollback), read "
                "1.5 s after it: the workers' catalog connections stay open, so this may under-count",
            )
            fig.settings = WORKER_SETTINGS
            fig.catalog_settings = {}
            fig.commit_gate = commit_gate_of(mode)
            out[mode] = fig
    return out


def single_writer(
    ep: Endpoints,
    table: str,
    ops: int,
    settings: dict[str, Any],
    catalog_settings: dict[str, str] | None,
    catalog_cpu: Callable[[], float | None],
) -> SingleWriter:
    """One writer alone, in this process, with the workers' settings: latency and CPU per insert without contention.
    Its rows have op < 0, so the concurrent run's counts leave them out."""
    with Lake(ep, settings=settings, catalog_settings=catalog_settings) as lake:
        sql = _INSERT.format(table=table)
        lake.write(sql, [-3, -1])  # the first INSERT of a connection loads the catalog
        latencies = []
        pg0, cpu0 = catalog_cpu(), time.process_time()
        for op in range(ops):
            t = time.perf_counter()
            lake.write(sql, [-3, -2 - op])  # as the kit commits by default: through the commit gate
            latencies.append(time.perf_counter() - t)
        cpu1, pg1 = time.process_time(), catalog_cpu()
    latencies.sort()
    return SingleWriter(
        ops,
        round(statistics.median(latencies) * 1000, 2),
        round(_percentile(latencies, 0.95) * 1000, 2),
        round(latencies[0] * 1000, 2),
        round((cpu1 - cpu0) / ops * 1000, 2),
        round((pg1 - pg0) / ops * 1000, 2) if pg0 is not None and pg1 is not None else None,
    )


def floor(single: SingleWriter, writers: int, ops: int, cores: int) -> Floor:
    """What this machine could do at best with these settings, from one writer measured alone: every insert needs
    `cpu` ms of CPU (DuckDB client + PostgreSQL) and `writers` processes share `cores` cores, so the run needs at
    least inserts x cpu / min(writers, cores) seconds (retries only add CPU); and an insert is a chain of catalog
    round trips that other writers cannot shorten, so the median is not below the lone writer's. Both are lower
    bounds measured on this machine (noise aside), not predictions. Hence too at most cores / cpu inserts a second,
    and, as each of the `writers` in a closed loop waits for the others (Little's law: mean latency = writers /
    throughput), a mean latency of at least writers x cpu / min(writers, cores). Through the commit gate, commits
    go one at a time, each holding it for about the fastest lone insert: at most 1 / min_ms inserts a second."""
    cpu = single.client_cpu_ms_per_insert + (single.catalog_cpu_ms_per_insert or 0.0)
    total = writers * ops * cpu / 1000 / min(writers, cores)
    rate = 1000 * min(writers, cores) / cpu if cpu else 0.0
    # the gate is held for the insert's whole statement (lake.Lake.write): at least the fastest lone insert, less
    # the lock's own round trip (a fraction of a millisecond here)
    gated = 1000 / single.min_ms if single.min_ms else 0.0
    return Floor(
        round(cpu, 2),
        single.catalog_cpu_ms_per_insert is not None,
        round(total, 3),
        round(single.median_ms or 0.0, 2),
        round(rate, 1),
        round(writers / rate * 1000, 2) if rate else 0.0,
        round(min(rate, gated), 1),
        round(writers / min(rate, gated) * 1000, 2) if gated and rate else 0.0,
    )


def goals(run: WriterFigures, lower_bounds: Floor | None) -> Goals:
    """Which goals DuckLake's run met, and (from the floor measured alone) whether this machine could meet the
    time goals at all."""
    met = {
        "total_s": run.total_s < GOALS["total_s"],
        "median_ms": (run.median_ms or 0) < GOALS["median_ms"],
        "errors": run.errors == 0,
        "rows_lost": run.rows_lost == 0,
    }
    reach = None
    if lower_bounds is not None:
        reach = {
            "total_s": lower_bounds.total_s_at_least < GOALS["total_s"],
            "median_ms": lower_bounds.median_ms_at_least < GOALS["median_ms"],
        }
    return Goals(met, reach)


def contention_goals(run: WriterFigures) -> dict[str, bool]:
    """Which of CONTENTION_GOALS a DuckLake mode's run met."""
    g = CONTENTION_GOALS
    return {
        "p99_ms": run.p99_ms is not None and run.p99_ms <= g["p99_ms"],
        "max_ms": run.max_ms is not None and run.max_ms <= g["max_ms"],
        "ops_per_s": (run.ops_per_s or 0) >= g["ops_per_s"],
        "rows_lost": run.rows_lost == 0,
        "duplicate_rows": run.duplicate_rows == 0,
    }


def contention_reachable(lower_bounds: Floor) -> dict[str, bool]:
    """Whether this machine can meet the contention goals at all. The mean latency is at most 0.99 x p99 + 0.01 x
    max, so p99 <= 50 ms together with max <= 1 s needs a mean <= 59.5 ms, which the floor's mean bound (Little's
    law over the CPU an insert costs) may already exceed; and no mode inserts faster than cores / cpu."""
    g = CONTENTION_GOALS
    mean_allowed = 0.99 * g["p99_ms"] + 0.01 * g["max_ms"]
    f = lower_bounds
    return {
        "p99_and_max_ms": f.mean_ms_at_least <= mean_allowed,
        "ops_per_s": f.ops_per_s_at_most >= g["ops_per_s"],
        "p99_and_max_ms_through_the_gate": f.gated_mean_ms_at_least <= mean_allowed,
        "ops_per_s_through_the_gate": f.gated_ops_per_s_at_most >= g["ops_per_s"],
    }


# -- the suite -----------------------------------------------------------------------------------------------


def bench_concurrency(
    kit: Kit,
    *,
    writers: int = 3,
    ops: int = 100,
    modes: tuple[str, ...] = MODES,
    tuning: WriterTuning = WriterTuning(calibrate_ops=CALIBRATE_OPS),
    outputs: Outputs = NOT_WRITTEN,
) -> ConcurrencyRun:
    """`tuning`: see WriterTuning; its `calibrate_ops` (inserts of one writer alone, measured first) give the lower
    bounds of `floor` (0: skip)."""
    state, say = kit.state, kit.say
    if writers < 1 or ops < 1:
        raise KitError("--writers and --ops must be at least 1", "e.g. --writers 3 --ops 100")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise KitError(f"unknown concurrency mode '{unknown[0]}'", f"choose from: {', '.join(MODES)}")
    ep = kit.platform.endpoints()
    load_before = load_average()
    results: dict[str, WriterFigures] = {}
    if "file" in modes:
        say(f"(a) one DuckDB file, opened per operation: {writers} writers x {ops} inserts")
        state.home.mkdir(parents=True, exist_ok=True)
        results["file"] = run_file(state.home, writers, ops)
    cpu_reader = catalog_cpu_reader(state)
    lake_modes = [m for m in modes if m.startswith("ducklake")]
    for i, mode in enumerate(lake_modes):
        gate = commit_gate_of(mode)
        say(
            f"(b) DuckLake, PostgreSQL catalog, one connection per worker, commit gate {gate}: {writers} writers x "
            f"{ops} inserts"
        )
        # the lone writer is measured once, before the first DuckLake mode (as the kit commits by default)
        calibrate = min(tuning.calibrate_ops, max(ops, 20)) if i == 0 else 0
        results[mode] = run_ducklake(ep, writers, ops, replace(tuning, calibrate_ops=calibrate), cpu_reader, mode)
    plane_modes = tuple(m for m in modes if m.startswith("workers"))
    if plane_modes:
        say(
            f"(c) DuckLake from the worker plane (Dask), one task per writer, commit gate "
            f"{' then '.join(commit_gate_of(m) for m in plane_modes)}: {writers} writers x {ops} inserts"
        )
        results.update(run_plane(kit, writers, ops, tuning.inlining, cpu_reader, plane_modes))
    out = ConcurrencyRun(writers, ops, Machine.since(load_before), results)
    single = next((r.single_writer for r in results.values() if r.single_writer is not None), None)
    if single is not None:
        out.floor = floor(single, writers, ops, os.cpu_count() or 1)
    d = out.ducklake or next((results[m] for m in lake_modes), None)
    if d is not None:
        out.goals = goals(d, out.floor)
    if out.goals is not None:
        out.goals.contention_met = {m: contention_goals(r) for m, r in results.items() if m != "file"}
        if out.floor is not None:
            out.goals.contention_reachable_here = contention_reachable(out.floor)
    if out.floor is not None and out.floor.total_s_at_least:
        out.vs_floor = {m: round(r.total_s / out.floor.total_s_at_least, 2) for m, r in results.items() if m != "file"}
    write_outputs(out, outputs.json, outputs.png, chart_concurrency)
    return out


def chart_concurrency(result: ConcurrencyRun, path: Path) -> None:
    """Left: total seconds per mode; right: median and p95 ms per operation (log scales)."""
    import matplotlib  # only with --png: matplotlib takes a while to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = result.results
    names = list(res)
    labels = [f"{m}\n{res[m].errors} errors, {res[m].rows_lost} lost" for m in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5))
    left.bar(labels, [res[m].total_s for m in names], color=["tab:red", "tab:blue", "tab:green"][: len(names)])
    left.set_ylabel("total seconds (concurrent part)")
    left.set_yscale("log")
    x = range(len(names))
    right.bar([i - 0.2 for i in x], [res[m].median_ms or 0 for m in names], 0.4, label="median")
    right.bar([i + 0.2 for i in x], [res[m].p95_ms or 0 for m in names], 0.4, label="p95")
    right.set_xticks(list(x), labels)
    right.set_ylabel("ms per successful insert")
    right.set_yscale("log")
    right.legend()
    fig.suptitle(
        f"bench --suite concurrency: {result.writers} writers x {result.ops_per_writer} inserts, "
        f"{result.machine.cores} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
