"""Benchmarks: commands that print measured figures (never timed tests).

`--suite load`: the same generated trips, for each size, in one run:
  (a)  Spark on local[*] -> DuckLake: conform, flag, derive; executors write Parquet to S3 with DuckDB, the driver
       registers the files in one transaction (the load itself, `run_load`, with its checks);
  (b)  the same Spark frame written as plain Parquet by Spark's own writer into a local folder;
  (c)  DuckDB alone, one process: the same rules (`bench.duckdb_load`), Parquet to the lake's S3, nothing registered;
  (a') the load of (a) on a standalone Spark cluster (master + 2 workers of 1 core), started for the run when
       `spark up` has not started one, and stopped afterwards only then.
Every side writes Snappy-compressed Parquet (DuckDB's and Spark's default codec). Reported: rows/s of each, the
ratios a/c, a'/a and a/b, the two goals, the driver's peak memory and the load average before each side.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average
from ducklake_kit.errors import EXIT_CHECK_FAILED, KitError
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.report import Reporter
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import PARTITION_KEYS, LoadInput, build_frame, run_load

ROWS_PER_FILE = 2_500_000  # a TLC month holds about 3M trips: bigger N means more months
DEFAULT_ROWS = (1_000_000, 10_000_000)
GOAL_ROWS = 10_000_000  # both goals are judged at this size
GOAL_A_TO_C = 0.15  # Spark -> DuckLake at least 15% of DuckDB alone
GOAL_CLUSTER_TO_LOCAL = 0.8  # the standalone cluster at least 80% of local[*] on the same cores
CLUSTER_WORKERS = 2
DUCKDB_FOLDER = "bench-duckdb-only"  # side (c)'s files, under the lake's data path; removed after each run
SIDES = ("a", "b", "c", "a_cluster")


@dataclass
class PathFigures:
    """One write path: time, rate, and the driver's peak memory (Python; the JVM, which hosts the executors locally)."""

    seconds: float
    rows_per_s: int
    driver_python_peak_mib: int
    driver_jvm_peak_mib: int
    driver_python_growth_mib: int
    load_average_before: float = 0.0  # 1-minute load average when this side started (the machine is shared)
    snapshot_id: int | None = None  # DuckLake: the load's snapshot
    raw_landing_s: float | None = None  # DuckLake: landing the raw files (part of no side's time)
    spark_s: float | None = None  # DuckLake: the Spark job (executors writing); the rest is the commit
    commit_s: float | None = None
    bytes: int | None = None  # plain Parquet, DuckDB alone: what was written

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("snapshot_id", "raw_landing_s")}


def _ratio(num: PathFigures | None, den: PathFigures | None) -> float | None:
    return round(num.rows_per_s / den.rows_per_s, 3) if num and den and den.rows_per_s else None


@dataclass
class SizeFigures:
    """One size: each side's figures (a', None when the cluster could not be used) and the ratios between them."""

    rows: int
    files: int
    sides: dict[str, PathFigures | None]

    @property
    def ratios(self) -> dict[str, float | None]:
        s = self.sides
        return {
            "a_to_c": _ratio(s["a"], s["c"]),
            "a_cluster_to_a": _ratio(s.get("a_cluster"), s["a"]),
            "a_to_b": _ratio(s["a"], s["b"]),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "files": self.files,
            "sides": {k: (v.as_dict() if v else None) for k, v in self.sides.items()},
            "ratios": self.ratios,
        }


@dataclass
class Goal:
    name: str
    ratio: str  # which ratio of SizeFigures.ratios
    at_least: float
    value: float | None  # None: not measured at GOAL_ROWS

    @property
    def met(self) -> bool | None:
        return None if self.value is None else self.value >= self.at_least

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ratio": self.ratio,
            "at_least": self.at_least,
            "rows": GOAL_ROWS,
            "value": self.value,
            "met": self.met,
        }


