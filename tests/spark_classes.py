"""One archive of the Spark driver's classes, shared by every Spark JVM the tests start (docs/development.md, "What
the suite spends its CPU on").

A Spark driver JVM reads, parses and verifies some ten thousand classes from Spark's jars before it runs a job; the
suite starts such a JVM for every load it runs in a CLI process, lab or notebook. The JVM's own class-data sharing
(dynamic CDS, `-XX:ArchiveClassesAtExit`, JDK 13+) writes the classes a JVM loaded into an archive when it exits; a JVM
started with `-XX:SharedArchiveFile` maps them from it instead. The archive is made once per machine (and JDK,
PySpark, virtual environment and JVM flags) by `python tests/spark_classes.py ARCHIVE`: a driver that runs a small load's Spark work
(read a synthetic month, conform, flag, derive, hand the rows to Python with mapInArrow) and stops.

The JVM checks an archive against its own build and classpath before it maps anything: a JVM of another JDK, or with
another classpath (the kit's standalone cluster and Connect server put their own conf folder first), ignores it and
starts as it would without (`-Xlog:cds=off,cds+dynamic=off`: without its warning line). Only the tests use it; the
kit's own JVMs start as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

QUIET = "-Xlog:cds=off,cds+dynamic=off"  # a JVM that cannot use the archive says nothing about it


def _key(opts: str) -> str:
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60).stderr
    folder = Path(pyspark.__file__).parent / "jars"  # the JVM checks the classpath itself: one archive per venv
    jars = sorted(p.name for p in folder.glob("*.jar"))
    return hashlib.sha256("\n".join([java, pyspark.__version__, opts, str(folder), *jars]).encode()).hexdigest()[:16]


def archive(opts: str) -> Path | None:
    """The archive for JVMs started with `opts`, made first when there is none (under a lock: the suite's processes
    may ask at once). None when it could not be made (no Java, a JDK without dynamic CDS): the JVMs then start
    without it, as they would anyway."""
    try:
        folder = Path(tempfile.gettempdir()) / "ducklake-kit-tests"
        folder.mkdir(mode=0o755, exist_ok=True)
        path = folder / f"spark-classes-{_key(opts)}.jsa"
        with open(folder / "spark-classes.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                partial = path.with_suffix(f".{os.getpid()}.part")
                made = subprocess.run(
                    [sys.executable, __file__, str(partial)],
                    env={**os.environ, "SPARK_SUBMIT_OPTS": f"{opts} -XX:ArchiveClassesAtExit={partial}"},
                    capture_output=True,
                    text=True,
                    timeout=600,
                    stdin=subprocess.DEVNULL,
                )
                if made.returncode != 0 or not partial.exists():
                    partial.unlink(missing_ok=True)
                    return None
                partial.chmod(0o644)  # the kit's service user (when the tests run as root) starts JVMs too
                partial.replace(path)
        return path
    except (OSError, subprocess.SubprocessError):
        return None


def _dump() -> None:
    """A small load's Spark work in a driver that then stops: its JVM writes the classes it loaded on exit."""
    from ducklake_kit.taxi import spark as spark_mod
    from ducklake_kit.taxi import synthetic
    from ducklake_kit.taxi import transforms as tr

    def count(batches):
        import pyarrow as pa

        rows = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    with tempfile.TemporaryDirectory() as tmp:
        month = synthetic.generate_month(tmp, 2019, 1, 2000)
        zones = synthetic.write_zone_lookup(Path(tmp) / "taxi_zone_lookup.csv")
        spark = spark_mod.session("local[2]", "ducklake-kit-test-classes")
        raw = tr.read_trips(spark, month.path)
        df = tr.derive(tr.flag_quality(tr.conform(raw.df, raw.variant), 2019, 1), tr.read_zones(spark, zones))
        assert sum(r.rows for r in df.mapInArrow(count, "rows long").collect()) == 2000
        spark.stop()


if __name__ == "__main__":
    _dump()
