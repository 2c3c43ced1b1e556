"""The worker plane with real Dask processes and the real lake: tasks on any worker and on a named one, per-statement
results, worker-local tables, concurrent writers, a worker killed mid-task (never re-run), `down`, and a Dask cluster
the test starts itself with the `dask` CLI used through --scheduler. Everything here writes only the schema
`workers_tests`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.platforms import procs
from ducklake_kit.platforms.state import State
from ducklake_kit.workers import WorkerPlane, plane
from ducklake_kit.workers.client import NO_RETRIES_ENV

SCHEMA = "workers_tests"


@pytest.fixture(scope="module")
def workers(stack):
    """Three workers in the shared stack's state folder; the schema is new for this module."""
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 3)
    assert [w.name for w in status.workers] == ["w1", "w2", "w3"], status
    with Lake(ep) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
    with WorkerPlane(status.address, ep) as wp:
        yield wp


@pytest.fixture
def lake(stack):
    with Lake(stack.platform.endpoints()) as lk:
        yield lk


def test_a_task_runs_on_the_named_worker_and_says_so(workers):
    for name in ("w1", "w3", "w2"):
        r = workers.run("SELECT 1 AS one", worker=name)
        assert (r.ok, r.worker, r.rows) == (True, name, [(1,)])
    anywhere = workers.run("SELECT 2")
    assert anywhere.worker in {"w1", "w2", "w3"} and anywhere.rows == [(2,)]


def test_an_unknown_worker_is_one_clear_line(workers):
    with pytest.raises(KitError) as exc:
        workers.submit("SELECT 1", worker="w9")
    assert exc.value.line() == (
        "Error: no running worker is named 'w9' (running: w1, w2, w3). "
        "Try: run `workers` to list them, or `up --workers N` to start more."
    )


def test_each_statement_reports_rows_counts_and_the_snapshot_it_committed(workers, lake):
    t = f"{SCHEMA}.results"
    r = workers.run(
        [
            f"CREATE TABLE {t} (id INTEGER, name VARCHAR)",
            f"-- a leading comment\nINSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, NULL)",
            f"UPDATE {t} SET name = 'c' WHERE name IS NULL; DELETE FROM {t} WHERE id = 1",
            f"WITH x AS (SELECT * FROM {t}) SELECT id, name FROM x ORDER BY id",
            f"DESCRIBE {t}",
        ],
        worker="w2",
    )
    assert r.ok, r.error
    kinds = [(s.index, s.statement_type, s.affected_rows) for s in r.statements]
    assert kinds == [
        (0, "CREATE", None),
        (1, "INSERT", 3),
        (2, "UPDATE", 1),
        (3, "DELETE", 1),
        (4, "SELECT", None),
        (5, "SELECT", None),
    ]
    assert r.statements[4].rows == [(2, "b"), (3, "c")]
    assert [row[0] for row in r.statements[5].rows] == ["id", "name"]
    # the snapshot each write committed, checked independently by time travel: each holds exactly that write
    writes = [s.snapshot_id for s in r.statements[:4]]
    assert r.statements[4].snapshot_id is None and r.statements[5].snapshot_id is None
    at = [
        lake.con.execute(
            f"SELECT count(*), count(name), count(*) FILTER (id = 1) FROM {t} AT (VERSION => {v})"
        ).fetchone()
        for v in writes
    ]
    assert at == [(0, 0, 0), (3, 2, 1), (3, 3, 1), (2, 2, 0)]


def test_a_failed_statement_keeps_the_ones_before_and_duckdbs_own_error(workers, lake):
    t = f"{SCHEMA}.partial"
    r = workers.run(
        [
            f"CREATE TABLE {t} (id INTEGER)",
            f"INSERT INTO {t} VALUES (1)",
            f"INSERT INTO {t} VALUES ('not a number')",
            f"INSERT INTO {t} VALUES (2)",
        ],
        worker="w1",
    )
    assert not r.ok and r.error.index == 2 and r.error.statement == f"INSERT INTO {t} VALUES ('not a number')"
    assert r.error.error.startswith("Conversion Error: Could not convert string 'not a number' to INT32")
    assert [s.affected_rows for s in r.statements] == [None, 1]
    assert lake.scalar(f"SELECT list(id) FROM {t}") == [1]  # autocommit: the first insert stays, the last never ran
    # the same in one transaction with a commit message: nothing stays
    r = workers.run(
        [f"INSERT INTO {t} VALUES (5)", f"INSERT INTO {t} VALUES ('x')"], message="two inserts", worker="w1"
    )
    assert (r.ok, r.rolled_back, r.error.index, r.snapshot_id) == (False, True, 1, None)
    assert lake.scalar(f"SELECT list(id) FROM {t}") == [1]
    # and the worker's next task is not stuck in an aborted transaction
    assert workers.run(f"SELECT count(*) FROM {t}", worker="w1").rows == [(1,)]


