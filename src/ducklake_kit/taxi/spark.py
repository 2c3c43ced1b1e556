"""The SparkSession: `local[*]` by default, small local config; `--spark-master` or SPARK_REMOTE for a cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from collections.abc import Iterator
from contextlib import contextmanager

from ducklake_kit.errors import KitError, first_line

LOCAL_CONF = {
    "spark.ui.enabled": "false",  # no web UI: nothing to open, one less port
    "spark.ui.showConsoleProgress": "false",  # the kit prints its own steps; no progress bars in logs
    "spark.sql.shuffle.partitions": "4",  # 2 cores: the default 200 would be 200 tiny tasks
    "spark.driver.memory": "1g",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "20000",  # rows per Arrow batch handed to the writer
    "spark.sql.session.timeZone": "UTC",  # trips are TIMESTAMP_NTZ (wall clock); this only affects logs
    "spark.driver.extraJavaOptions": "-Dlog4j2.level=WARN",
}


@contextmanager
def jvm_output(log_path: Path | None = None) -> Iterator[None]:
    """Where the JVM writes, decided while it starts (it inherits this process's stdout and stderr then, and keeps
    them). With `log_path`, both go to that file (appended, 0600): "WARNING: Using incubator modules", log4j's
    "Unable to load native-hadoop library" and Spark's own warnings land in the log, so a failed load is one line
    on the terminal. Without, its stdout is this process's stderr, so nothing it prints lands in the JSON a
    `--json` command writes to stdout."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    log = None
    try:
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
        else:
            os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        if log is not None:
            os.close(log)


def session(master: str | None = None, app_name: str = "ducklake-kit", *, log_path: Path | None = None):
    """Start (or reuse) a SparkSession. Needs Java 17+ (checked by `doctor`). `log_path`: where the JVM's own output
    goes (see `jvm_output`)."""
    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE")
    # the executors' Python workers must be this interpreter: they import duckdb and the extension wheels
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        if remote and not master:
            return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
        url = master or os.environ.get("SPARK_MASTER", "local[*]")
        builder = SparkSession.builder.master(url).appName(app_name)
        for k, v in LOCAL_CONF.items():
            builder = builder.config(k, v)
        if url.startswith("local"):
            # loopback only, and no dependence on the host name resolving (containers, CI); SPARK_LOCAL_IP
            # also stops the JVM's "hostname resolves to a loopback address" warning at start
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
        with jvm_output(log_path):
            spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - JVM start failures surface as several exception types
        msg = first_line(exc)
        raise KitError(f"Spark did not start ({msg})", "run `doctor`: Spark 4 needs Java 17+ (JAVA_HOME or java on PATH)") from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark
