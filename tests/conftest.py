"""The shared fixtures (the only conftest): real PostgreSQL and rclone S3 servers in temporary state folders
on free ports, the CLI runner, one SparkSession for the whole run, and the real TLC samples in ../shared.

DUCKLAKE_TEST_BACKEND=containers runs the same integration tests against containers (testcontainers) through
the external platform, where a Docker engine answers: `just test-containers` gives it podman's Docker API on a unix
socket (ducklake_kit.platforms.podman_service) and the kit's own images; without an engine they are skipped.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.platforms.external import ExternalPlatform
from ducklake_kit.platforms.local import LocalPlatform
from ducklake_kit.platforms.spark_cluster import PORT_OPTIONS, SparkCluster
from ducklake_kit.platforms.state import State, write_private
from ducklake_kit.workers import plane

# pytester runs the test tiers' own tests (tests/test_tiers.py): a small pytest session with this conftest
pytest_plugins = ["pytester"]

BACKEND = os.environ.get("DUCKLAKE_TEST_BACKEND", "local")
# `all` loads three synthetic months and runs a short bench; small ones keep the suite quick on 2 cores (the bench
# stage's 3 writers x 100 inserts took 24.6 s of a 78 s `all`; `just ducklake-test` in .ci/run runs the full sizes)
os.environ.setdefault("DUCKLAKE_ALL_ROWS_PER_MONTH", "20000")
os.environ.setdefault("DUCKLAKE_ALL_BENCH_OPS", "20")
# nothing is downloaded in tests: `auto` finds the TLC host unreachable (a loopback port nobody listens on)
os.environ["DUCKLAKE_TLC_BASE_URL"] = "http://127.0.0.1:9"
# CPU the suite spends beside the tests' own work (docs/development.md, "What the suite spends its CPU on"):
# - every worker plane the tests start (a stack's, a lab's `up`) inherits these: no statistical profiler sampling each
#   worker's threads every 10 ms, and the event loop's health tick every second, not every 20 ms. Both only feed Dask's
#   dashboard and its "event loop was unresponsive" warning, which no test reads; an idle plane of a scheduler and two
#   workers took 3.7 CPU-seconds a minute with Dask's defaults and 1.1 with these, and planes idle through the run.
os.environ.setdefault("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "False")
os.environ.setdefault("DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL", "1s")
# - every Spark driver JVM the tests start (the session fixture's, each load's in a CLI process, a lab's or a
#   notebook's, the Connect server) and the standalone master and workers: the client compiler only and the serial
#   collector. A JVM's start and a small load's jobs took 17-18 CPU-seconds with the JVM's defaults (C2 compiling in
#   the background, G1's threads) and 8-9 with these, the same answers (Spark reads SPARK_SUBMIT_OPTS and
#   SPARK_DAEMON_JAVA_OPTS when it starts a JVM; the kit's own JVMs outside the tests keep the defaults).
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _var in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_var, JVM_OPTS)
# each test stack saves its own worker plane ports; these (set by .ci/run for `just ducklake-test`, or by a user's
# shell) would override them and send every stack to one port, or the tests to a user's Dask cluster
for _var in (
    "DUCKLAKE_SCHEDULER",
    "DUCKLAKE_SCHEDULER_PORT",
    "DUCKLAKE_DASHBOARD_PORT",
    "SPARK_REMOTE",
    "SPARK_MASTER",
    "DUCKLAKE_SPARK_MASTER_PORT",
    "DUCKLAKE_SPARK_UI_PORT",
    "DUCKLAKE_SPARK_CONNECT_PORT",
):
    os.environ.pop(_var, None)
# the containers backend's images: the manifests' (databases/*.yaml); on podman the kit's local builds stand in
PG_IMAGE = "postgres:16.15"
RCLONE_IMAGE = "rclone/rclone:1.75.2"

# -- test tiers -----------------------------------------------------------------------------------------------
# The fixtures that start or reach a service, and the markers a test using one gets. `item.fixturenames` is the
# closure of what a test requests, so a fixture built on these (`time_zone` on `spark`, a module's `lake` on
# `stack`) marks its tests too. `service` is every test that starts or uses a service; `pytest -m "not service"`
# (just test-fast) runs the others. A test that starts services without one of these fixtures (it runs the
# CLI's `up` in a home of its own, a notebook, a Dask client) says so with `pytestmark = pytest.mark.service`.
SERVICE_FIXTURES = {
    "stack": ("integration",),
    "module_stack": ("integration",),
    "fresh_stack": ("integration",),
    "lab_stack": ("integration",),
    "spark": ("spark",),
}
SERVICE_MARKS = {"service", "integration", "spark"}


# -- two processes (`just test`: pytest-xdist, `-n 2 --dist loadfile`) -----------------------------------------
# Each worker process has its own session: its own `stack`, module stacks, SparkSession and state folders, on ports
# of its own (stack_port). A test file runs whole in one process, in its order (its module fixtures set up once);
# the files that share something beyond their own state folders form one group, which runs in one process. Groups go
# out longest first, so that the last one to finish is short (docs/development.md).
SHARED_GROUPS = {
    # the labs build on one another in order on one lab_stack; lab 17 plays pods, as the podman tests do, and the
    # three build the kit's images when they are missing (podman_images.build takes no lock): one process at a time
    "tests/test_learning_path.py": "labs+podman",
    "tests/platforms/test_podman_platform.py": "labs+podman",
    "tests/platforms/test_podman_service.py": "labs+podman",
}
# the groups that take longest, first; the others follow in collection order
LONGEST_FIRST = [  # seconds per file in one run of the suite in two processes at load 22 (2026-11-27)
    "labs+podman",  # 1458 (the labs) + 53 + 7
    "tests/platforms/test_spark_cluster.py",  # 681
    "tests/test_notebooks.py",  # 489
    "tests/cli/test_cli.py",  # 489
    "tests/taxi/test_load.py",  # 440
    "tests/lessons/test_maintain.py",  # 269
    "tests/steps/test_step_faults.py",  # 265
    "tests/cli/test_progress.py",  # 261
    "tests/pipelines/test_pipeline_faults.py",  # 228
    "tests/pipelines/test_pipeline_changes.py",  # 207
    "tests/dynamic_tables/test_refresh_union.py",  # 191
    "tests/bench/test_bench.py",  # 178
    "tests/lessons/test_queries.py",  # 156
    "tests/console/test_console.py",  # 139
]


def group_of(nodeid: str) -> str:
    """The group a test runs in: its file's, or the shared group its file belongs to."""
    path = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(path, path)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist (absent under `-p no:xdist`)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadfile`, with the files of SHARED_GROUPS sent to one worker together. (xdist's own `loadgroup` and
    its xdist_group mark do not group under pytest 9: xdist 3.8 renames `item._nodeid`, which pytest 9 no longer
    reads.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LoadGroupedFiles(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return LoadGroupedFiles(config, log)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the order is the same whatever is selected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ())) & SERVICE_FIXTURES.keys()
        for mark in sorted({m for name in used for m in SERVICE_FIXTURES[name]}):
            item.add_marker(mark)
        if used or any(item.get_closest_marker(name) for name in SERVICE_MARKS):
            item.add_marker("service")
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out groups in the order they first
        # appear (--no-loadscope-reorder), so the longest go first; a stable sort keeps each file's own order
        rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """- and every Spark driver JVM maps Spark's classes from one archive made before the first test that may start
    one (tests/spark_classes.py: made once per machine; a small load's JVM then takes about a quarter less CPU)."""
    if os.environ.get("SPARK_SUBMIT_OPTS") != JVM_OPTS:  # a user's own JVM options: left as they are
        return
    if not any(item.get_closest_marker("service") for item in session.items):  # the fast tier starts no JVM
        return
    from tests.spark_classes import QUIET, archive

    if (path := archive(JVM_OPTS)) is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{JVM_OPTS} -XX:SharedArchiveFile={path} {QUIET}"


def _port_order() -> list[int]:
    """This process's ports: a slice, by xdist worker, of 20000-32767 (below Linux's ephemeral range, 32768-60999),
    from a start of its own. A stack saves its ports when it is made and binds some of them much later (the worker
    plane's on `up`, the Spark cluster's on `spark up`); a port the OS called free (bind to 0) can meanwhile be
    handed to another process that asks, or be a client connection's local port. Here neither happens: no worker
    scans another's slice, and the OS picks no port below 32768."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % count
    size = (32768 - 20000) // count
    start = random.Random(os.getpid()).randrange(size)  # two pytest sessions on one machine rarely overlap
    return [20000 + index * size + (start + i) % size for i in range(size)]


_ports = iter(_port_order())


def stack_port() -> int:
    """The next port of this process's slice that nothing listens on or holds."""
    for port in _ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port left in this test process's range")


_running: list[pytest.Item] = []  # the test being run, for the stacks to ask whether it may start services


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # a hook, not an autouse fixture: session and module fixtures (the stacks, Spark) are set up before any
    # function fixture runs, and they must know which test asked for them
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)


def refuse_unless_service(what: str) -> None:
    """Fail the running test when it starts `what` but is not marked `service`: the fast tier must start nothing.
    Collection marks the tests that request a stack; this catches the ones that reach one any other way
    (`request.getfixturevalue("stack")`, a LocalStack built in the test) before a process starts."""
    for item in _running:
        if item.get_closest_marker("service") is None:
            pytest.fail(
                f"{item.nodeid} starts {what} but is not marked `service`: request its fixture by name "
                "(tests/conftest.py marks it) or mark the module with `pytestmark = pytest.mark.service`",
                pytrace=False,
            )


def make_home() -> Path:
    # Not pytest's tmp_path: its parents are 0700, and as root PostgreSQL runs as another user who must traverse them.
    home = Path(tempfile.mkdtemp(prefix="ducklake-test-"))
    home.chmod(0o711)
    return home


class LocalStack:
    """A LocalPlatform in its own state folder on free ports, plus the env a CLI run needs to find it."""

    def __init__(self) -> None:
        refuse_unless_service("PostgreSQL and rclone S3 (a LocalStack)")
        self.home = make_home()
        self.pg_port, self.s3_port = stack_port(), stack_port()
        self.state = State(self.home)
        self.platform = LocalPlatform(self.state, pg_port=self.pg_port, s3_port=self.s3_port)
        # the worker plane's ports, saved so that library calls and CLI runs find the same ones
        self.scheduler_port, self.dashboard_port = stack_port(), stack_port()
        self.state.save_settings(scheduler_port=self.scheduler_port, dashboard_port=self.dashboard_port)
        # the Spark cluster's (`spark up`): never a user's default ports
        self.spark_ports = {"master": stack_port(), "ui": stack_port(), "connect": stack_port()}
        self.state.save_settings(**{f"spark_{k}_port": v for k, v in self.spark_ports.items()})
        self.env = {
            "DUCKLAKE_PLATFORM": "local",
            "DUCKLAKE_HOME": str(self.home),
            "DUCKLAKE_PG_PORT": str(self.pg_port),
            "DUCKLAKE_S3_PORT": str(self.s3_port),
            "DUCKLAKE_SCHEDULER_PORT": str(self.scheduler_port),
            "DUCKLAKE_DASHBOARD_PORT": str(self.dashboard_port),
            **{PORT_OPTIONS[k]: str(v) for k, v in self.spark_ports.items()},
        }

    def close(self) -> None:
        plane.down(self.state)  # a test or a lab may have started the worker plane (`up`)
        SparkCluster(self.state).down()  # or `spark up`
        self.platform.down()
        shutil.rmtree(self.home, ignore_errors=True)


def container_images(client) -> tuple[str, str]:
    """The PostgreSQL and rclone images to run. On podman, where no registry answers, the kit's own local builds
    standing in for PG_IMAGE and RCLONE_IMAGE (built, or reused by the hash of their inputs, as --platform podman
    does; their entrypoints take the official images' variables); on a Docker engine, the official images."""
    engines = {c.get("Name", "") for c in client.version().get("Components", [])}
    if "Podman Engine" not in engines:
        return PG_IMAGE, RCLONE_IMAGE
    from ducklake_kit.platforms import podman_images

    local = podman_images.images_map(podman_images.build([PG_IMAGE, RCLONE_IMAGE]))
    return local[PG_IMAGE], local[RCLONE_IMAGE]


class ContainerStack:
    """PostgreSQL and rclone S3 in containers (testcontainers), reached through --platform external.

    Ports are published on 127.0.0.1 only; the credentials reach the containers as environment variables (never in
    argv: rclone reads RCLONE_AUTH_KEY, as on the other platforms) and the tests through the state folder's
    external.toml (0600). Each container is labelled with DOCKER_HOST, so that `podman_service.run` removes what a
    killed session left; `close` removes them otherwise, also when a test failed or the start did.
    """

    def __init__(self) -> None:
        refuse_unless_service("PostgreSQL and rclone S3 in containers")
        try:
            import docker

            client = docker.from_env()
            client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure means no engine to run containers on
            pytest.skip(
                f"DUCKLAKE_TEST_BACKEND=containers but no Docker engine answers ({type(exc).__name__}). "
                "Try: `just test-containers` (podman's Docker API on a unix socket)"
            )
        from testcontainers.community.postgres import PostgresContainer
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.wait_strategies import LogMessageWaitStrategy

        from ducklake_kit.platforms.podman_service import LABEL

        pg_image, s3_image = container_images(client)
        labels = {LABEL: os.environ.get("DOCKER_HOST", "")}
        self.home = make_home()
        self.pg = PostgresContainer(
            pg_image, username="ducklake", password="test-only-pw", dbname="ducklake_catalog"
        ).with_kwargs(labels=labels)
        self.s3 = (
            DockerContainer(s3_image)
            # the official image's entrypoint is rclone; the kit's image has none: name it, so both run the same
            .with_kwargs(entrypoint=["rclone"], labels=labels)
            .with_command(["serve", "s3", "/data", "--addr", ":9000"])
            # rclone reads list flags from the environment as CSV: quoted, the pair stays one `key,secret`
            .with_env("RCLONE_AUTH_KEY", '"testkey,test-only-secret"')
            .waiting_for(LogMessageWaitStrategy("Starting s3 server"))
        )
        # published on the loopback only, on a port the engine picks (testcontainers' own API binds every address)
        self.pg.ports = {"5432": ("127.0.0.1", None)}
        self.s3.ports = {"9000": ("127.0.0.1", None)}
        try:
            self.pg.start()
            self.s3.start()
            host = self.pg.get_container_host_ip()
            self.pg_port, self.s3_port = self.pg.get_exposed_port(5432), self.s3.get_exposed_port(9000)
            self.state = State(self.home)
            write_private(
                self.home / "external.toml",
                f'pg_dsn = "postgresql://ducklake:test-only-pw@{host}:{self.pg_port}/ducklake_catalog"\n'
                f's3_endpoint = "http://{host}:{self.s3_port}"\n'
                's3_key_id = "testkey"\ns3_secret = "test-only-secret"\n',
            )
            # the worker plane and `spark up` run here, on free loopback ports saved in the state folder
            self.scheduler_port, self.dashboard_port = stack_port(), stack_port()
            self.spark_ports = {"master": stack_port(), "ui": stack_port(), "connect": stack_port()}
            self.state.save_settings(
                scheduler_port=self.scheduler_port,
                dashboard_port=self.dashboard_port,
                **{f"spark_{k}_port": v for k, v in self.spark_ports.items()},
            )
            self.env = {
                "DUCKLAKE_PLATFORM": "external",
                "DUCKLAKE_HOME": str(self.home),
                "DUCKLAKE_SCHEDULER_PORT": str(self.scheduler_port),
                "DUCKLAKE_DASHBOARD_PORT": str(self.dashboard_port),
                **{PORT_OPTIONS[k]: str(v) for k, v in self.spark_ports.items()},
            }
            self.platform = ExternalPlatform(self.state)
            self.platform.up()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            if hasattr(self, "state"):
                plane.down(self.state)
                SparkCluster(self.state).down()
        finally:
            for container in (self.s3, self.pg):
                try:
                    container.stop()  # removes it and its anonymous volumes
                except Exception as exc:  # noqa: BLE001 - try the other; podman_service.run reaps by label
                    print(f"could not remove a test container: {type(exc).__name__}: {exc}", file=sys.stderr)
            shutil.rmtree(self.home, ignore_errors=True)


def throwaway_catalog(s: LocalStack | ContainerStack) -> None:
    """The test stacks' PostgreSQL neither waits for nor forces its writes to disk (fsync, synchronous_commit and
    full_page_writes off): every DuckLake commit is a catalog transaction, and the suite's data is thrown away with
    the stack (a catalog commit took 2-4 ms with the defaults on this machine's disk, under 1 ms without; 300 each,
    load 22). Never for a user's catalog. Not for `fresh_stack`: its tests kill PostgreSQL and prove that no committed
    row is lost."""
    from ducklake_kit.platforms import postgres

    with postgres.connect(s.platform.endpoints().pg, timeout=10) as conn:
        conn.autocommit = True  # ALTER SYSTEM cannot run in a transaction
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = off")
        conn.execute("SELECT pg_reload_conf()")


def start_stack() -> LocalStack | ContainerStack:
    s = ContainerStack() if BACKEND == "containers" else LocalStack()
    try:
        if BACKEND != "containers":
            s.platform.up()
        throwaway_catalog(s)
    except BaseException:
        s.close()
        raise
    return s


@pytest.fixture(scope="session")
def stack() -> Iterator[LocalStack | ContainerStack]:
    """The services every integration test shares, started once per session."""
    s = start_stack()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def module_stack() -> Iterator[LocalStack | ContainerStack]:
    """The services of one module, for tests whose time grows with everything the session's lake holds: the
    notebooks (notebook 05's maintain flushes, merges and fingerprints the whole lake, as the CLI's does: 127 s on
    the session's lake near the end of a run at load 18, 8 s on a lake of its own at load 1-9) and `maintain
    --dry-run --json` (77 s there). One more stack start each, a few seconds."""
    s = start_stack()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def local_only() -> None:
    if BACKEND != "local":
        pytest.skip("manages local processes (pids, ports): only meaningful on the local backend")


@pytest.fixture
def fresh_stack(local_only) -> Iterator[LocalStack]:
    """A private local stack, for tests that stop, kill or break services."""
    s = LocalStack()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def lab_stack() -> Iterator[LocalStack]:
    """A private local stack for one module (tests/test_learning_path.py: the labs start, fill and stop it)."""
    if BACKEND != "local":
        pytest.skip("the labs start and stop local services: only meaningful on the local backend")
    s = LocalStack()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cli():
    """Invoke the harness like a user: `cli(env, "sql", "SELECT 1")` -> click Result."""
    runner = CliRunner()

    def invoke(env: dict[str, str], *args: str, input: str | None = None):
        return runner.invoke(app, list(args), env={**env, "COLUMNS": "200"}, input=input)

    return invoke


# -- Spark and the real samples (the taxi tests) --------------------------------------------------------------

# Real TLC samples next to the project (never copied into it): tests that read them skip without them.
SAMPLES = Path(__file__).resolve().parents[1].parent / "shared" / "tlc-samples"

# Deliberately not UTC: a transform that shifted timestamps through the session time zone would show it
# in every test, not only in the ones about time zones.
SESSION_TIME_ZONE = "America/New_York"


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from ducklake_kit.taxi.transforms import SPARK_CONF

    refuse_unless_service("a SparkSession")

    # the Python workers run this interpreter (with pyarrow and duckdb), whatever `python3` is on PATH: the loads the
    # tests run in this process reuse this session, and Spark reads PYSPARK_PYTHON when the session starts
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("ducklake-kit-taxi-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", SESSION_TIME_ZONE)
    )
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def time_zone(spark, request):
    """Run a test under the session time zone `request.param`, then put the default back."""
    spark.conf.set("spark.sql.session.timeZone", request.param)
    yield request.param
    spark.conf.set("spark.sql.session.timeZone", SESSION_TIME_ZONE)


@pytest.fixture(scope="session")
def sample():
    """`sample(name)`: a file of ../shared/tlc-samples, or skip the test (a user's clone lacks them)."""

    def get(name: str) -> Path:
        path = SAMPLES / name
        if not path.exists():
            pytest.skip(f"real TLC sample {path} is absent (it lives next to the project, in ../shared)")
        return path

    return get