def test_a_transaction_left_open_is_rolled_back_and_reported(workers, lake):
    t = f"{SCHEMA}.left_open"
    workers.run(f"CREATE TABLE {t} (id INTEGER)", worker="w1")
    r = workers.run(["BEGIN", f"INSERT INTO {t} VALUES (1)"], worker="w1")
    assert (r.ok, r.rolled_back) == (False, True) and "left a transaction open" in r.error.error
    # the worker's next task runs on its own: its insert commits, and it is the only row
    after = workers.run(f"INSERT INTO {t} VALUES (2)", worker="w1")
    assert after.ok and after.snapshot_id is not None
    assert lake.scalar(f"SELECT list(id) FROM {t}") == [2]


def test_a_transaction_task_makes_one_snapshot_with_its_message(workers, lake):
    t = f"{SCHEMA}.txn"
    workers.run(f"CREATE TABLE {t} (id INTEGER)")
    r = workers.run([f"INSERT INTO {t} VALUES (1)", f"INSERT INTO {t} VALUES (2)"], message="node: two rows")
    assert r.ok and r.snapshot_id is not None
    (message,) = lake.con.execute(
        "SELECT commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [r.snapshot_id]
    ).fetchone()
    assert message == "node: two rows"
    assert lake.scalar(f"SELECT count(*) FROM {t} AT (VERSION => {r.snapshot_id})") == 2
    assert lake.scalar(f"SELECT count(*) FROM {t} AT (VERSION => {r.snapshot_id - 1})") == 0


def test_worker_local_tables_live_on_their_worker_only(workers):
    made = workers.run(
        [
            "CREATE OR REPLACE TABLE local.zones AS SELECT range AS zone FROM range(5)",
            "SELECT count(*) FROM local.zones",
        ],
        worker="w3",
    )
    assert made.ok and made.rows == [(5,)]
    elsewhere = workers.run("SELECT count(*) FROM local.zones", worker="w1")
    assert not elsewhere.ok and "zones does not exist" in elsewhere.error.error
    listed = {w.name: w.local_tables for w in workers.workers()}
    assert "local.zones" in listed["w3"] and "local.zones" not in listed["w1"]
    # the lake's tables are the default: an unqualified name is never a worker-local one
    assert workers.run("SELECT current_database()", worker="w3").rows == [("lake",)]


def test_three_workers_insert_concurrently_and_every_row_lands_once(workers, lake):
    t = f"{SCHEMA}.concurrent"
    workers.run(f"CREATE TABLE {t} (worker VARCHAR, op INTEGER)")
    futures = [
        workers.submit([f"INSERT INTO {t} VALUES ('{w}', {op})" for op in range(30)], worker=w)
        for w in ("w1", "w2", "w3")
    ]
    results = [workers.result(f) for f in futures]
    assert all(r.ok for r in results), [r.error for r in results]
    assert sorted(r.worker for r in results) == ["w1", "w2", "w3"]
    total, distinct = lake.con.execute(f"SELECT count(*), count(DISTINCT (worker, op)) FROM {t}").fetchone()
    assert (total, distinct) == (90, 90)
    # every insert committed its own snapshot, none shared
    snaps = [s.snapshot_id for r in results for s in r.statements]
    assert len(set(snaps)) == 90
    # and each commit says, from the lake, which worker's task made it and which of the task's texts it was
    infos = lake.con.execute(
        "SELECT commit_extra_info FROM ducklake_snapshots('lake') WHERE snapshot_id IN (SELECT unnest(?))", [snaps]
    ).fetchall()
    tagged = [json.loads(i[0]) for i in infos]
    assert sorted((x["run"], x["worker"], x["text"], x["statement"]) for x in tagged) == sorted(
        ("task", w, n, 1) for w in ("w1", "w2", "w3") for n in range(1, 31)
    )


