"""Benchmarks: commands that print measured figures (never timed tests).

`--suite load`: the same generated trips through the same Spark job, written (a) into DuckLake (executors
write Parquet to S3, the driver registers the files in one transaction) and (b) as plain Parquet by Spark's
own writer into a local folder, in one run. Reported: rows/s of each, the ratio a/b, and the peak memory
(RSS) of the driver: the Python process and the JVM (which, in local mode, also hosts the executors).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average
from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.state import State
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import PARTITION_KEYS, build_frame, run_load

ROWS_PER_FILE = 2_500_000  # a TLC month holds about 3M trips: bigger N means more months
GOAL_RATIO = 0.8  # DuckLake's rows/s at least 80% of plain Parquet's


@dataclass
class PathFigures:
    """One write path: time, rate, and the driver's peak memory (Python; the JVM, which hosts the executors locally)."""

    seconds: float
    rows_per_s: int
    driver_python_peak_mib: int
    driver_jvm_peak_mib: int
    driver_python_growth_mib: int
    snapshot_id: int | None = None  # DuckLake: the load's snapshot
    raw_landing_s: float | None = None  # DuckLake: landing the raw files (part of neither path's time)
    bytes: int | None = None  # plain Parquet: what Spark wrote

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("snapshot_id", "raw_landing_s")}


@dataclass
class LoadFigures:
    rows: int
    files: int
    machine: Machine
    ducklake: PathFigures
    parquet: PathFigures
    ratio_ducklake_to_parquet: float
    goal_ratio: float = GOAL_RATIO

    @property
    def goal_met(self) -> bool:
        return self.ratio_ducklake_to_parquet >= self.goal_ratio

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": self.files, **self.machine.as_dict(), "ducklake": self.ducklake.as_dict(),
                "parquet": self.parquet.as_dict(), "ratio_ducklake_to_parquet": self.ratio_ducklake_to_parquet,
                "goal_ratio": self.goal_ratio}


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
    def phase(self) -> Iterator["PeakMemory"]:
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


def _plain_parquet(spark, files, zones_path: Path, out: Path) -> None:
    """Path (b): the same frame, written by Spark's own Parquet writer in one pass (accepted and rejected
    rows side by side, partitioned like the lake)."""
    from pyspark.sql import functions as F  # pyspark loads only when a Spark job runs

    df = build_frame(spark, files, zones_path, "bench-parquet")
    df = df.withColumn("tbl", F.when(F.col("reject_reason").isNull(), F.lit("trips")).otherwise(F.lit("quarantine")))
    df.write.mode("overwrite").partitionBy("tbl", *PARTITION_KEYS).parquet(str(out))


def bench_load(platform: Platform, state: State, rows: int, on_step: Callable[[str], None] = lambda _m: None) -> LoadFigures:
    if rows < 1000:
        raise KitError(f"--rows {rows} is too small to measure", "use --rows 1000000 or more")
    ep = platform.endpoints()
    load_before = load_average()
    cache = state.cache_dir
    n_files = math.ceil(rows / ROWS_PER_FILE)
    per_file = rows // n_files
    on_step(f"generating {n_files} synthetic month(s) of {per_file:,} rows (cached after the first run)")
    files = sources.synthetic_files(cache, _months(n_files), per_file, seed=42)
    total = sum(f.rows or 0 for f in files)
    zones_path, _ = sources.zone_lookup(cache)
    spark = spark_mod.session()
    memory = PeakMemory()
    out = Path(tempfile.mkdtemp(prefix="ducklake-bench-parquet-"))
    try:
        on_step("warm-up: a small load through both paths (JIT, Python workers, extensions)")
        warm = sources.synthetic_files(cache, [(2019, 1)], 20_000, seed=42)
        _plain_parquet(spark, warm, zones_path, out / "warm")
        run_load(ep, warm, zones_path=zones_path, zones_note="", source_note="bench warm-up", mode="replace",
                 schema_name=BENCH_SCHEMA)

        on_step(f"(b) plain Parquet with Spark's writer: {total:,} rows")
        with memory.phase() as m:
            t = time.perf_counter()
            _plain_parquet(spark, files, zones_path, out / "run")
            parquet_s = time.perf_counter() - t
        parquet_mem = (m.python_peak, m.jvm_peak, m.python_peak - m.python_start)
        parquet_bytes = sum(p.stat().st_size for p in (out / "run").rglob("*.parquet"))

        on_step(f"(a) DuckLake: executors write to S3, one transaction registers the files: {total:,} rows")
        with memory.phase() as m:
            result = run_load(ep, files, zones_path=zones_path, zones_note="", source_note="bench", mode="replace",
                              schema_name=BENCH_SCHEMA)
        lake_s = result.timings["spark"] + result.timings["commit"]  # landing the raw files is not part of either path
        lake_mem = (m.python_peak, m.jvm_peak, m.python_peak - m.python_start)
        loaded = sum(f.rows_read for f in result.files)
        if loaded != total:
            raise KitError(f"the DuckLake path loaded {loaded:,} rows of {total:,}", "this is a bug; see the load's checks")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    lake_rate, parquet_rate = total / lake_s, total / parquet_s
    def mib(n: int) -> int:
        return round(n / 2**20)

    return LoadFigures(
        rows=total, files=len(files), machine=Machine.since(load_before),
        ducklake=PathFigures(round(lake_s, 2), round(lake_rate), mib(lake_mem[0]), mib(lake_mem[1]), mib(lake_mem[2]),
                             snapshot_id=result.snapshot_id, raw_landing_s=result.timings.get("raw")),
        parquet=PathFigures(round(parquet_s, 2), round(parquet_rate), mib(parquet_mem[0]), mib(parquet_mem[1]), mib(parquet_mem[2]),
                            bytes=parquet_bytes),
        ratio_ducklake_to_parquet=round(lake_rate / parquet_rate, 3))