@dataclass
class LoadBench:
    sizes: list[SizeFigures]
    machine: Machine
    cluster: str  # how (a') ran: the cluster `spark up` had started, or one started (and stopped) by this run
    codecs: dict[str, str]

    @property
    def goals(self) -> list[Goal]:
        at = next((s for s in self.sizes if s.rows == GOAL_ROWS), None)
        return [
            Goal("Spark -> DuckLake / DuckDB alone", "a_to_c", GOAL_A_TO_C, at.ratios["a_to_c"] if at else None),
            Goal(
                "standalone cluster / local[*]",
                "a_cluster_to_a",
                GOAL_CLUSTER_TO_LOCAL,
                at.ratios["a_cluster_to_a"] if at else None,
            ),
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.machine.as_dict(),
            "cluster": self.cluster,
            "codecs": self.codecs,
            "sizes": [s.as_dict() for s in self.sizes],
            "goals": [g.as_dict() for g in self.goals],
        }


class PeakMemory:
    """Samples RSS of this process and of its JVM child every 50 ms; keeps the peaks of the current phase."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self._stop = threading.Event()
        self.python_peak = self.jvm_peak = 0
        self.python_start = self.jvm_start = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _jvm(self) -> psutil.Process | None:
        for child in self.me.children(recursive=True):
            try:
                if child.name() == "java":
                    return child
            except psutil.Error:
                continue
        return None

    def _run(self) -> None:
        jvm = None
        while not self._stop.is_set():
            try:
                self.python_peak = max(self.python_peak, self.me.memory_info().rss)
                jvm = jvm if jvm and jvm.is_running() else self._jvm()
                if jvm:
                    self.jvm_peak = max(self.jvm_peak, jvm.memory_info().rss)
            except psutil.Error:
                pass
            self._stop.wait(0.05)

    @contextmanager
    def phase(self) -> Iterator[PeakMemory]:
        """Peaks within the phase, and the RSS at its start (memory the process already held, e.g. from
        generating the data, is not growth caused by the load)."""
        self.python_peak = self.jvm_peak = 0
        jvm = self._jvm()
        self.python_start = self.me.memory_info().rss
        self.jvm_start = jvm.memory_info().rss if jvm else 0
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


def _months(n: int) -> list[tuple[int, int]]:
    return [(2024 + (i // 12), i % 12 + 1) for i in range(n)]


def bench_files(cache: Path, rows: int) -> list[sources.SourceFile]:
    """`rows` generated trips as months of at most ROWS_PER_FILE (cached: the same seed gives the same files)."""
    n_files = math.ceil(rows / ROWS_PER_FILE)
    return sources.synthetic_files(cache, _months(n_files), rows // n_files, seed=42)


def _plain_parquet(spark, files, zones_path: Path, out: Path) -> None:
    """Side (b): the same frame, written by Spark's own Parquet writer in one pass (accepted and rejected
    rows side by side, partitioned like the lake)."""
    from pyspark.sql import functions as F  # pyspark loads only when a Spark job runs

    df = build_frame(spark, files, zones_path, "bench-parquet")
    df = df.withColumn("tbl", F.when(F.col("reject_reason").isNull(), F.lit("trips")).otherwise(F.lit("quarantine")))
    df.write.mode("overwrite").partitionBy("tbl", *PARTITION_KEYS).parquet(str(out))


def _objects(ep: Endpoints, prefix: str) -> tuple[Any, str, list[dict[str, Any]]]:
    """(the S3 client, the bucket, every object under `prefix`, an s3://bucket/folder path)."""
    from ducklake_kit.platforms import s3

    bucket, _, key = prefix.removeprefix("s3://").partition("/")
    client = s3.client(ep.s3)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key.rstrip("/") + "/")
    return client, bucket, [o for page in pages for o in page.get("Contents", [])]


def remove_prefix(ep: Endpoints, prefix: str) -> int:
    """Delete every object under `prefix` (an s3://bucket/folder path): side (c)'s files. Returns how many."""
    client, bucket, objects = _objects(ep, prefix)
    for i in range(0, len(objects), 1000):  # delete_objects takes at most 1000 keys
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in objects[i : i + 1000]]})
    return len(objects)


