"""The commit gate (lake/gate.py) on a real catalog: while another session holds the gate's advisory lock, a commit
from the kit waits for it (an autocommit write, a user's BEGIN ... COMMIT, `commit_with`, a task on the worker plane)
and lands once it is released; a COMMIT that raises and a process killed holding it both give it back; and the
optimistic path, without the gate, stays selectable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.gate import GATE_ENV, GATE_KEY, CommitGate, gate_mode
from ducklake_kit.lake.transactions import commit_with
from ducklake_kit.platforms import postgres

pytestmark = [pytest.mark.integration]
SCHEMA = "gate_test"
WAIT_S = 1.5  # how long a gated commit is seen waiting before the holder lets go


@pytest.fixture
def ep(stack):
    ep = stack.platform.endpoints()
    with Lake(ep) as lake:
        lake.run(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}; CREATE OR REPLACE TABLE {SCHEMA}.t (id INTEGER, what VARCHAR)")
    return ep


@pytest.fixture
def holder(ep) -> Iterator[psycopg.Connection]:
    """Another session of the catalog that holds the gate's lock until the test releases it (or the end)."""
    conn = postgres.connect(ep.pg, timeout=10)
    conn.execute("SELECT pg_advisory_lock(%s)", [GATE_KEY])
    try:
        yield conn
    finally:
        conn.close()


def rows(ep, what: str) -> int:
    with Lake(ep) as lake:
        return lake.scalar(f"SELECT count(*) FROM {SCHEMA}.t WHERE what = ?", [what])


def waiting_on_the_gate(ep) -> list[str]:
    """The sessions waiting for the gate's advisory lock, by application_name (the gate names its process)."""
    with postgres.connect(ep.pg, timeout=10) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid::bigint = %s AND l.objid::bigint = %s",
                [GATE_KEY >> 32, GATE_KEY & 0xFFFFFFFF],
            ).fetchall()
        ]


def waits_for_the_holder(
    ep, holder: psycopg.Connection, what: str, commit: Callable[[], None], pid: int | None = os.getpid()
) -> None:
    """`commit` (which writes one row `what`) waits while `holder` has the gate, and lands once it lets go; the
    waiting session is the gate of process `pid` (None: of some process, a worker's)."""
    done: list[BaseException | None] = []

    def run() -> None:
        try:
            commit()
            done.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            done.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WAIT_S)
    assert t.is_alive() and not done, f"the commit of {what!r} did not wait for the gate: {done}"
    waiting = waiting_on_the_gate(ep)
    assert (
        f"ducklake-kit commit gate pid {pid}" in waiting
        if pid
        else any(w.startswith("ducklake-kit commit gate pid ") for w in waiting)
    ), waiting
    assert rows(ep, what) == 0  # nothing committed while it waits
    holder.execute("SELECT pg_advisory_unlock(%s)", [GATE_KEY])
    t.join(60)
    assert done == [None], done
    assert rows(ep, what) == 1


def test_an_autocommit_write_waits_for_the_gate_and_lands_when_it_is_released(ep, holder):
    with Lake(ep) as lake:
        assert lake.gate is not None  # the default
        waits_for_the_holder(
            ep, holder, "autocommit", lambda: lake.run(f"INSERT INTO {SCHEMA}.t VALUES (1, 'autocommit')")
        )
        # a read does not take the gate: it answers at once while another session holds it
        holder.execute("SELECT pg_advisory_lock(%s)", [GATE_KEY])
        start = time.monotonic()
        assert lake.run(f"SELECT count(*) FROM {SCHEMA}.t")[0].rows == [(1,)]
        assert time.monotonic() - start < WAIT_S


def test_a_users_begin_commit_and_commit_with_wait_for_the_gate(ep, holder):
    with Lake(ep) as lake:
        # the statements run before the gate is needed: only the COMMIT waits
        lake.run(f"BEGIN; INSERT INTO {SCHEMA}.t VALUES (2, 'begin-commit')")
        waits_for_the_holder(ep, holder, "begin-commit", lambda: lake.run("COMMIT"))
        holder.execute("SELECT pg_advisory_lock(%s)", [GATE_KEY])
        waits_for_the_holder(
            ep,
            holder,
            "commit_with",
            lambda: commit_with(
                lake, lambda con: con.execute(f"INSERT INTO {SCHEMA}.t VALUES (3, 'commit_with')"), "gate test"
            ),
        )