def test_workers_lists_every_worker_with_its_pid_and_tasks(workers):
    listed = workers.workers()
    assert [w.name for w in listed] == ["w1", "w2", "w3"]
    for w in listed:
        assert w.lake == "attached" and w.tasks_run >= 1 and psutil.pid_exists(w.pid)
        assert w.address.startswith("tls://127.0.0.1:")  # loopback only, TLS only


# -- a private plane for the faults: a killed worker, `up` replacing it, `down` ------------------------------


@pytest.fixture
def private_plane(stack, local_only):
    # only pid files, logs and certificates: no PostgreSQL here; not pytest's tmp_path, whose parents are 0700 (as
    # root the plane runs as the service user, who must traverse them)
    home = Path(tempfile.mkdtemp(prefix="ducklake-plane-"))
    home.chmod(0o711)
    state = State(home)
    state.save_settings(scheduler_port=procs.free_port(), dashboard_port=procs.free_port())
    try:
        yield state, stack.platform.endpoints()
    finally:
        plane.down(state)
        shutil.rmtree(home, ignore_errors=True)


def _pids(state: State) -> dict[str, int]:
    return {p.name.removesuffix(".pid.json"): procs.read_pid(p).pid for p in state.run_dir.glob("*.pid.json")}


def test_a_worker_killed_mid_task_fails_the_task_and_it_is_never_run_again(private_plane, lake):
    state, ep = private_plane
    status = plane.up(state, ep, 3)
    t = f"{SCHEMA}.killed"
    lake.run(f"CREATE OR REPLACE TABLE {t} (step VARCHAR, n BIGINT)")
    with WorkerPlane(status.address, ep) as wp:
        future = wp.submit(
            [
                f"INSERT INTO {t} VALUES ('started', 0)",
                # long enough to be killed in the middle: counting ten billion rows
                f"INSERT INTO {t} SELECT 'finished', count(*) FROM range(10000000000)",
            ],
            worker="w2",
        )
        deadline = time.monotonic() + 60
        while lake.scalar(f"SELECT count(*) FROM {t}") == 0:  # the first statement committed: the second is running
            assert time.monotonic() < deadline, "the task never started"
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(_pids(state)["worker-w2"], signal.SIGKILL)
        r = wp.result(future, timeout_s=60)
        assert not r.ok and r.worker == "w2"
        assert r.error.line().startswith("worker w2 (tls://127.0.0.1:") and "was not run again" in r.error.error
        time.sleep(2)  # Dask's default would now run it on w1 or w3 (allowed-failures 3): 'started' twice
        assert lake.con.execute(f"SELECT step, count(*) FROM {t} GROUP BY step").fetchall() == [("started", 1)]
    # `status` names the dead worker; `up` replaces it
    assert plane.status(state, ep).missing == ["w2"]
    again = plane.up(state, ep)
    assert again.detail == "started w2" and again.healthy and [w.name for w in again.workers] == ["w1", "w2", "w3"]


def test_a_finished_task_whose_result_is_lost_is_not_run_again(private_plane, lake):
    """Dask recomputes a finished task elsewhere when the worker holding its result dies (allowed-failures does
    not cover that); the task's claim at the scheduler makes the second run refuse."""
    state, ep = private_plane
    status = plane.up(state, ep, 2)
    t = f"{SCHEMA}.lost_result"
    lake.run(f"CREATE OR REPLACE TABLE {t} (n INTEGER)")
    with WorkerPlane(status.address, ep) as wp:
        future = wp.submit(f"INSERT INTO {t} VALUES (1)")
        first = future.result(timeout=60)  # Dask's own result: the future (and its result on the worker) stay held
        assert first.ok
        os.kill(_pids(state)[f"worker-{first.worker}"], signal.SIGKILL)
        # until Dask has noticed the lost result and computed the key again elsewhere: the scheduler then names another
        # worker as its holder. (Watching the future's status missed it: lost, then finished again within the few
        # milliseconds the second run's refusal takes, and the wait ran into its 30 s cap every time.)
        deadline = time.monotonic() + 30
        while set(wp.client.who_has([future]).get(future.key) or ()) in (set(), {first.address}):
            assert time.monotonic() < deadline, "Dask did not compute the lost result again within 30 s"
            time.sleep(0.05)
        again = wp.result(future, timeout_s=60)
        assert again.worker != first.worker and not again.ok and "was not run again" in again.error.error
    assert lake.scalar(f"SELECT count(*) FROM {t}") == 1


