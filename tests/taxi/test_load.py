"""The PySpark load against the real stack: figures equal the source, one snapshot per load, idempotent,
atomic under a kill, no duplicates under task retries, bad files refused with the lake unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms import s3
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import flow

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT.parent / "shared" / "tlc-samples"
SAMPLE_2025_02 = SAMPLES / "yellow_tripdata_2025-02_random5000.parquet"
ROWS = 4000  # per synthetic month: small, the figures are checked exactly anyway


def _lake_state(stack) -> tuple[int, int, int]:
    """(latest snapshot, trips rows, quarantine rows): what must not move when a load fails."""
    with Lake(stack.platform.endpoints()) as lake:
        snap = lake.current_snapshot()
        tables = {
            r[0]
            for r in lake.con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' AND schema_name = 'main'"
            ).fetchall()
        }
        trips = lake.scalar("SELECT count(*) FROM trips") if "trips" in tables else 0
        quarantine = lake.scalar("SELECT count(*) FROM quarantine") if "quarantine" in tables else 0
    return snap, trips, quarantine


def _load(stack, **kw):
    return flow.load_checked(Kit.on(stack.platform, stack.state), flow.LoadSpec(**kw))


def _cli_load(stack, *args, env_extra=None):
    env = {**os.environ, **stack.env, **(env_extra or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / "ducklake_test.py"), "load", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_two_synthetic_months_load_checked_in_one_snapshot_and_rerun_is_a_no_op(stack):
    before = _lake_state(stack)[0]
    result, checks = _load(stack, source="synthetic", months="2023-01..2023-02", rows_per_month=ROWS, seed=7)
    assert checks.ok, [c.as_dict() for c in checks.failed]
    assert result.snapshot_id == before + 1
    assert [(f.source.period, f.status, f.rows_read) for f in result.files] == [
        ("2023-01", "loaded", ROWS),
        ("2023-02", "loaded", ROWS),
    ]
    assert all(
        f.rows_rejected > 0 and f.rows_accepted > 0 for f in result.files
    )  # the generator's quirks are quarantined
    with Lake(stack.platform.endpoints()) as lake:
        # partitioned as DuckLake lays it out, and the log has one row per file with the snapshot's rows
        paths = [
            r[0] for r in lake.con.execute("SELECT data_file FROM ducklake_list_files('lake', 'trips')").fetchall()
        ]
        assert any("/pickup_year=2023/pickup_month=1/" in p for p in paths) and all(
            p.startswith("s3://lake/main/trips/") for p in paths
        )
        log = lake.con.execute(
            "SELECT period, rows_read, rows_accepted + rows_rejected, snapshot_id FROM load_log "
            "WHERE load_id = ? ORDER BY period",
            [result.load_id],
        ).fetchall()
        assert log == [("2023-01", ROWS, ROWS, result.snapshot_id), ("2023-02", ROWS, ROWS, result.snapshot_id)]
        # its commit says which load made it, with a token of its own (what a COMMIT that raised is looked up by)
        author, extra = lake.con.execute(
            "SELECT author, commit_extra_info FROM ducklake_snapshots('lake') WHERE snapshot_id = ?",
            [result.snapshot_id],
        ).fetchone()
        extra = json.loads(extra)
        assert author == "ducklake-kit" and (extra["load"], extra["files"], len(extra["commit"])) == (
            result.load_id,
            2,
            32,
        )
        assert lake.scalar("SELECT count(*) FROM zones") == 265
    again, checks = _load(stack, source="synthetic", months="2023-01..2023-02", rows_per_month=ROWS, seed=7)
    assert checks.ok and again.snapshot_id is None
    assert [f.status for f in again.files] == ["skipped", "skipped"]
    assert _lake_state(stack)[0] == result.snapshot_id


@pytest.mark.skipif(not SAMPLE_2025_02.exists(), reason="the real TLC samples (../shared/tlc-samples) are not here")
def test_a_real_tlc_sample_loads_with_figures_equal_to_the_source(stack):
    result, checks = _load(stack, source="files", paths=[str(SAMPLE_2025_02)])
    assert checks.ok, [c.as_dict() for c in checks.failed]
    (fr,) = result.files
    assert (fr.rows_read, fr.rows_accepted + fr.rows_rejected) == (5000, 5000)
    with Lake(stack.platform.endpoints()) as lake:
        # one row checked value by value against pyarrow's own reading of the file
        src = pq.read_table(SAMPLE_2025_02).slice(0, 1).to_pylist()[0]
        got = lake.con.execute(
            "SELECT pickup_at, dropoff_at, total_amount, pu_location_id, cbd_congestion_fee FROM "
            "(FROM trips UNION ALL BY NAME FROM quarantine) WHERE source_file = ? AND pickup_at = ? AND dropoff_at = ? "
            "AND total_amount = ?",
            [SAMPLE_2025_02.name, src["tpep_pickup_datetime"], src["tpep_dropoff_datetime"], src["total_amount"]],
        ).fetchall()
        assert (
            src["tpep_pickup_datetime"],
            src["tpep_dropoff_datetime"],
            src["total_amount"],
            src["PULocationID"],
            src["cbd_congestion_fee"],
        ) in got


def test_replace_swaps_a_month_in_one_snapshot(stack):
    _load(stack, source="synthetic", months="2022-06", rows_per_month=ROWS, seed=1)
    _result, checks = _load(
        stack, source="synthetic", months="2022-06", rows_per_month=ROWS // 2, seed=1, mode="replace"
    )
    assert checks.ok, [c.as_dict() for c in checks.failed]
    with Lake(stack.platform.endpoints()) as lake:
        n = lake.scalar(
            "SELECT count(*) FROM (FROM trips UNION ALL BY NAME FROM quarantine) WHERE source_file LIKE '%2022-06%'"
        )
        assert n == ROWS // 2
        assert lake.scalar("SELECT count(*) FROM load_log WHERE period = '2022-06'") == 1
    with pytest.raises(KitError, match="already loaded from different content"):
        _load(stack, source="synthetic", months="2022-06", rows_per_month=ROWS, seed=1)  # skip mode refuses


def test_a_load_killed_before_commit_leaves_the_lake_as_it_was(stack, local_only):
    before = _lake_state(stack)
    proc = _cli_load(
        stack,
        "--source",
        "synthetic",
        "--months",
        "2021-03",
        "--rows-per-month",
        str(ROWS),
        env_extra={"DUCKLAKE_FAULT": "kill-before-commit"},
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert _lake_state(stack) == before  # no snapshot, no orphan rows
    result, checks = _load(stack, source="synthetic", months="2021-03", rows_per_month=ROWS)
    assert checks.ok and result.snapshot_id == before[0] + 1 and result.files[0].rows_read == ROWS


@pytest.fixture(scope="module")
def retried_json_load(stack) -> tuple[subprocess.CompletedProcess, str]:
    """A CLI load with --json whose Spark tasks each fail their first attempt (local[2,2]: two attempts allowed; the
    fault fails each first attempt after it wrote its files), and what the JVM added to its log meanwhile. Two tests
    read it: one load (a JVM of its own, the slowest part of either) instead of two."""
    log = stack.home / "logs" / "spark.log"
    before = log.read_text() if log.exists() else ""
    proc = _cli_load(
        stack,
        "--source",
        "synthetic",
        "--months",
        "2021-04",
        "--rows-per-month",
        str(ROWS),
        "--spark-master",
        "local[2,2]",
        "--json",
        env_extra={"DUCKLAKE_FAULT": "fail-first-task-attempt"},
    )
    return proc, log.read_text()[len(before) :]


def test_a_retried_spark_task_does_not_duplicate_rows(stack, local_only, retried_json_load):
    proc, _log = retried_json_load
    assert proc.returncode == 0, proc.stderr[-3000:]
    with Lake(stack.platform.endpoints()) as lake:
        n = lake.scalar(
            "SELECT count(*) FROM (FROM trips UNION ALL BY NAME FROM quarantine) WHERE source_file LIKE '%2021-04%'"
        )
        registered = {
            r[0] for r in lake.con.execute("SELECT data_file FROM ducklake_list_files('lake', 'trips')").fetchall()
        }
    assert n == ROWS
    # the failed first attempts did write files: they are in the bucket but not in the lake (proof the retry ran)
    ep = stack.platform.endpoints()
    listing = s3.client(ep.s3).list_objects_v2(Bucket="lake", Prefix="main/trips/pickup_year=2021/pickup_month=4/")
    on_s3 = {f"s3://lake/{o['Key']}" for o in listing.get("Contents", [])}
    assert on_s3 - registered, "no orphan file: the injected task failure never happened"
    assert registered & on_s3


def test_a_failed_load_is_one_line_and_the_jvms_own_output_goes_to_the_log(stack, local_only):
    # local[2,1]: one attempt per task, so the injected failure of the first attempt fails the Spark job
    before = _lake_state(stack)
    proc = _cli_load(
        stack,
        "--source",
        "synthetic",
        "--months",
        "2021-05",
        "--rows-per-month",
        str(ROWS),
        "--spark-master",
        "local[2,1]",
        env_extra={"DUCKLAKE_FAULT": "fail-first-task-attempt"},
    )
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the Spark job failed"), proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr  # "WARNING: Using incubator modules" and log4j's lines
    assert "incubator" in (stack.home / "logs" / "spark.log").read_text()  # kept, in the log
    assert _lake_state(stack) == before


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = tmp_path / "good"
    good.mkdir()
    from ducklake_kit.taxi import synthetic

    src = synthetic.generate_month(good, 2020, 5, 500).path
    truncated = tmp_path / "yellow_tripdata_2020-05_truncated.parquet"
    truncated.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    corrupt = tmp_path / "yellow_tripdata_2020-05_corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + os.urandom(2000) + b"PAR1")
    unknown = tmp_path / "yellow_tripdata_2020-05_unknown.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), unknown)
    # issue 16: text that is not a number in fare_amount was landed in raw first, then failed the Spark job with a
    # multi-kilobyte error; a Boolean column where a number belongs, the same
    table = pq.read_table(src)
    i = table.schema.get_field_index("fare_amount")
    text = table.column(i).cast(pa.string()).to_pylist()
    text[3] = "twelve"
    not_a_number = tmp_path / "yellow_tripdata_2020-05_text.parquet"
    pq.write_table(table.set_column(i, "fare_amount", pa.array(text)), not_a_number)
    wrong_type = tmp_path / "yellow_tripdata_2020-05_bool.parquet"
    pq.write_table(table.set_column(i, "fare_amount", pa.array([True] * table.num_rows)), wrong_type)
    return {
        "truncated": truncated,
        "corrupt": corrupt,
        "unknown": unknown,
        "not_a_number": not_a_number,
        "wrong_type": wrong_type,
    }


def _raw_objects(stack) -> set[str]:
    listing = s3.client(stack.platform.endpoints().s3).list_objects_v2(Bucket="raw")
    return {o["Key"] for o in listing.get("Contents", [])}


@pytest.mark.parametrize(
    "kind, message",
    [
        ("truncated", "is not a readable Parquet file"),
        ("corrupt", "is not a readable Parquet file"),
        ("unknown", "unknown"),
        ("not_a_number", "column fare_amount holds 1 value(s) that are not a number (e.g. 'twelve')"),
        ("wrong_type", "column fare_amount is bool, but the load needs a number there"),
    ],
)
def test_bad_files_get_one_clear_error_and_leave_the_lake_unchanged(stack, tmp_path, kind, message):
    path = _bad_files(tmp_path)[kind]
    before, raw_before = _lake_state(stack), _raw_objects(stack)
    proc = _cli_load(stack, "--source", "files", "--path", str(path))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and message.lower() in errors[0].lower(), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no stack, no JVM output
    assert _lake_state(stack) == before and _raw_objects(stack) == raw_before  # nothing landed either


def test_numbers_written_as_text_still_load(stack, tmp_path):
    # the check before landing refuses only what Spark would fail on: "12.5" in a text column is a number
    from ducklake_kit.taxi import synthetic

    (tmp_path / "gen").mkdir()
    src = synthetic.generate_month(tmp_path / "gen", 2013, 6, 300).path
    table = pq.read_table(src)
    i = table.schema.get_field_index("fare_amount")
    as_text = tmp_path / "yellow_tripdata_2013-06_text.parquet"
    pq.write_table(table.set_column(i, "fare_amount", table.column(i).cast(pa.string())), as_text)
    result, checks = _load(stack, source="files", paths=[str(as_text)])
    assert checks.ok and result.files[0].rows_read == 300, [c.as_dict() for c in checks.failed]


def test_no_java_is_found_before_anything_is_landed(stack, tmp_path):
    raw_before, before = _raw_objects(stack), _lake_state(stack)
    proc = _cli_load(
        stack,
        "--source",
        "synthetic",
        "--months",
        "2021-06",
        "--rows-per-month",
        "500",
        env_extra={"JAVA_HOME": str(tmp_path), "PATH": str(tmp_path)},
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stderr.startswith(
        "Error: Spark needs Java 17+ and no java was found (JAVA_HOME, PATH), so nothing "
        "was landed or loaded. Try: install Java 17+"
    ), proc.stderr
    assert _raw_objects(stack) == raw_before and _lake_state(stack) == before


@pytest.mark.parametrize(
    "args, message",
    [
        # issue 16: 0 made an empty snapshot and load_log row that then refused the real load; -5 named `chunk_rows`
        (["--rows-per-month", "0"], "Error: --rows-per-month must be at least 1 (got 0)."),
        (["--rows-per-month", "-5"], "Error: --rows-per-month must be at least 1 (got -5)."),
        (["--months", "1999-01"], "Error: the TLC's yellow taxi records start in 2009-01, so 1999-01 has no trips."),
        (["--months", "2099-01"], "Error: 2099-01 is in the future."),
    ],
)
def test_bad_load_options_are_one_clear_line_before_anything_changes(stack, cli, args, message):
    before = _lake_state(stack)
    months = [] if "--months" in args else ["--months", "2024-01"]
    result = cli(stack.env, "load", "--source", "synthetic", *months, *args)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert _lake_state(stack) == before


def test_load_json_stdout_is_json_alone_the_jvm_writes_to_its_log(retried_json_load):
    # issue 16: the JVM's "WARN Unable to load native-hadoop library" came first on stdout, before the JSON (this
    # load's JVM also logs its failed task attempts: none of that may reach stdout either)
    proc, log = retried_json_load
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "ok" and [f["status"] for f in doc["result"]["files"]] == ["loaded"]
    assert "native-hadoop" not in proc.stdout + proc.stderr
    assert "native-hadoop" in log  # the JVM still says it, where logs belong


def test_another_writer_committing_during_the_load_is_no_failure(stack):
    # issue 16: the check counted the snapshots the whole lake gained, so any other writer made a good load fail
    ep = stack.platform.endpoints()
    stop, commits = threading.Event(), []

    def other_writer() -> None:
        with Lake(ep) as lake:
            lake.run("CREATE TABLE IF NOT EXISTS main.load_side_writer (i INTEGER)")
            while not stop.is_set():
                lake.run(f"INSERT INTO main.load_side_writer VALUES ({len(commits)})")
                commits.append(1)
                time.sleep(0.5)

    writer = threading.Thread(target=other_writer)
    writer.start()
    try:
        result, checks = _load(stack, source="synthetic", months="2020-05", rows_per_month=ROWS, seed=3)
    finally:
        stop.set()
        writer.join()
    assert checks.ok, [c.as_dict() for c in checks.failed]
    # the other writer did commit between the load's start and its commit: the old count would have said > 1
    assert result.snapshot_id - result.previous_snapshot > 1 and commits
    names = [c.name for c in checks.checks]
    assert "the load made exactly one snapshot" in names and "every row the load wrote is in that snapshot" in names


@pytest.mark.parametrize(
    "months, message",
    [
        ("2024-13", "no such month: 2024-13"),
        ("2024-03..2024-01", "ends before it starts"),
        ("March", "cannot read the months 'March'"),
    ],
)
def test_bad_months_are_one_clear_error(stack, cli, months, message):
    result = cli(stack.env, "load", "--source", "synthetic", "--months", months)
    assert result.exit_code == 3 and message in result.stderr, result.output


def test_a_dropped_trips_table_is_named_with_the_ways_back_and_time_travel_restores_it(stack, tmp_path):
    """After `DROP TABLE trips`, a load in skip mode used to skip the files load_log lists and then fail its checks
    with "trips does not exist ... run `status`". It now says the table was dropped, and the time travel it suggests
    brings the rows back. In a schema of its own (the shared lake's main stays as it is)."""
    from ducklake_kit.taxi.load import LOAD_LOG, QUARANTINE, TRIPS, ddl_statements, plan
    from ducklake_kit.taxi.sources import SourceFile

    schema = "dropped_test"
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        for stmt in ddl_statements(schema):
            lake.run(stmt)
        lake.run(f"INSERT INTO {schema}.{TRIPS} (vendor_id, source_file) VALUES (1, 'a.parquet'), (2, 'a.parquet')")
        lake.run(
            f"INSERT INTO {schema}.{LOAD_LOG} (load_id, sha256, period, source_file) VALUES ('l1', 'abc', '2020-01', 'a.parquet')"
        )
        source = SourceFile(tmp_path / "a.parquet", "files", 2020, 1, "abc", 2)
        todo, skipped, _ = plan(lake, [source], "skip", schema)
        assert not todo and len(skipped) == 1  # as loaded: skipped
        lake.run(f"DROP TABLE {schema}.{TRIPS}")
        with pytest.raises(KitError) as info:
            plan(lake, [source], "skip", schema)
        err = info.value
        assert f"the table {schema}.{TRIPS} was dropped" in err.what and "load --mode replace" in err.fix
        restore = err.fix.split('sql "')[1].split('"')[0]
        lake.run(restore)  # the fix it gives works
        assert lake.scalar(f"SELECT count(*) FROM {schema}.{TRIPS}") == 2
        assert plan(lake, [source], "skip", schema)[1]  # and the load skips the file again, correctly
        lake.run(f"DROP TABLE {schema}.{QUARANTINE}")
        todo, _, _ = plan(lake, [source], "replace", schema)  # replace lands the file again: no error
        assert todo == [source]
        lake.run(f"DROP SCHEMA {schema} CASCADE")


def test_a_failed_spark_job_names_the_s3_server_when_it_is_the_cause(stack):
    # issue 16: rclone killed mid-load gave "Try: fix the input (e.g. a value that is not a number)"
    import dataclasses

    from ducklake_kit.platforms.procs import free_port
    from ducklake_kit.taxi.load import spark_job_failed

    ep = stack.platform.endpoints()
    failure = RuntimeError("Py4JJavaError: An error occurred while calling o123.collectToPython.")
    alive = spark_job_failed(failure, ep)
    assert "spark.log" in alive.fix and "up" not in alive.fix.split()
    gone = dataclasses.replace(ep, s3=dataclasses.replace(ep.s3, endpoint=f"127.0.0.1:{free_port()}"))  # nobody there
    dead = spark_job_failed(failure, gone)
    assert "S3 server stopped answering" in dead.what and "is not reachable" in dead.what
    assert dead.fix.startswith("run `up`") and "the lake is unchanged" in dead.what
