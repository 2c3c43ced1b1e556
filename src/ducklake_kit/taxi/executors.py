"""What the load's executors need, asked of them before anything is landed: one small Spark job whose tasks report,
from inside the executors' own Python, what the lake writer (`load.make_writer`) will need there:

- the kit's Python: pyarrow and pandas (mapInArrow), duckdb at the pinned version, the kit itself (the writer
  imports it), the DuckDB extension wheels (loaded from the executor's own site-packages);
- the S3 endpoint the lake's files go to (a TCP connection from the executor's host);
- the source files Spark reads by path (on a cluster of several machines, a shared folder at the same path).

A gap becomes one line naming what the executors lack, and the load stops with nothing landed or written.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.taxi.spark import connect_failure

PROBE_SCHEMA = "host string, python string, problem string"
WRITER_EXTENSIONS = ("httpfs",)  # the lake writer only writes Parquet to S3: it never reads the catalog
FIX = (
    "give every executor the kit's Python environment (`uv sync` of this project, or `pip install` of it with the "
    "same pins) and name it with PYSPARK_PYTHON in the driver's environment (a Spark Connect server's own); see "
    'docs/spark-cluster.md, "Taking the load to a real cluster"'
)


def make_probe(s3_host: str, s3_port: int, paths: list[str], duckdb_version: str) -> Callable[[Iterator], Iterator]:
    """A mapInArrow function that yields one row per task: (host, its Python, the first thing missing or '')."""

    def probe(batches: Iterator) -> Iterator:
        # imports inside: the function is shipped by value and must import nothing of the kit before it has checked
        # that the kit is there
        import os
        import socket
        import sys

        import pyarrow as pa

        for _ in batches:
            pass
        problem = ""
        try:
            import duckdb

            if duckdb.__version__ != duckdb_version:
                problem = f"duckdb {duckdb.__version__} (the lake needs {duckdb_version}, the version its extension wheels are built for)"
        except ImportError:
            problem = "the duckdb module"
        if not problem:
            try:
                from ducklake_kit.lake import load_statements
            except ImportError as exc:
                problem = f"the ducklake_kit package ({exc})"
        if not problem:
            try:
                con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
                for stmt in load_statements(WRITER_EXTENSIONS):
                    con.execute(stmt)
                con.close()
            except Exception as exc:  # noqa: BLE001 - any failure to load an extension is the finding
                problem = f"the DuckDB extension wheels ({str(exc).splitlines()[0][:200]})"
        if not problem:
            try:
                socket.create_connection((s3_host, s3_port), timeout=5).close()
            except OSError as exc:
                problem = f"a connection to the lake's S3 endpoint {s3_host}:{s3_port} ({exc.strerror or exc})"
        if not problem:
            missing = [p for p in paths if not os.path.exists(p)]
            if missing:
                problem = (
                    f"the source file {missing[0]} (Spark reads the sources by path: every executor must see "
                    "the state folder's cache at the same path)"
                )
        yield pa.RecordBatch.from_pydict(
            {"host": [socket.gethostname()], "python": [sys.executable], "problem": [problem]}
        )

    return probe


PROBE_TIMEOUT_S = float(os.environ.get("DUCKLAKE_EXECUTOR_PROBE_TIMEOUT", "180"))


def check_executors(
    spark,
    ep: Endpoints,
    paths: list[str],
    *,
    python: str | None = None,
    parallelism: int = 4,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> None:
    """Run the probe on the executors (a few tasks, so that on a cluster more than one executor answers); raise a
    KitError naming the first gap. `python`: the executors' Python as this driver told them (None: not known here,
    e.g. a Spark Connect server's). A cluster whose executors never take the tasks (its cores held by another
    application, executors that cannot reach this driver) is cancelled after `timeout_s` with one line."""
    import duckdb

    host, _, port = ep.s3.endpoint.rpartition(":")
    probe = make_probe(host.strip("[]"), int(port or 80), paths, duckdb.__version__)
    tag = f"ducklake-probe-{uuid.uuid4().hex[:8]}"
    timed_out = threading.Event()

    def cancel() -> None:
        timed_out.set()
        try:
            spark.interruptTag(tag)
        except Exception:  # noqa: BLE001 - the job may have ended meanwhile
            pass

    timer = threading.Timer(timeout_s, cancel)
    spark.addTag(tag)
    timer.start()
    try:
        rows = spark.range(parallelism, numPartitions=parallelism).mapInArrow(probe, PROBE_SCHEMA).collect()
    except Exception as exc:  # noqa: BLE001 - Spark surfaces executor failures as several exception types
        gone = connect_failure(spark, exc, "nothing was landed or loaded")  # a Connect server that went away, Ctrl-C
        if gone is not None:
            raise gone from None
        if timed_out.is_set():
            raise KitError(
                f"no Spark executor ran the load's first tasks within {timeout_s:.0f} s; nothing was landed or loaded",
                "run `spark status` (a cluster's cores may be held by another application, "
                "e.g. the Connect server, for a while), and check that executors can reach this driver",
            ) from None
        raise executor_error(exc, python) from None
    finally:
        timer.cancel()
        spark.removeTag(tag)
    for row in rows:
        if row.problem:
            raise KitError(
                f"the Spark executors lack {row.problem} (executor on {row.host}, Python {row.python}); "
                "nothing was landed or loaded",
                FIX,
            )


def executor_error(exc: BaseException, python: str | None = None) -> KitError:
    """The probe job itself failed: most often the executors' Python cannot run a mapInArrow task at all."""
    text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    missing = next((ln for ln in reversed(lines) if ln.startswith("ModuleNotFoundError")), None)
    if missing:
        module = missing.split("No module named", 1)[-1].strip(" '\"")
        what = f"the Python module '{module}'"
    elif "Cannot run program" in text:
        ln = next(ln for ln in lines if "Cannot run program" in ln)
        what = f"the Python they were told to run ({ln[ln.index('Cannot run program') :][:200]})"
    else:
        what = f"a working Python for the load's tasks ({first_line(exc)[:200]})"
    told = f" (their Python: {python})" if python else ""
    return KitError(f"the Spark executors lack {what}{told}; nothing was landed or loaded", FIX)
