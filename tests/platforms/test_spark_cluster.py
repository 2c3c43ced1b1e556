"""The kit's Spark cluster (`spark up`): a standalone master with two workers and a Spark Connect server, real JVMs
started from PySpark's package, a month loaded through each with every check of a load, and nothing left running.

The loads run in their own process, as a user runs them: a process has one SparkContext, and this one's belongs to
the session fixture.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms import procs, s3
from ducklake_kit.platforms.spark_cluster import CONNECT, SparkCluster
from ducklake_kit.taxi import spark as spark_mod

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.spark]


def kit(env: dict[str, str], *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "ducklake_test.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env, **(extra_env or {}), "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
    )


def cluster_processes(home: Path) -> list[psutil.Process]:
    """Every process of this user that belongs to a Spark cluster in `home`: found on its own, by the state folder
    in its command line (the JVMs: `-cp <home>/spark/conf/`) or its environment (executors' Python workers)."""
    mark = str(home / "spark")
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            if any(mark in part for part in proc.info["cmdline"] or []) or mark in proc.environ().get(
                "SPARK_CONF_DIR", ""
            ):
                out.append(proc)
        except (psutil.Error, TypeError):
            continue
    return out


def load_month(stack, month: str, master: str) -> dict:
    r = kit(
        stack.env,
        "load",
        "--source",
        "synthetic",
        "--months",
        month,
        "--rows-per-month",
        "20000",
        "--mode",
        "replace",
        "--spark-master",
        master,
        "--json",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    body = json.loads(r.stdout)["result"]
    assert body["failed"] == 0 and body["passed"] >= 7, body
    assert [f["status"] for f in body["files"]] == ["loaded"] and body["files"][0]["rows_read"] == 20000
    return body


@pytest.fixture(scope="module")
def cluster(stack):
    c = SparkCluster(stack.state)
    try:
        yield c
    finally:
        c.down()


class RunningLoad:
    """A load in its own process, as a user starts it, its progress lines read as they come."""

    def __init__(self, stack, month: str, master: str, rows: int = 20000, extra_env: dict[str, str] | None = None):
        argv = [
            sys.executable,
            str(ROOT / "ducklake_test.py"),
            "load",
            "--source",
            "synthetic",
            "--months",
            month,
            "--rows-per-month",
            str(rows),
            "--spark-master",
            master,
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **stack.env, **(extra_env or {}), "COLUMNS": "200"},
        )
        self.lines: list[str] = []
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for_line(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in ln for ln in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no line with {text!r}: {self.lines} {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.05)

    def ends_within(self, seconds: float) -> float:
        """How long the load took to end; fails the test (and kills it) when it runs longer than `seconds`."""
        started = time.monotonic()
        try:
            _out, self.stderr = self.proc.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, self.stderr = self.proc.communicate()
            pytest.fail(f"the load did not end within {seconds:g} s: {self.lines[-3:]} {self.stderr[-1500:]}")
        return time.monotonic() - started


def connect_server(cluster: SparkCluster) -> psutil.Process:
    rec = procs.live_pid(cluster.state.pid_file(CONNECT))
    assert rec is not None, "the Connect server is not running"
    proc = rec.process()
    assert proc is not None and proc.name() == "java", proc  # the JVM itself (spark-submit execs it)
    return proc


def lake_snapshots(stack) -> list[int]:
    with Lake(stack.platform.endpoints()) as lake:
        return [
            r[0] for r in lake.con.execute(f"SELECT snapshot_id FROM ducklake_snapshots('{lake.alias}')").fetchall()
        ]


def app_folders(cluster: SparkCluster) -> set[Path]:
    """The applications the workers ran executors for: one folder each under the worker's work folder."""
    return {p for w in ("w1", "w2") for p in (cluster.root / "work" / w).glob("app-*")}


def test_a_month_loads_through_a_two_worker_standalone_cluster(stack, local_only, cluster):
    r = kit(stack.env, "spark", "up", "--spark-workers", "2", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    st = json.loads(r.stdout)["result"]
    assert st["alive_workers"] == 2 and st["master_url"] == cluster.master_url
    assert [p["name"] for p in st["processes"] if p["running"]] == ["master", "w1", "w2"]
    # the master's own account: two workers, one core each
    master = cluster._master_json()
    assert [(w["state"], w["cores"]) for w in master["workers"]] == [("ALIVE", 1), ("ALIVE", 1)]
    # a Connect server on the same cluster, up while the standalone load runs: the two must not get in each
    # other's way (a Connect client in the load's process, or the server holding every core)
    r = kit(stack.env, "spark", "up", "--mode", "connect", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(r.stdout)["result"]["connect_master"] == cluster.master_url
    # the server's readiness query ran on an executor of its own, which it gives back once idle (15 s: the query
    # leaves no shuffle files): a load started before then gets the other worker's core only, and may end before the
    # first is free. Wait for both to be free, so the load can run on both (and the server has shown that it gives cores back).
    deadline = time.monotonic() + 90
    while any(w["coresused"] for w in cluster._master_json()["workers"]):
        assert time.monotonic() < deadline, "the Connect server still holds a worker's core after 90 s idle"
        time.sleep(0.5)

    before = app_folders(cluster)
    body = load_month(stack, "2019-05", "standalone")
    # the tasks ran in executors the workers started for this load's application, on both workers
    new = app_folders(cluster) - before
    assert {p.parent.name for p in new} == {"w1", "w2"}, new
    with Lake(stack.platform.endpoints()) as lake:
        n = lake.con.execute("SELECT count(*) FROM trips WHERE load_id = ?", [body["load_id"]]).fetchone()[0]
    assert n == body["files"][0]["rows_accepted"]


def test_spark_up_connect_starts_a_dead_worker_again(stack, local_only, cluster):
    # the cluster of the test above: a master, w1, w2, and the Connect server on them
    before = procs.live_pid(cluster.state.pid_file("spark-worker-w1"))
    assert before is not None
    killed = before.process()
    killed.kill()
    killed.wait(10)
    r = kit(stack.env, "spark", "up", "--mode", "connect", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    after = procs.live_pid(cluster.state.pid_file("spark-worker-w1"))
    assert after is not None and after.pid != before.pid, "spark up --mode connect left worker w1 dead"
    # ALIVE at the master: the worker it lists on a port the new w1 process listens on (the killed one may still be
    # listed ALIVE for a minute, until its heartbeats are missed)
    ports = {c.laddr.port for c in after.process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
    workers = cluster._master_json()["workers"]
    assert [w["state"] for w in workers if w["port"] in ports] == ["ALIVE"], (ports, workers)
    assert json.loads(r.stdout)["result"]["connect_master"] == cluster.master_url


def test_a_month_loads_through_spark_connect_with_its_token(stack, local_only, cluster):
    r = kit(stack.env, "spark", "status", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    st = json.loads(r.stdout)["result"]
    # an application of the standalone cluster (it has no executors of its own): the load runs on the workers
    assert (st["connect_url"], st["connect_master"]) == (cluster.connect_url, cluster.master_url)
    secrets = cluster.secrets()
    mine = cluster_processes(stack.home)
    for proc in mine:
        args = " ".join(proc.cmdline())
        assert secrets.connect_token not in args and secrets.auth_secret not in args, f"a secret in {args[:200]}"
        # loopback only: every port the cluster's processes listen on
        for conn in proc.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                assert conn.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), (args[:200], conn)

    load_month(stack, "2019-06", "connect")

    # a client without the token is refused
    probe = (
        "from pyspark.sql.connect.session import SparkSession\n"
        f"s = SparkSession.builder.remote('{cluster.connect_url}/;token=wrong').create()\n"
        "s.sql('SELECT 1').collect()\n"
    )
    refused = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"},
    )
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, refused.stderr[-2000:]
    # and a load given a wrong token says so, in one line, before anything is landed
    r = kit(
        stack.env,
        "load",
        "--source",
        "synthetic",
        "--months",
        "2019-09",
        "--rows-per-month",
        "2000",
        "--spark-master",
        f"{cluster.connect_url}/;token=wrong",
    )
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"Error: token refused by the Spark Connect server at {cluster.connect_url}. Try: give the server's own token, "
        "`;token=...` in the URL or SPARK_CONNECT_AUTHENTICATE_TOKEN (for the kit's server: --spark-master connect)."
    ], r.stderr

    r = kit(stack.env, "spark", "down")
    assert r.returncode == 0, r.stderr
    assert "spark master: stopped" in r.stdout and "spark connect: stopped" in r.stdout, r.stdout
    assert cluster_processes(stack.home) == [], "spark down left processes behind"
    r = kit(stack.env, "spark", "status")
    assert r.returncode == 0 and "not running" in r.stdout, r.stdout


def test_a_connect_server_killed_mid_load_ends_it_with_one_line_and_the_lake_unchanged(stack, local_only, cluster):
    r = kit(stack.env, "spark", "up", "--mode", "connect", "--json")  # after `spark down`: on local[*]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    snapshots = lake_snapshots(stack)
    # the retries of a call end RETRY_S after its first failure: 60 s by default (a minute of the suite's time), 5 s
    # here, so the load must end well before the default would have let it
    load = RunningLoad(stack, "2019-08", "connect", rows=200000, extra_env={"DUCKLAKE_SPARK_CONNECT_RETRY_S": "5"})
    load.wait_for_line("Spark: conform")  # the load's job has started on the server
    connect_server(cluster).kill()
    # PySpark's own retries kept such a load silent for 14.6 minutes, Ctrl-C or not
    took = load.ends_within(50)
    assert load.proc.returncode == 3, (took, load.lines[-3:], load.stderr[-2000:])
    assert load.stderr.splitlines() == [
        f"Error: the Spark Connect server at {cluster.connect_url} stopped answering during the load; nothing was "
        "committed and the lake is unchanged. Try: run `spark up --mode connect`, then the same load again."
    ], load.stderr
    assert lake_snapshots(stack) == snapshots


def test_ctrl_c_ends_a_load_waiting_on_a_connect_server_that_hangs(stack, local_only, cluster):
    r = kit(stack.env, "spark", "up", "--mode", "connect", "--json")  # a new server for the one killed above
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    snapshots = lake_snapshots(stack)
    load = RunningLoad(stack, "2019-08", "connect", rows=200000)
    load.wait_for_line("Spark: conform")
    server = connect_server(cluster)
    server.suspend()  # SIGSTOP: its port still takes connections, nothing on it answers
    try:
        time.sleep(3)  # the load is now waiting on the server
        load.proc.send_signal(signal.SIGINT)
        took = load.ends_within(15)
    finally:
        server.resume()
    assert load.proc.returncode == 3, (took, load.lines[-3:], load.stderr[-2000:])
    assert load.stderr.splitlines() == [
        "Error: the load was interrupted (Ctrl-C); nothing was committed and the lake "
        "is unchanged. Try: run the same load again."
    ], load.stderr
    assert lake_snapshots(stack) == snapshots
    r = kit(stack.env, "spark", "down")
    assert r.returncode == 0, r.stderr


def test_executors_without_the_kits_python_stop_the_load_with_one_line_and_nothing_landed(stack, local_only, tmp_path):
    bare = tmp_path / "bare"  # a Python with nothing installed: no pyarrow, no duckdb, no kit
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    ep = stack.platform.endpoints()
    raw_before = s3.client(ep.s3).list_objects_v2(Bucket="raw").get("KeyCount", 0)
    with Lake(ep) as lake:
        snap = lake.current_snapshot()
    r = kit(
        stack.env,
        "load",
        "--source",
        "synthetic",
        "--months",
        "2019-07",
        "--rows-per-month",
        "2000",
        extra_env={"PYSPARK_PYTHON": str(bare / "bin" / "python")},
    )
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert (
        errors
        == [
            f"Error: the Spark executors lack the Python module 'pyarrow' (their Python: {bare}/bin/python); "
            "nothing was landed or loaded. Try: " + errors[0].split("Try: ", 1)[1]
        ]
        if errors
        else False
    ), r.stderr
    assert "PYSPARK_PYTHON" in errors[0]
    assert s3.client(ep.s3).list_objects_v2(Bucket="raw").get("KeyCount", 0) == raw_before
    with Lake(ep) as lake:
        assert lake.current_snapshot() == snap


def test_the_kits_cluster_named_when_it_is_not_running_and_a_busy_port_named(stack, local_only):
    c = SparkCluster(stack.state)
    c.down()  # whatever an earlier test left
    with pytest.raises(KitError, match=r"standalone Spark cluster is not running.*"):
        spark_mod.target("standalone", stack.state)
    with pytest.raises(KitError, match="Spark Connect server is not running"):
        spark_mod.target("connect", stack.state)
    with pytest.raises(KitError, match="'127.0.0.1:7077' is not a Spark master"):  # the scheme forgotten
        spark_mod.target("127.0.0.1:7077")
    t = spark_mod.target("sc://example:15002/;token=abc")
    assert (t.kind, t.url) == ("connect", "sc://example:15002") and "abc" not in repr(t)
    with socket.socket() as s:
        s.bind(("127.0.0.1", c.master_port))
        s.listen()
        with pytest.raises(KitError) as busy:
            c.up("standalone", 1)
    line = busy.value.line()
    assert line.startswith(f"Error: port {c.master_port} for the Spark master is already in use by another program (")
    assert f"(pid {os.getpid()}) listens on it" in line and line.endswith(" with DUCKLAKE_SPARK_MASTER_PORT.")
    assert cluster_processes(stack.home) == []
