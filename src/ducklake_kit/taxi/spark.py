"""The SparkSession: `local[*]` by default, small local config; `--spark-master` or SPARK_REMOTE for a cluster."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ducklake_kit.errors import KitError, first_line

if TYPE_CHECKING:
    from ducklake_kit.platforms.state import State

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


@dataclass(frozen=True)
class SparkTarget:
    """Where a load's Spark job runs. `url` is what is shown (never a token); `env` what the session needs set."""

    kind: str  # local | cluster | connect
    url: str
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    kit: bool = False  # the cluster `spark up` started in this state folder
    remote: str = field(default="", repr=False)  # Spark Connect: the whole URL, which may carry `;token=...`

    @property
    def loopback(self) -> bool:
        return self.kind == "local" or self.url.startswith(("spark://127.0.0.1:", "spark://localhost:"))


KIT_WORDS = ("standalone", "connect")


def target(master: str | None = None, state: State | None = None) -> SparkTarget:
    """The Spark a load uses: `master` (local[N], spark://host:port, sc://host:port, or `standalone` / `connect`:
    the cluster `spark up` started), else SPARK_REMOTE (Spark Connect), else SPARK_MASTER, else local[*]."""
    if master in KIT_WORDS:
        from ducklake_kit.platforms.spark_cluster import SparkCluster
        from ducklake_kit.platforms.state import State

        cluster = SparkCluster(state or State())
        status = cluster.status(connect=master == "connect")
        if master == "connect":
            if not status.connect_url:
                raise KitError(
                    "the kit's Spark Connect server is not running", "start it with `spark up --mode connect`"
                )
            # the token travels in the URL, in this process's memory only: never in the environment, which a later
            # session to another server would read
            return SparkTarget(
                "connect",
                status.connect_url,
                kit=True,
                remote=f"{status.connect_url}/;token={cluster.secrets().connect_token}",
            )
        if not status.master_url or status.alive_workers == 0:
            raise KitError(
                "the kit's standalone Spark cluster is not running (no master with ALIVE workers)",
                "start it with `spark up` (then `spark status`)",
            )
        return SparkTarget("cluster", status.master_url, tuple(cluster.client_env().items()), kit=True)
    if master and master.startswith("sc://"):
        return SparkTarget("connect", master.split("/;", 1)[0], remote=master)
    if not master and os.environ.get("SPARK_REMOTE"):
        remote = os.environ["SPARK_REMOTE"]
        return SparkTarget("connect", remote.split("/;", 1)[0], remote=remote)
    url = master or os.environ.get("SPARK_MASTER", "local[*]")
    if url.startswith("spark://"):
        from ducklake_kit.platforms.spark_cluster import SparkCluster
        from ducklake_kit.platforms.state import State

        if SparkCluster(state or State()).is_master_url(url):
            return target("standalone", state)  # the kit's own cluster, given by its URL: it needs the secret
    if not url.startswith(("local", "spark://", "yarn", "k8s://")):
        raise KitError(
            f"'{url}' is not a Spark master",
            "give local[*], spark://host:port, sc://host:port (Spark "
            "Connect), or `standalone` / `connect` for the cluster `spark up` started",
        )
    return SparkTarget("local" if url.startswith("local") else "cluster", url)


def session(master: str | SparkTarget | None = None, app_name: str = "ducklake-kit", *, log_path: Path | None = None):
    """Start (or reuse) a SparkSession on `master` (see `target`). Needs Java 17+ (checked by `doctor`) unless it is
    Spark Connect, whose session is a new one each time (stop it when done). `log_path`: where the JVM's own output
    goes (see `jvm_output`).

    The executors' Python is PYSPARK_PYTHON of this process (a driver started by `python`, not by spark-submit,
    takes no other setting): this interpreter unless the user set another; the kit's own cluster always gets this
    one, since it runs on this machine."""
    from pyspark.sql import SparkSession

    t = master if isinstance(master, SparkTarget) else target(master)
    if t.kind == "connect":
        _stop_classic()  # one kind of session per process
        from ducklake_kit.taxi import spark_connect  # grpc and the Connect client: only for a Connect session

        return spark_connect.open_session(t.url, t.remote, t.kit)
    # an explicit classic master wins over SPARK_REMOTE (PySpark would refuse to start with both set)
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        os.environ.pop(var, None)
    if t.kit:
        os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env = dict(t.env)
    try:
        _stop_other(t.url)
        builder = SparkSession.builder.master(t.url).appName(app_name)
        for k, v in LOCAL_CONF.items():
            builder = builder.config(k, v)
        if t.loopback:
            # loopback only, and no dependence on the host name resolving (containers, CI); SPARK_LOCAL_IP
            # also stops the JVM's "hostname resolves to a loopback address" warning at start
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
        if t.kit:
            from pyspark import SparkContext

            if SparkContext._gateway is None:
                # the JVM starts now and reads spark-defaults.conf (the cluster's secret) from SPARK_CONF_DIR: the
                # secret never appears in its arguments
                os.environ.update(env)
            else:
                # this process's JVM already runs (it read its defaults at start): the secret goes in through py4j
                for k, v in _read_defaults(Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf").items():
                    builder = builder.config(k, v)
        with jvm_output(log_path):
            spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - JVM start failures surface as several exception types
        from ducklake_kit.platforms.doctor import JAVA_FIX, java_problem

        why = java_problem()
        if why:
            raise KitError(f"Spark did not start: {why}", JAVA_FIX) from None
        raise KitError(
            f"Spark did not start on {t.url} ({first_line(exc)[:300]})",
            "read logs/spark.log in the state folder; for the kit's cluster run `spark status`",
        ) from None
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def interruptible(spark, done: str):
    """Around the waits on a Spark Connect session's jobs: Ctrl-C ends them at once, one line saying `done` (see
    spark_connect). Nothing for a classic session: its Ctrl-C is Spark's own."""
    connect = sys.modules.get("ducklake_kit.taxi.spark_connect")
    return connect.interruptible(spark, done) if connect else nullcontext()


def connect_failure(spark, exc: BaseException, done: str) -> KitError | None:
    """When a Spark Connect session's job ended because its server stopped answering, or by Ctrl-C: that, in one line
    saying `done`. None otherwise (a classic session, or a failure of the job itself)."""
    connect = sys.modules.get("ducklake_kit.taxi.spark_connect")  # not imported: no Connect session was ever opened
    return connect.failure(spark, exc, done) if connect else None


def stop(spark) -> None:
    """Stop a session this module started: a Connect one is given back to its server, or closed without asking the
    server anything when it went away."""
    connect = sys.modules.get("ducklake_kit.taxi.spark_connect")
    if connect and isinstance(spark, connect.SparkSession):
        connect.close(spark)
    else:
        spark.stop()


def _stop_classic() -> None:
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        active.stop()


def _stop_other(url: str) -> None:
    """One SparkContext per process: a session on another cluster than asked for is stopped first (getOrCreate
    would otherwise hand it back). A local session is reused for any local[N]."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if (
        active is not None
        and active.master != url
        and not (active.master.startswith("local") and url.startswith("local"))
    ):
        from pyspark.sql import SparkSession

        current = SparkSession.getActiveSession()
        (current or active).stop()


def _read_defaults(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition(" ")
            out[k] = v.strip()
    return out
