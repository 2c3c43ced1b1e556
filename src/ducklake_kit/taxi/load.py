"""The PySpark load: source files -> raw bucket -> Spark (conform, quality flags, derived columns) ->
executors write Parquet into the lake's data path -> the driver registers every file of the load in ONE
DuckLake transaction (one snapshot), together with the zones and the load_log.

The driver never collects trip rows: executors return only the paths they wrote and their row counts.
A killed or failed load registers nothing, so the lake is as it was (files it wrote are unreferenced and
removed by `ducklake_delete_orphaned_files`); a retried Spark task writes new files and only the
successful attempt's files are registered, so retries never duplicate rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import BotoCoreError, ClientError

from ducklake_kit import faults
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake, connect_config, load_statements, secret_statements
from ducklake_kit.lake.locks import (
    commit_lock,
    data_file_prefix,
    held_for_life,
    load_life_key,
)
from ducklake_kit.lake.sql import quote_ident, quote_literal, table_exists, tables
from ducklake_kit.lake.transactions import (
    AUTHOR,
    last_committed_snapshot,
    rollback_quietly,
    snapshot_of_token,
    snapshot_with_token,
)
from ducklake_kit.platforms import s3
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import schema
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.executors import WRITER_EXTENSIONS, check_executors
from ducklake_kit.taxi.sources import SourceFile

TRIPS = "trips"
QUARANTINE = "quarantine"
ZONES = "zones"
LOAD_LOG = "load_log"
MODES = ("skip", "append", "replace")
PARTITION_KEYS = ("pickup_year", "pickup_month")
# A PostgreSQL advisory lock in the catalog database serialises the commit phase of concurrent loads
# (a bigint key: the ASCII of "dlk-load"), so a load re-plans after any load that committed before it.

_DUCK_TYPES = {
    "DATE": "DATE",
    "INT": "INTEGER",
    "BIGINT": "BIGINT",
    "STRING": "VARCHAR",
    "DOUBLE": "DOUBLE",
    "TIMESTAMP_NTZ": "TIMESTAMP",
}
LINEAGE_COLUMNS = (("load_id", "VARCHAR"), ("source_file", "VARCHAR"))


def trips_columns() -> list[tuple[str, str]]:
    from ducklake_kit.taxi.transforms import DERIVED_COLUMNS  # transforms imports pyspark: only when a load runs

    return (
        [(c.name, c.duckdb_type) for c in schema.CANONICAL_COLUMNS]
        + [(n, _DUCK_TYPES[t]) for n, t in DERIVED_COLUMNS]
        + list(LINEAGE_COLUMNS)
    )


def ddl_statements(schema_name: str = "main", existing: frozenset[str] = frozenset()) -> list[str]:
    """The tables, created once and from one place (here), idempotently, inside the load's transaction.

    `load_log` needs no snapshot column: DuckLake's virtual column `snapshot_id` (`SELECT snapshot_id, *
    FROM load_log`) is the snapshot that inserted each row, i.e. the load's own snapshot."""
    cols = ", ".join(f"{n} {t}" for n, t in trips_columns())
    q = schema_name
    return [
        f"CREATE SCHEMA IF NOT EXISTS {q}",
        f"CREATE TABLE IF NOT EXISTS {q}.{TRIPS} ({cols})",
        *([] if TRIPS in existing else [f"ALTER TABLE {q}.{TRIPS} SET PARTITIONED BY ({', '.join(PARTITION_KEYS)})"]),
        f"CREATE TABLE IF NOT EXISTS {q}.{QUARANTINE} ({cols}, reject_reason VARCHAR)",
        f"CREATE TABLE IF NOT EXISTS {q}.{ZONES} (location_id INTEGER, borough VARCHAR, zone VARCHAR, service_zone VARCHAR)",
        f"CREATE TABLE IF NOT EXISTS {q}.{LOAD_LOG} (load_id VARCHAR, source VARCHAR, source_file VARCHAR, raw_uri VARCHAR, "
        "sha256 VARCHAR, period VARCHAR, mode VARCHAR, rows_read BIGINT, rows_accepted BIGINT, rows_rejected BIGINT, "
        "data_files INTEGER, started_at TIMESTAMP, seconds DOUBLE)",
    ]


@dataclass
class FileResult:
    source: SourceFile
    raw_uri: str = ""
    status: str = "pending"  # loaded | skipped
    reason: str = ""
    rows_read: int = 0
    rows_accepted: int = 0
    rows_rejected: int = 0
    data_files: int = 0
    load_id: str = ""  # the load whose rows came from this file (an earlier one when skipped)


@dataclass(frozen=True, order=True)
class Replaced:
    """One earlier file's rows that `replace` swaps out: what that load took from that source file (one load_log
    row). A replace names periods (and file contents), not loads: the other files of that load, other periods, stay."""

    load_id: str
    source_file: str
    period: str


@dataclass
class LoadResult:
    load_id: str
    mode: str
    source_note: str
    files: list[FileResult] = field(default_factory=list)
    snapshot_id: int | None = None  # None: nothing new to load, no snapshot made
    previous_snapshot: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    zones: str = ""
    replaced: list[Replaced] = field(default_factory=list)  # mode replace: the earlier files whose rows it swapped out

    def as_dict(self) -> dict[str, Any]:
        return {
            "load_id": self.load_id,
            "mode": self.mode,
            "source": self.source_note,
            "zones": self.zones,
            "snapshot_id": self.snapshot_id,
            "previous_snapshot": self.previous_snapshot,
            "timings_s": self.timings,
            "replaced": [asdict(r) for r in self.replaced],
            "files": [
                {
                    **{k: v for k, v in asdict(f).items() if k != "source"},
                    "file": f.source.path.name,
                    "period": f.source.period,
                    "sha256": f.source.sha256,
                    "kind": f.source.kind,
                }
                for f in self.files
            ],
        }


# -- landing in the raw bucket ---------------------------------------------------------------------------


def land_raw(ep: Endpoints, src: SourceFile) -> tuple[str, bool]:
    """Upload to s3://raw/<kind>/<sha256 prefix>/<name> unless that object is already there.

    Content-addressed: an object's key names its content, so a later file of the same name never overwrites
    the copy an earlier load (and its load_log row) points at."""
    key = f"{src.kind}/{src.sha256[:16]}/{src.path.name}"
    client = s3.client(ep.s3)
    try:
        try:
            head = client.head_object(Bucket="raw", Key=key)
            if head.get("Metadata", {}).get("sha256") == src.sha256:
                return f"s3://raw/{key}", False
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                raise
        client.upload_file(str(src.path), "raw", key, ExtraArgs={"Metadata": {"sha256": src.sha256}})
    except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
        raise s3.explain(ep.s3, exc) from None
    return f"s3://raw/{key}", True


# -- the executors' writer -------------------------------------------------------------------------------

WRITTEN_SCHEMA = "tbl string, path string, rows long, source_file string"


def make_writer(
    ep: Endpoints,
    data_path: str,
    schema_name: str = "main",
    fail_first_attempt: bool = False,
    load_id: str = "000000000000",
) -> Callable[[Iterator], Iterator]:
    """A mapInArrow function: stream the task's rows into Parquet on S3 with DuckDB, accepted rows
    partitioned like DuckLake lays them out, rejected rows into one quarantine file. Yields only
    (table, path, rows) per written file, never the rows themselves. Files are named for the load
    (`data_file_prefix`)."""
    prefix = data_file_prefix(load_id)
    s3_secret = secret_statements(ep)[0]  # the S3 secret only: executors never touch the catalog
    trips_dir = f"{data_path.rstrip('/')}/{schema_name}/{TRIPS}"  # where DuckLake itself would put them
    quarantine_dir = f"{data_path.rstrip('/')}/{schema_name}/{QUARANTINE}"
    keys = ", ".join(PARTITION_KEYS)

    def write(batches: Iterator) -> Iterator:
        # imported on the executor, in its own Python process
        import duckdb
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        con = duckdb.connect(config=connect_config(WRITER_EXTENSIONS, threads=1))  # Spark runs one task per core
        # extension paths are resolved here, on the executor: its Python environment may live elsewhere. httpfs only:
        # the writer never reads the catalog, and loading ducklake and postgres_scanner too cost 0.16 s a task
        for stmt in [*load_statements(WRITER_EXTENSIONS), s3_secret]:
            con.execute(stmt)
        rejected: list = []
        first = next(batches, None)
        if first is None:
            return
        out_schema = first.schema.remove(first.schema.get_field_index("reject_reason"))

        def accepted() -> Iterator:
            for batch in _chain(first, batches):
                bad = pc.is_valid(batch.column("reject_reason"))
                if pc.any(bad).as_py():
                    rejected.append(batch.filter(bad))
                yield batch.filter(pc.invert(bad)).drop_columns(["reject_reason"])

        reader = pa.RecordBatchReader.from_batches(out_schema, accepted())  # noqa: F841 - DuckDB scans it by name
        rows, files = con.execute(
            f"COPY (SELECT * FROM reader) TO '{trips_dir}' (FORMAT parquet, PARTITION_BY ({keys}), "
            f"WRITE_PARTITION_COLUMNS true, FILENAME_PATTERN '{prefix}{{uuid}}', RETURN_FILES true, APPEND)"
        ).fetchone()
        # a task reads one split of one source file (union keeps partitions apart): name it per written file
        source_file = first.column("source_file")[0].as_py()
        out: dict[str, list] = {"tbl": [], "path": [], "rows": [], "source_file": []}
        if files:
            counts = dict(
                con.execute(
                    "SELECT file_name, sum(num_rows) FROM parquet_file_metadata(?) GROUP BY 1", [list(files)]
                ).fetchall()
            )
            for f in files:
                (
                    out["tbl"].append(TRIPS),
                    out["path"].append(f),
                    out["rows"].append(int(counts[f])),
                    out["source_file"].append(source_file),
                )
            if sum(out["rows"]) != rows:
                raise RuntimeError(f"DuckDB reported {rows} rows written but the files hold {sum(out['rows'])}")
        if rejected:
            bad_table = pa.Table.from_batches(rejected)  # read by name in the COPY below (DuckDB's replacement scan)
            path = f"{quarantine_dir}/{prefix}{uuid.uuid4()}.parquet"
            con.execute(f"COPY (SELECT * FROM bad_table) TO '{path}' (FORMAT parquet)")
            out["tbl"].append(QUARANTINE), out["path"].append(path), out["rows"].append(bad_table.num_rows)
            out["source_file"].append(source_file)
        con.close()
        ctx = TaskContext.get()
        if fail_first_attempt and ctx is not None and ctx.attemptNumber() == 0:
            raise RuntimeError("injected fault: this task attempt fails after writing its files")
        yield pa.RecordBatch.from_pydict(out)

    return write


def _chain(first, rest):
    yield first
    yield from rest


# -- the load ------------------------------------------------------------------------------------------------


def _previous_loads(lake: Lake, schema_name: str) -> list[dict[str, Any]]:
    if not table_exists(lake.con, lake.alias, schema_name, LOAD_LOG):
        return []
    cur = lake.con.execute(f"SELECT load_id, sha256, period, source_file, raw_uri FROM {schema_name}.{LOAD_LOG}")
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def dropped_table(lake: Lake, table: str, schema_name: str = "main") -> KitError | None:
    """When `table` existed in the lake and was dropped: the error that says so, with the two ways back (a load
    that lands the files again, or time travel to the last snapshot that had it). None when it exists or never
    did."""
    if table_exists(lake.con, lake.alias, schema_name, table):
        return None
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    row = lake.con.execute(
        f"SELECT max(t.end_snapshot) FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id) "
        "WHERE t.table_name = ? AND s.schema_name = ? AND t.end_snapshot IS NOT NULL",
        [table, schema_name],
    ).fetchone()
    if not row or row[0] is None:
        return None
    last = int(row[0]) - 1  # the table ended at the snapshot that dropped it: the one before still has it
    name = table if schema_name == "main" else f"{schema_name}.{table}"
    return KitError(
        f"the table {name} was dropped (snapshot {last + 1}), so its rows are gone from the current lake",
        f'bring it back with time travel: sql "CREATE TABLE {name} AS SELECT * FROM {name} AT (VERSION '
        f'=> {last})", or land every file again into a new one with `load --mode replace`',
    )


def plan(
    lake: Lake, files: list[SourceFile], mode: str, schema_name: str = "main"
) -> tuple[list[SourceFile], list[FileResult], list[Replaced]]:
    """Which files to load, which to skip (and why), and which earlier files' rows `replace` swaps out: those of the
    same period or the same content, one load_log row each, never a whole earlier load (`all` loads three months as
    one load: replacing one of them must keep the other two)."""
    if mode not in MODES:
        raise KitError(f"unknown mode '{mode}'", f"choose one of: {', '.join(MODES)}")
    if mode != "replace":  # skip and append would leave the dropped rows out of a table that looks loaded
        for table in (TRIPS, QUARANTINE):
            gone = dropped_table(lake, table, schema_name)
            if gone is not None:
                raise gone
    names = [f.path.name for f in files]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise KitError(
            f"two files of this load share the name {dups[0]}",
            "load them one at a time (lineage records the file name)",
        )
    previous = _previous_loads(lake, schema_name)
    todo, skipped, superseded = [], [], []
    for f in files:
        same_content = [p for p in previous if p["sha256"] == f.sha256]
        same_period = [p for p in previous if p["period"] == f.period and p["period"] != "any"]
        if mode == "skip" and same_content:
            prev = same_content[0]
            skipped.append(
                FileResult(
                    f,
                    raw_uri=prev["raw_uri"],
                    status="skipped",
                    load_id=prev["load_id"],
                    reason=f"already loaded (load {prev['load_id']})",
                )
            )
            continue
        if mode == "skip" and same_period:
            raise KitError(
                f"{f.period} was already loaded from different content ({same_period[0]['source_file']})",
                "pass --mode replace to swap it, or --mode append to add the rows",
            )
        if mode == "replace":
            superseded += [Replaced(p["load_id"], p["source_file"], p["period"]) for p in same_content + same_period]
        todo.append(f)
    return todo, skipped, sorted(set(superseded))


@dataclass(frozen=True)
class LoadInput:
    """What one load reads: the source files, the zone lookup, and a note on each for the result."""

    files: list[SourceFile]
    zones_path: Path
    zones_note: str = ""
    source_note: str = ""


def check_load_id(load_id: str) -> None:
    """A load id a caller chose (`load --load-id`): 12 lowercase hex digits, as the load makes them (its files' names
    and its lock's key carry it), or one line."""
    if len(load_id) != 12 or any(c not in "0123456789abcdef" for c in load_id):
        raise KitError(
            f"the load id '{load_id}' is not 12 hex digits (0-9, a-f)", "leave --load-id out: the load makes one"
        )


def snapshot_of_load(lake: Lake, load_id: str) -> int | None:
    """The snapshot whose commit carried this load's id in its commit_extra_info (`_commit`), or None: nothing of
    the load was committed. How a caller that chose the id (`--load-id`) finds out whether a load that ended without
    saying so committed."""
    return lake.snapshot_carrying("load", load_id)


def run_load(
    kit: Kit,
    what: LoadInput,
    *,
    mode: str = "skip",
    schema_name: str = "main",
    spark_log: Path | None = None,
    load_id: str | None = None,
) -> LoadResult:
    """Load `what` into `schema_name` on the kit's lake, with its Spark (`kit.spark_master`, see `spark.target`);
    `spark_log`: the file the JVM's own output goes to when this load starts it (see spark.jvm_output); `load_id`:
    the caller's (see `check_load_id`; one the lake has seen is refused), else a new one."""
    ep, files, report, spark_master = kit.platform.endpoints(), what.files, kit.reporter, kit.spark_master
    zones_path = what.zones_path
    if load_id is not None:
        check_load_id(load_id)
    load_id = load_id or uuid.uuid4().hex[:12]
    result = LoadResult(load_id, mode, what.source_note, zones=what.zones_note)
    started = time.time()
    # test hook: kill-before-commit | fail-first-task-attempt | pause-before-commit=SECONDS |
    # pause-after-load-commit=SECONDS (the pauses end early once the file DUCKLAKE_FAULT_RESUME_FILE names exists)
    fault = os.environ.get("DUCKLAKE_FAULT", "")

    with Lake(ep) as lake, contextlib.ExitStack() as life:
        result.previous_snapshot = lake.current_snapshot()
        seen = snapshot_of_load(lake, load_id)
        if seen is not None:  # its rows, its files' names and its lock are that load's
            raise KitError(f"the load id {load_id} is already in the lake (snapshot {seen})", "leave --load-id out")
        todo, skipped, superseded = plan(lake, files, mode, schema_name)
        result.files.extend(skipped)
        result.replaced = superseded
        if not todo:
            report.say("nothing new to load: no snapshot made")
            return result
        # held from before the first file is written until the load ends, however it ends: files named for a load
        # whose lock is free belong to a load that can never commit them (`maintain --dead-loads` removes them)
        life_session = life.enter_context(held_for_life(ep, load_life_key(load_id)))

        # what can be known before anything is landed: a Spark that cannot start, or executors that lack what the
        # writer needs, must not leave raw objects behind
        spark_target = (
            spark_master if isinstance(spark_master, spark_mod.SparkTarget) else spark_mod.target(spark_master)
        )
        if spark_target.kind != "connect":  # a Connect client needs no JVM of its own
            from ducklake_kit.platforms.doctor import JAVA_FIX, java_problem

            why = java_problem()
            if why:
                raise KitError(f"{why}, so nothing was landed or loaded", JAVA_FIX)
        report.say(f"Spark on {spark_target.url}: asking the executors for what the load needs")
        t = time.perf_counter()
        spark = spark_mod.session(spark_target, log_path=spark_log)
        if spark_target.kind == "connect":  # a new session per load: given back to the server however the load ends
            life.callback(spark_mod.stop, spark)
        with spark_mod.interruptible(spark, "nothing was landed or loaded"):
            check_executors(
                spark,
                ep,
                [str(f.path) for f in todo] + [str(zones_path)],
                python=None if spark_target.kind == "connect" else os.environ.get("PYSPARK_PYTHON"),
            )
        result.timings["spark_start"] = round(time.perf_counter() - t, 2)
        report.say("landing raw files in s3://raw")
        t = time.perf_counter()
        landed: dict[Path, str] = {}
        with report.progress("landing raw files", total=len(todo), unit="files") as bar:
            for f in todo:
                landed[f.path] = land_raw(ep, f)[0]
                bar.advance()
        result.timings["raw"] = round(time.perf_counter() - t, 2)

        report.say("Spark: conform, flag quality, derive, write Parquet from the executors")
        t = time.perf_counter()
        done = "nothing was committed and the lake is unchanged"
        known_rows = None if any(f.rows is None for f in todo) else sum(f.rows for f in todo)
        with spark_mod.interruptible(spark, done), report.progress("Spark: writing rows", known_rows, "rows") as bar:
            try:
                df = build_frame(spark, todo, zones_path, load_id)  # Spark Connect: calls to the server already
                written = df.mapInArrow(
                    make_writer(ep, ep.data_path, schema_name, fault == "fail-first-task-attempt", load_id),
                    WRITTEN_SCHEMA,
                ).collect()
            except KitError:
                raise
            except Exception as exc:  # noqa: BLE001 - Spark surfaces executor failures as several exception types
                # a Spark Connect server that went away (or Ctrl-C) is said as such, not as a failed job
                raise (spark_mod.connect_failure(spark, exc, done) or spark_job_failed(exc, ep)) from None
            bar.advance(sum(r.rows for r in written))  # the executors write; the driver learns the rows at the end
        result.timings["spark"] = round(time.perf_counter() - t, 2)

        by_table = {
            TRIPS: [r for r in written if r.tbl == TRIPS],
            QUARANTINE: [r for r in written if r.tbl == QUARANTINE],
        }
        if fault.startswith("pause-before-commit="):  # a load that is alive with its files written, uncommitted
            pause = float(fault.split("=", 1)[1])
            report.say(f"test hook: every file written, pausing {pause:g} s before the commit")  # a test waits for this
            faults.pause(pause)
        report.say(f"registering {len(written)} data files in one DuckLake transaction")
        t = time.perf_counter()
        with commit_lock(ep):
            # `maintain --dead-loads` classifies and deletes only while it holds this same lock: a load whose life
            # lock is still held now cannot have had its files taken for a dead load's (a lost session, a restarted
            # PostgreSQL, would make it look dead)
            try:
                life_session.execute("SELECT 1")
            except Exception as exc:  # noqa: BLE001 - any failure means the lock may be gone
                raise KitError(
                    f"this load lost its lock in the catalog ({first_line(exc)}), so its files may have been "
                    "removed as a dead load's; nothing was registered and the lake is unchanged",
                    "run the load again",
                ) from None
            result.snapshot_id = _commit(
                lake,
                ep,
                todo,
                superseded,
                mode,
                schema_name,
                by_table,
                written,
                zones_path,
                landed,
                load_id,
                started,
                result,
                fault,
            )
        # the snapshot this load committed (found by its token), not the lake's latest: another writer may have
        # committed since
        result.timings["commit"] = round(time.perf_counter() - t, 2)
        if fault.startswith("pause-after-load-commit="):  # committed, its result not yet printed nor checked
            pause = float(fault.split("=", 1)[1])
            report.say(f"test hook: committed snapshot {result.snapshot_id}, pausing {pause:g} s")  # a test waits
            faults.pause(pause)
    return result


def commit_message_of(load_id: str, files: int, mode: str) -> str:
    return f"load {load_id}: {files} file(s), mode {mode}"


def load_snapshots(lake: Lake, load_id: str) -> list[int]:
    """The snapshots whose commit message names this load (one for a load that committed, none otherwise)."""
    return [
        int(r[0])
        for r in lake.con.execute(
            f"SELECT snapshot_id FROM ducklake_snapshots({quote_literal(lake.alias)}) WHERE starts_with(commit_message, ?) "
            "ORDER BY snapshot_id",
            [f"load {load_id}: "],
        ).fetchall()
    ]


def rows_snapshots(lake: Lake, load_id: str, schema_name: str = "main") -> list[int]:
    """The snapshots that inserted the rows this load wrote, in trips, quarantine and load_log (DuckLake's virtual
    column `snapshot_id`)."""
    parts = [
        f"SELECT snapshot_id FROM {schema_name}.{t} WHERE load_id = ?"
        for t in (TRIPS, QUARANTINE, LOAD_LOG)
        if table_exists(lake.con, lake.alias, schema_name, t)
    ]
    if not parts:
        return []
    rows = lake.con.execute(
        f"SELECT DISTINCT snapshot_id FROM ({' UNION ALL '.join(parts)}) ORDER BY 1", [load_id] * len(parts)
    ).fetchall()
    return [int(r[0]) for r in rows]


def _commit(
    lake: Lake,
    ep: Endpoints,
    todo: list[SourceFile],
    superseded: list[Replaced],
    mode: str,
    schema_name: str,
    by_table: dict[str, list],
    written: list,
    zones_path: Path,
    landed: dict,
    load_id: str,
    started: float,
    result: LoadResult,
    fault: str | None,
) -> int:
    """Register every written file, the DDL, zones and load_log in ONE DuckLake transaction: one snapshot, whose id
    is returned (its commit carries a token in commit_extra_info, with the load's id, mode and file count)."""
    con = lake.con
    q = schema_name
    con.execute("BEGIN TRANSACTION")
    try:
        # plan again inside the transaction: a load that committed the same files meanwhile wins, this one stops
        todo_now, _, superseded_now = plan(lake, todo, mode, schema_name)
        if [f.sha256 for f in todo_now] != [f.sha256 for f in todo] or superseded_now != superseded:
            raise KitError(
                "another load committed some of these files while this one ran; nothing was registered",
                "run the load again: it skips what is already there",
            )
        existing = frozenset(t for _s, t in tables(con, lake.alias, q))
        for stmt in ddl_statements(q, existing):
            con.execute(stmt)
        # per file, not per load: a load_log row is one file's figures, so the rows and log rows of the earlier load's
        # other files stay, and stay true (`verify.replace_kept_other_periods` checks it after the commit)
        for r in superseded:
            for tbl in (TRIPS, QUARANTINE, LOAD_LOG):
                con.execute(f"DELETE FROM {q}.{tbl} WHERE load_id = ? AND source_file = ?", [r.load_id, r.source_file])
        for tbl, rows in by_table.items():
            if rows:
                con.execute(
                    "CALL ducklake_add_data_files(?, ?, ?, schema => ?)", [lake.alias, tbl, [r.path for r in rows], q]
                )
        write_zones(con, q, zones_path)
        for f in todo:
            fr = FileResult(f, raw_uri=landed[f.path], status="loaded", load_id=load_id)
            counts = dict(
                con.execute(
                    f"SELECT 'accepted', count(*) FROM {q}.{TRIPS} WHERE load_id = ? AND source_file = ? "
                    f"UNION ALL SELECT 'rejected', count(*) FROM {q}.{QUARANTINE} WHERE load_id = ? AND source_file = ?",
                    [load_id, f.path.name, load_id, f.path.name],
                ).fetchall()
            )
            fr.rows_accepted, fr.rows_rejected = int(counts["accepted"]), int(counts["rejected"])
            fr.rows_read = fr.rows_accepted + fr.rows_rejected
            fr.data_files = sum(1 for r in written if r.source_file == f.path.name)
            if f.rows is not None and fr.rows_read != f.rows:
                raise KitError(
                    f"{f.path.name}: {fr.rows_read} rows reached the lake but the file holds {f.rows}",
                    "this is a bug in the load; the lake was left unchanged",
                )
            result.files.append(fr)
            con.execute(
                f"INSERT INTO {q}.{LOAD_LOG} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, to_timestamp(?)::TIMESTAMP, ?)",
                [
                    load_id,
                    f.kind,
                    f.path.name,
                    fr.raw_uri,
                    f.sha256,
                    f.period,
                    mode,
                    fr.rows_read,
                    fr.rows_accepted,
                    fr.rows_rejected,
                    fr.data_files,
                    started,
                    round(time.time() - started, 3),
                ],
            )
        token = uuid.uuid4().hex  # in the commit: whether it landed is asked of the lake, never guessed
        extra = json.dumps({"commit": token, "load": load_id, "mode": mode, "files": len(todo)})
        con.execute(
            "CALL ducklake_set_commit_message(?, ?, ?, extra_info => ?)",
            [lake.alias, AUTHOR, commit_message_of(load_id, len(todo), mode), extra],
        )
        if fault == "kill-before-commit":
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            con.execute("COMMIT")
        except duckdb.Error as exc:  # e.g. a conflict with another writer that retries could not resolve
            rollback_quietly(con)
            return _commit_fate(lake, token, exc)
    except BaseException:
        rollback_quietly(con)
        raise
    return snapshot_with_token(lake, token, last_committed_snapshot(lake), extra)


def _commit_fate(lake: Lake, token: str, exc: duckdb.Error) -> int:
    """After the load's COMMIT raised: the snapshot it made when its token is in the lake (the error came after it
    landed: a success), else a KitError saying what is known. Running the load again is safe either way: it skips
    the files the lake already registers."""
    why = first_line(exc)
    try:
        landed = snapshot_of_token(lake, token)
    except Exception as lookup:  # noqa: BLE001 - the catalog cannot say either
        raise KitError(
            f"the commit failed ({why}) and the lake could not say whether it landed ({first_line(lookup)})",
            "run `status`, then the load again: it skips the files the lake already registers, so it cannot land twice",
        ) from None
    if landed is None:
        raise KitError(
            f"the commit failed and did not land (its token is not in the lake): nothing was registered and the lake "
            f"is unchanged ({why})",
            "run the load again: it skips what is already there",
        )
    return landed


def spark_job_failed(exc: BaseException, ep: Endpoints) -> KitError:
    """Why the Spark job failed, with the fix that works: the input is checked before anything is landed
    (sources.describe_file), so a failure here is most often a service that went away mid-load: asked, not
    guessed."""
    line = spark_error_line(exc)
    done = "nothing was registered and the lake is unchanged"
    try:
        s3.list_buckets(ep.s3)
    except KitError as down:
        return KitError(
            f"the Spark job failed because the lake's S3 server stopped answering ({down.what}); {done}",
            "run `up` (it restarts what is down), then the same load again",
        )
    return KitError(
        f"the Spark job failed, {done} ({line})",
        "see logs/spark.log in the state folder for Spark's own account; fix what it names and run the load again",
    )


def spark_error_line(exc: BaseException) -> str:
    """The most telling line of a Spark failure: the Python or Spark error class, not the JVM stack."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("RuntimeError", "ValueError", "duckdb.", "_duckdb.", "KitError", "pyarrow.")):
            return ln[:300]
    for ln in lines:
        if ln.startswith("[") or "Error" in ln or "Exception" in ln:
            return ln[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]


def write_zones(con, schema: str, zones_path: Path) -> None:
    """Make `schema.zones` hold the lookup file's rows, changing no row that is already right: the table gets only
    the file's rows it lacks, and is rewritten whole only when it holds a row the file does not (a zone renamed, a
    row added by hand). The lookup rarely changes, and a load that deleted and inserted it whole made every reader
    of `zones` see a change (a pipeline's incremental node built in full, a dynamic table's join netted 265 deletes
    against 265 inserts). Runs inside the load's transaction."""
    source = "SELECT LocationID, Borough, Zone, service_zone FROM read_csv(?, header = true)"
    table = f"{schema}.{ZONES}"
    extra = con.execute(
        f"SELECT count(*) FROM (SELECT * FROM {table} EXCEPT ALL {source})", [str(zones_path)]
    ).fetchone()[0]
    if extra:
        con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} {source}", [str(zones_path)])
    else:  # the table is part of the file (as multisets): add what it lacks, if anything
        con.execute(f"INSERT INTO {table} {source} EXCEPT ALL SELECT * FROM {table}", [str(zones_path)])


def build_frame(spark, files: list[SourceFile], zones_path: Path, load_id: str):
    """One DataFrame over all files of a load: each conformed from its own variant, flagged against its own
    period, with derived columns and lineage (load_id, source_file), in the lake's column order."""
    from ducklake_kit.taxi import transforms as tr  # pyspark: only when a load runs

    zones_df = tr.read_zones(spark, zones_path)
    frames = []
    for f in files:
        raw = tr.read_trips(spark, f.path)
        flagged = tr.flag_quality(tr.conform(raw.df, raw.variant), f.year, f.month)
        frames.append(
            tr.derive(flagged, zones_df).select(
                *[c for c, _ in trips_columns() if c not in ("load_id", "source_file")],
                "reject_reason",
                *_lineage(load_id, f.path.name),
            )
        )
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def _lineage(load_id: str, source_file: str) -> list:
    from pyspark.sql import functions as F  # pyspark: only when a load runs

    return [F.lit(load_id).alias("load_id"), F.lit(source_file).alias("source_file")]