def test_a_commit_that_raises_gives_the_gate_back(ep):
    with Lake(ep) as lake, Lake(ep, commit_gate="optimistic") as other:
        lake.run(f"CREATE TABLE {SCHEMA}.doomed (i INTEGER)")
        lake.begin()
        lake.con.execute(f"DROP TABLE {SCHEMA}.doomed")
        other.run(f"DROP TABLE {SCHEMA}.doomed")  # commits first: this transaction's DROP now conflicts
        with pytest.raises(Exception, match="(?i)conflict|drop"):
            lake.commit()
        assert not lake.in_transaction
        with postgres.connect(ep.pg, timeout=10) as conn:  # free again: another session takes it at once
            assert conn.execute("SELECT pg_try_advisory_lock(%s)", [GATE_KEY]).fetchone()[0] is True
        lake.run(f"INSERT INTO {SCHEMA}.t VALUES (4, 'after a failed commit')")  # and the lake commits through it
        assert rows(ep, "after a failed commit") == 1


def test_a_process_killed_holding_the_gate_leaves_it_free(ep, stack):
    code = (
        "import os, signal, sys\n"
        "from ducklake_kit.lake.gate import CommitGate\n"
        "from ducklake_kit.platforms.local import LocalPlatform\n"
        "from ducklake_kit.platforms.state import State\n"
        "from pathlib import Path\n"
        f"ep = LocalPlatform(State(Path({str(stack.home)!r})), pg_port={stack.pg_port}, s3_port={stack.s3_port}).endpoints()\n"
        "with CommitGate.of(ep.pg).held():\n"
        "    print('held', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    if stack.env["DUCKLAKE_PLATFORM"] != "local":
        pytest.skip("the killed process finds the catalog through the local platform")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "held" and proc.returncode == -9, proc.stderr
    with postgres.connect(ep.pg, timeout=10) as conn:
        conn.execute("SET lock_timeout = '10s'")  # PostgreSQL ended the dead process's session, and its lock with it
        conn.execute("SELECT pg_advisory_lock(%s)", [GATE_KEY])


def test_the_optimistic_path_stays_selectable(ep, holder, monkeypatch):
    # by argument: commits at once while the gate is held
    with Lake(ep, commit_gate="optimistic") as lake:
        assert lake.gate is None
        start = time.monotonic()
        lake.run(f"INSERT INTO {SCHEMA}.t VALUES (5, 'optimistic')")
        assert time.monotonic() - start < WAIT_S and rows(ep, "optimistic") == 1
    # by environment, the way a user or the worker plane chooses it
    monkeypatch.setenv(GATE_ENV, "optimistic")
    with Lake(ep) as lake:
        assert lake.gate is None
        lake.run(f"BEGIN; INSERT INTO {SCHEMA}.t VALUES (6, 'optimistic env'); COMMIT")
    assert rows(ep, "optimistic env") == 1
    monkeypatch.setenv(GATE_ENV, "sometimes")
    with pytest.raises(KitError, match="DUCKLAKE_COMMIT_GATE=sometimes is not a commit gate mode"):
        gate_mode()
    monkeypatch.delenv(GATE_ENV)
    assert gate_mode() == "advisory" and CommitGate.of(ep.pg) is CommitGate.of(ep.pg)  # one per process and catalog


def test_a_task_on_the_worker_plane_waits_for_the_gate(ep, stack, holder):
    from ducklake_kit.workers import WorkerPlane, plane

    status = plane.up(stack.state, ep, max(1, len(plane.running_workers(stack.state))))
    with WorkerPlane(status.address, ep) as wp:
        wp.run("SELECT 1")  # the worker's lake attached before the clock starts

        def task() -> None:
            r = wp.run(f"INSERT INTO {SCHEMA}.t VALUES (7, 'worker plane')")
            assert r.ok, r.error

        waits_for_the_holder(ep, holder, "worker plane", task, pid=None)


def test_a_new_server_on_an_old_address_gets_its_own_gate():
    # a reset and `up`, or a test's new stack on a port an earlier one had: same address, new password. The gate
    # kept from before would ask the new server with the old password ("refused the password", seen in the suite).
    from ducklake_kit.platforms.base import PgEndpoint

    old = PgEndpoint("127.0.0.1", 1, "ducklake", "old-password", "ducklake_catalog")
    new = PgEndpoint("127.0.0.1", 1, "ducklake", "new-password", "ducklake_catalog")
    assert CommitGate.of(old) is CommitGate.of(old)
    assert CommitGate.of(new) is not CommitGate.of(old) and CommitGate.of(new).pg.password == "new-password"