def _mib(n: int) -> int:
    return round(n / 2**20)


def _figures(rows: int, seconds: float, m: PeakMemory, load_before: float, **extra: Any) -> PathFigures:
    return PathFigures(
        round(seconds, 2),
        round(rows / seconds),
        _mib(m.python_peak),
        _mib(m.jvm_peak),
        _mib(m.python_peak - m.python_start),
        round(load_before, 2),
        **extra,
    )


def _lake_side(
    kit: Kit, files, zones_path: Path, total: int, memory: PeakMemory, spark_master
) -> tuple[PathFigures, Any]:
    """(a) or (a'): the load itself, into the bench schema (replace: a re-run supersedes the last one's rows); its
    own progress is not reported (the bench says which side runs)."""
    before = os.getloadavg()[0]
    quiet = replace(kit, spark_master=spark_master, reporter=Reporter())
    with memory.phase() as m:
        result = run_load(quiet, LoadInput(files, zones_path, "", "bench"), mode="replace", schema_name=BENCH_SCHEMA)
    seconds = result.timings["spark"] + result.timings["commit"]  # landing the raw files is part of no side
    loaded = sum(f.rows_read for f in result.files)
    if loaded != total:
        raise KitError(f"the DuckLake path loaded {loaded:,} rows of {total:,}", "this is a bug; see the load's checks")
    return _figures(
        total,
        seconds,
        m,
        before,
        snapshot_id=result.snapshot_id,
        raw_landing_s=result.timings.get("raw"),
        spark_s=result.timings["spark"],
        commit_s=result.timings["commit"],
    ), result


def _check_same_counts(side: str, result, accepted: int, rejected: int) -> None:
    """The rows a side wrote, per table, against the load's own counts (computed by the lake in its commit)."""
    want = (sum(f.rows_accepted for f in result.files), sum(f.rows_rejected for f in result.files))
    if (accepted, rejected) != want:
        raise KitError(
            f"side ({side}) wrote {accepted:,} accepted and {rejected:,} rejected rows, the load "
            f"{want[0]:,} and {want[1]:,}",
            "the two implementations of the rules disagree: this is a bug",
            exit_code=EXIT_CHECK_FAILED,
        )


def _duckdb_side(ep: Endpoints, files, zones_path: Path, total: int, memory: PeakMemory, lake_result) -> PathFigures:
    from ducklake_kit.bench.duckdb_load import duckdb_load, output_prefix

    remove_prefix(ep, output_prefix(ep, DUCKDB_FOLDER))
    before = os.getloadavg()[0]
    try:
        with memory.phase() as m:
            t = time.perf_counter()
            out = duckdb_load(ep, files, zones_path, DUCKDB_FOLDER, lake_result.load_id)
            seconds = time.perf_counter() - t
        _check_same_counts("c", lake_result, out.rows_accepted, out.rows_rejected)
        written = _s3_bytes(ep, out.prefix)
    finally:
        remove_prefix(ep, output_prefix(ep, DUCKDB_FOLDER))
    return _figures(total, seconds, m, before, bytes=written)


def _s3_bytes(ep: Endpoints, prefix: str) -> int:
    return sum(o["Size"] for o in _objects(ep, prefix)[2])


