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
from pathlib import Path
from typing import Any

import psutil

from ducklake_kit.bench.results import BENCH_SCHEMA, load_average, machine
from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import Platform
from ducklake_kit.platforms.state import State
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import PARTITION_KEYS, build_frame, run_load

ROWS_PER_FILE = 2_500_000  # a TLC month holds about 3M trips: bigger N means more months


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


def bench_load(platform: Platform, state: State, rows: int, on_step: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
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
    return {
        "rows": total,
        "files": len(files),
        **machine(load_before),
        "ducklake": {"seconds": round(lake_s, 2), "rows_per_s": round(lake_rate), "snapshot_id": result.snapshot_id,
                     "driver_python_peak_mib": round(lake_mem[0] / 2**20), "driver_jvm_peak_mib": round(lake_mem[1] / 2**20),
                     "driver_python_growth_mib": round(lake_mem[2] / 2**20),
                     "raw_landing_s": result.timings.get("raw")},
        "parquet": {"seconds": round(parquet_s, 2), "rows_per_s": round(parquet_rate), "bytes": parquet_bytes,
                    "driver_python_peak_mib": round(parquet_mem[0] / 2**20), "driver_jvm_peak_mib": round(parquet_mem[1] / 2**20),
                    "driver_python_growth_mib": round(parquet_mem[2] / 2**20)},
        "ratio_ducklake_to_parquet": round(lake_rate / parquet_rate, 3),
        "goal_ratio": 0.8,
    }