def test_the_plane_listens_on_loopback_only(private_plane):
    state, ep = private_plane
    plane.up(state, ep, 1)
    listening = [
        c.laddr
        for pid in _pids(state).values()
        for c in psutil.Process(pid).net_connections("inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert len(listening) >= 4  # scheduler, dashboard, the worker and its HTTP server
    assert {a.ip for a in listening} == {"127.0.0.1"}, listening


def test_down_leaves_no_process(private_plane):
    state, ep = private_plane
    plane.up(state, ep, 2)
    pids = _pids(state)
    assert set(pids) == {"scheduler", "worker-w1", "worker-w2"}
    msgs = plane.down(state)
    assert all("stopped" in m for m in msgs), msgs
    assert not [p for p in pids.values() if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not list(state.run_dir.glob("*.pid.json"))


def test_a_busy_dashboard_port_is_one_clear_line(private_plane):
    state, ep = private_plane
    port = state.settings()["dashboard_port"]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(KitError) as exc:
            plane.up(state, ep, 1)
    line = exc.value.line()
    assert line.startswith(f"Error: port {port} for the Dask dashboard is already in use by another program (")
    assert f"(pid {os.getpid()}) listens on it" in line and line.endswith(" with DUCKLAKE_DASHBOARD_PORT.")
    assert not list(state.run_dir.glob("*.pid.json"))


# -- --scheduler: a Dask cluster the test starts itself with the dask CLI --------------------------------------


def _dask(args: list[str], env: dict[str, str], log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dask", *args],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def test_a_users_dask_cluster_through_scheduler(stack, cli, tmp_path):
    port = procs.free_port()
    address = f"tcp://127.0.0.1:{port}"
    log = open(tmp_path / "dask.log", "wb")
    started = [_dask(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], NO_RETRIES_ENV, log)]
    try:
        started.append(
            _dask(
                [
                    "worker",
                    address,
                    "--name",
                    "their-worker",
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                    "--death-timeout",
                    "30",
                ],
                {},
                log,
            )
        )
        env = {**stack.env, "DUCKLAKE_SCHEDULER": address}
        result = cli(env, "up", "--json")
        assert result.exit_code == 0, result.output
        up = json.loads(result.stdout)["result"]["worker_plane"]
        assert up["managed"] is False and [w["name"] for w in up["workers"]] == ["their-worker"]
        assert up["workers"][0]["lake"] == "attached"
        with WorkerPlane(address, stack.platform.endpoints()) as wp:
            r = wp.run("SELECT count(*) FROM range(7)", worker="their-worker")
            assert (r.worker, r.rows) == ("their-worker", [(7,)])
    finally:
        for p in reversed(started):  # the worker first, while its scheduler is still there to say goodbye to
            _stop(p)
        log.close()


def test_a_scheduler_address_without_a_port_is_one_line(stack, cli):
    result = cli({**stack.env, "DUCKLAKE_SCHEDULER": "tcp://127.0.0.1"}, "workers")
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith("Error: cannot use the Dask scheduler address tcp://127.0.0.1 (")
    assert result.stderr.strip().endswith("Try: give it as tcp://host:port (or tls://host:port).")
    assert len(result.stderr.splitlines()) == 1


def test_a_scheduler_that_would_rerun_tasks_is_refused(stack, cli, tmp_path):
    port = procs.free_port()
    log = open(tmp_path / "dask.log", "wb")
    proc = _dask(
        ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
        {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "3"},
        log,
    )
    try:
        result = cli({**stack.env, "DUCKLAKE_SCHEDULER": f"tcp://127.0.0.1:{port}"}, "workers")
        assert result.exit_code == 3, result.output
        assert result.stderr.strip() == (
            f"Error: the Dask scheduler at tcp://127.0.0.1:{port} re-runs a task whose worker died (allowed-failures = 3), "
            "which could run a committed statement twice. "
            "Try: start it with DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0 in its environment."
        )
    finally:
        _stop(proc)
        log.close()