def bench_load(kit: Kit, sizes: list[int] | tuple[int, ...] = DEFAULT_ROWS, cluster: bool = True) -> LoadBench:
    """Sides (a), (b), (c) on local[*] for each size, then (a') on the standalone cluster for each size.
    `cluster=False` leaves (a') out (its figures are None)."""
    sizes = list(sizes)
    for rows in sizes:
        if rows < 1000:
            raise KitError(f"--rows {rows} is too small to measure", "use --rows 1000000 or more")
    ep, say = kit.platform.endpoints(), kit.say
    load_before = load_average()
    cache = kit.state.cache_dir
    zones_path, _ = sources.zone_lookup(cache)
    inputs = []
    for rows in sizes:
        files = bench_files(cache, rows)
        say(f"{rows:,} rows: {len(files)} synthetic month(s) of {files[0].rows:,} rows (generated once, cached)")
        inputs.append((files, sum(f.rows or 0 for f in files)))
    memory = PeakMemory()
    local = spark_mod.target("local[*]")
    spark = spark_mod.session(local)
    out = Path(tempfile.mkdtemp(prefix="ducklake-bench-parquet-"))
    figures: list[SizeFigures] = []
    try:
        say("warm-up: a small load through every side (JIT, Python workers, extensions)")
        warm = sources.synthetic_files(cache, [(2019, 1)], 20_000, seed=42)
        _plain_parquet(spark, warm, zones_path, out / "warm")
        _, warm_result = _lake_side(kit, warm, zones_path, 20_000, memory, local)
        _duckdb_side(ep, warm, zones_path, 20_000, memory, warm_result)
        for files, total in kit.reporter.track(inputs, "bench --suite load: sizes", "sizes"):
            sides: dict[str, PathFigures | None] = {}
            say(f"(b) {total:,} rows: plain Parquet with Spark's writer")
            before = os.getloadavg()[0]
            with memory.phase() as m:
                t = time.perf_counter()
                _plain_parquet(spark, files, zones_path, out / "run")
                seconds = time.perf_counter() - t
            sides["b"] = _figures(
                total, seconds, m, before, bytes=sum(p.stat().st_size for p in (out / "run").rglob("*.parquet"))
            )
            shutil.rmtree(out / "run", ignore_errors=True)
            say(f"(a) {total:,} rows: Spark on local[*] -> DuckLake")
            sides["a"], result = _lake_side(kit, files, zones_path, total, memory, local)
            say(f"(c) {total:,} rows: DuckDB alone, the same rules, Parquet to the lake's S3")
            sides["c"] = _duckdb_side(ep, files, zones_path, total, memory, result)
            sides["a_cluster"] = None
            figures.append(SizeFigures(total, len(files), sides))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    how = "not run"
    if cluster:
        how = _cluster_sides(kit, inputs, figures, zones_path, memory)
    return LoadBench(
        figures,
        Machine.since(load_before),
        how,
        {
            "a": "snappy (DuckDB's default)",
            "b": "snappy (Spark's default)",
            "c": "snappy (DuckDB's default)",
            "a_cluster": "snappy (DuckDB's default)",
        },
    )


def _cluster_sides(kit: Kit, inputs, figures: list[SizeFigures], zones_path: Path, memory: PeakMemory) -> str:
    """(a') for every size on the standalone cluster: the one `spark up` started, else one started here and stopped
    afterwards (the session on it too)."""
    from ducklake_kit.platforms.spark_cluster import SparkCluster

    state, say = kit.state, kit.say
    cluster = SparkCluster(state)
    status = cluster.status()
    started = not (status.master_url and status.alive_workers > 0)
    if started:
        say(f"starting a standalone Spark cluster (master + {CLUSTER_WORKERS} workers of 1 core) for (a')")
        status = cluster.up("standalone", CLUSTER_WORKERS)
    how = f"{status.alive_workers} worker(s) of 1 core, " + (
        "started for this run and stopped after it" if started else "the cluster `spark up` started"
    )
    try:
        target = spark_mod.target("standalone", state)
        spark_mod.session(target)
        say("warm-up on the cluster: a small load (executors' JIT, Python workers, extensions)")
        warm = sources.synthetic_files(state.cache_dir, [(2019, 1)], 20_000, seed=42)
        _lake_side(kit, warm, zones_path, 20_000, memory, target)
        for (files, total), size in zip(inputs, figures):
            say(f"(a') {total:,} rows: Spark on the standalone cluster -> DuckLake")
            size.sides["a_cluster"], _ = _lake_side(kit, files, zones_path, total, memory, target)
    finally:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()  # its executors belong to the cluster: no application left behind on it
        if started:
            cluster.down()
    return how
