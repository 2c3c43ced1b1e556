"""Parallel DDL (issue 25): loop iterations that each run `CREATE TABLE IF NOT EXISTS t ...; INSERT INTO t ...` at once
on the worker plane, on a fresh catalog (NoETL's ducklake_test, step loop_insert_events), all succeed; a commit that
failed and did not land (its token is not in the lake) is run again, and recorded; one that landed never is.

Every answer is read from the lake by the test's own connection. Before the retries (steps/retries.py) a fresh
catalog failed 10 runs of 10: the workers' ATTACHes raced to create it ("Failed to initialize DuckLake") and, with
the commit gate off, their CREATEs raced ("Failed to commit DuckLake transaction"): `set_test_hooks(disabled=True)`
shows it again."""

from __future__ import annotations

import dataclasses
import json
import os
import textwrap
import uuid

import psycopg
import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.lake.gate import GATE_ENV, OPTIMISTIC
from ducklake_kit.steps import retries, runner
from ducklake_kit.steps.task import StepOptions, Target, run_step
from ducklake_kit.workers import WorkerPlane, plane

pytestmark = pytest.mark.integration
REPEATS = 3


@pytest.fixture(scope="module")
def wp(stack):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 2)
    with WorkerPlane(status.address, ep) as p:
        yield p


@pytest.fixture
def hooks(wp):
    """Set the workers' test hooks (retries.set_test_hooks); they are reset after the test."""

    def set_(conflicts: int = 0, disabled: bool = False, worker: str | None = None) -> None:
        wp.client.run(retries.set_test_hooks, conflicts, disabled, workers=[wp.address_of(worker)] if worker else None)

    yield set_
    wp.client.run(retries.set_test_hooks)


class Fresh:
    """A fresh catalog (its own PostgreSQL database and data path) as a step names it, and read on its own."""

    def __init__(self, stack):
        self.ep = stack.platform.endpoints()
        pg = self.ep.pg
        self.db = f"pddl_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
            con.execute(f"CREATE DATABASE {self.db}")
        self.dsn = f"postgresql://{pg.user}:{pg.password}@{pg.host}:{pg.port}/{self.db}"
        self.data_path = f"s3://raw/{self.db}/"

    def target(self) -> Target:
        return Target("fresh", dataclasses.replace(self.ep.pg, dbname=self.db), self.data_path)

    def rows(self, sql: str) -> list[tuple]:
        own = dataclasses.replace(self.ep, pg=dataclasses.replace(self.ep.pg, dbname=self.db), data_path=self.data_path)
        with Lake(own) as lake:
            return lake.con.execute(sql).fetchall()

    def commits(self) -> list[dict]:
        """Each snapshot's commit_extra_info, from the catalog's own tables in PostgreSQL."""
        with psycopg.connect(self.ep.pg.libpq(self.db), autocommit=True) as con:
            rows = con.execute(
                "SELECT commit_extra_info FROM ducklake_snapshot_changes WHERE commit_extra_info IS NOT NULL"
            ).fetchall()
        return [json.loads(r[0]) for r in rows]


LOOP = """\
    metadata: {{name: pddl}}
    workload:
      ids: {ids}
    workflow:
      - step: loop_insert_events
        loop: {{collection: "{{{{ ids }}}}", element: user_id, mode: async}}
        tool: ducklake
        catalog_connection: "{{{{ dsn }}}}"
        catalog_name: fresh
        data_path: {data_path}
        command: |
          CREATE TABLE IF NOT EXISTS user_events (user_id INTEGER, event_type VARCHAR, event_time TIMESTAMP);
          INSERT INTO user_events (user_id, event_type, event_time) VALUES ({{{{ user_id }}}}, 'test_event', NOW());
    """


def _loop(stack, wp, tmp_path, n: int):
    fresh = Fresh(stack)
    path = tmp_path / f"{fresh.db}.yaml"
    path.write_text(textwrap.dedent(LOOP.format(ids=list(range(n)), data_path=fresh.data_path)))
    overrides = {"dsn": fresh.dsn}
    return fresh, runner.run(runner.load(path, overrides), wp, stack.home, overrides=overrides)


@pytest.mark.parametrize("n", [5, 8])
def test_iterations_that_create_the_same_table_at_once_on_a_fresh_catalog_all_succeed(stack, wp, tmp_path, n):
    retried = []
    for _ in range(REPEATS):  # before the retries: 10 of 10 fresh catalogs failed
        fresh, run = _loop(stack, wp, tmp_path, n)
        iterations = run.as_dict()["steps"][0]["result"]["iterations"]
        assert run.ok, [it["error"] for it in iterations if it["status"] != "ok"]
        retried += [why for it in iterations for why in it["result"].get("retried", [])]
        assert len({it["worker"] for it in iterations}) == 2  # both workers took part
        assert fresh.rows("SELECT user_id FROM user_events ORDER BY 1") == [(i,) for i in range(n)]  # one row each
        # each INSERT's commit carries a token of its own, and each landed once
        tokens = [c["commit"] for c in fresh.commits() if c.get("statement") == [0, 1]]
        assert len(tokens) == len(set(tokens)) == n
    # the race happened (the workers' ATTACHes both created the catalog), and the run's result says so
    assert any(why.startswith("ATTACH, try 1: another worker was creating catalog pddl_") for why in retried), retried


def _at_once(wp, fresh: Fresh, sqls: list[str]):
    """The step tasks, submitted together, one per worker in turn, as a parallel loop does."""
    names = sorted(wp.names())
    futures = [
        wp.submit_call(run_step, fresh.target(), [sql], {}, StepOptions(with_info=False), worker=names[i % len(names)])
        for i, sql in enumerate(sqls)
    ]
    return [f.result() for f in futures]


def test_the_attach_that_lost_the_race_to_create_a_catalog_is_retried_and_recorded(stack, wp):
    recorded = 0
    for _ in range(REPEATS):
        fresh = Fresh(stack)
        tasks = _at_once(
            wp, fresh, [f"CREATE TABLE IF NOT EXISTS t (i INTEGER); INSERT INTO t VALUES ({i})" for i in range(2)]
        )
        assert not any(t.failed for t in tasks), [(t.error, [s.error for s in t.statements]) for t in tasks]
        assert fresh.rows("SELECT i FROM t ORDER BY 1") == [(0,), (1,)]
        for t in tasks:
            for why in t.retries:
                assert why.startswith("ATTACH, try 1: another worker was creating catalog " + fresh.db), why
                assert "Failed to initialize DuckLake" in why and why.endswith("so it was tried again"), why
                recorded += 1
    assert recorded >= 1  # the race happened at least once (it did in 10 of 10 before the retries)


def test_a_write_whose_commit_failed_and_did_not_land_is_run_again_nothing_lost_or_doubled(stack, wp, hooks):
    fresh = Fresh(stack)
    _at_once(wp, fresh, ["CREATE TABLE t (i INTEGER)", "SELECT 1"])  # both workers attached
    hooks(conflicts=2)  # each worker's next two commits fail: a competing commit takes their snapshot id
    tasks = _at_once(wp, fresh, [f"INSERT INTO t VALUES ({i})" for i in range(4)])
    assert not any(t.failed for t in tasks), [[s.error for s in t.statements] for t in tasks]
    assert fresh.rows("SELECT i, count(*) FROM t GROUP BY i ORDER BY i") == [
        (i, 1) for i in range(4)
    ]  # 0 lost, 0 twice
    tried = [why for t in tasks for s in t.statements for why in s.retries]
    assert len(tried) == 4, tried  # two per worker (its first INSERT twice), each recorded with its reason
    assert sorted(why.split(":")[0] for why in tried) == ["try 1", "try 1", "try 2", "try 2"], tried
    assert all("it did not land (its token is not in the lake), so it ran again" in why for why in tried), tried


def test_a_transaction_step_whose_commit_did_not_land_runs_again_whole(stack, wp, hooks):
    fresh = Fresh(stack)
    _at_once(wp, fresh, ["CREATE TABLE t (i INTEGER)", "SELECT 1"])
    hooks(conflicts=1, worker="w1")
    target = fresh.target()
    task = wp.submit_call(
        run_step,
        target,
        ["INSERT INTO t VALUES (1)", "INSERT INTO t VALUES (2)"],
        {},
        StepOptions(message="pddl: both", commit_token=uuid.uuid4().hex, extra={}, with_info=False),
        worker="w1",
    ).result()
    assert not task.failed and task.snapshot_id is not None, (task.error, task.retries)
    assert len(task.retries) == 1 and "so the transaction ran again" in task.retries[0], task.retries
    assert fresh.rows("SELECT i FROM t ORDER BY i") == [(1,), (2,)]  # one snapshot, each row once
    assert [s.snapshot_id for s in task.statements] == [task.snapshot_id] * 2


def test_without_the_retries_the_injected_fault_fails_the_write_and_says_it_did_not_land(stack, wp, hooks):
    """The fault is real: with the retries off it fails the statement, and the lake holds nothing of it."""
    fresh = Fresh(stack)
    _at_once(wp, fresh, ["CREATE TABLE t (i INTEGER)", "SELECT 1"])
    hooks(conflicts=1, disabled=True, worker="w1")
    (task,) = _at_once(wp, fresh, ["INSERT INTO t VALUES (1)"])
    (failed,) = [s for s in task.statements if s.error]
    assert "did not land (its token is not in the lake) after 1 tries: nothing of it committed" in failed.error
    assert fresh.rows("SELECT count(*) FROM t") == [(0,)]


@pytest.fixture
def optimistic_plane(stack, wp):
    """The worker plane restarted with the commit gate off (DUCKLAKE_COMMIT_GATE=optimistic, DuckLake's own retries
    only, as a writer outside the kit commits): the CREATEs race in the catalog itself. A normal plane after."""
    ep = stack.platform.endpoints()
    plane.down(stack.state)
    old = os.environ.get(GATE_ENV)
    os.environ[GATE_ENV] = OPTIMISTIC  # the workers inherit it
    try:
        status = plane.up(stack.state, ep, 2)
    finally:
        os.environ.pop(GATE_ENV) if old is None else os.environ.__setitem__(GATE_ENV, old)
    try:
        with WorkerPlane(status.address, ep) as p:
            yield p
    finally:
        plane.down(stack.state)
        plane.up(stack.state, ep, 2)


def test_with_the_commit_gate_off_the_create_that_lost_is_retried_and_the_conflict_named(stack, optimistic_plane):
    """The issue's own error: "Failed to commit DuckLake transaction" when two workers create user_events at once
    (10 of 10 fresh catalogs before the retries)."""
    named = []
    for n in (5, 8):
        for _ in range(REPEATS):
            fresh = Fresh(stack)
            _at_once(
                optimistic_plane, fresh, ["SELECT 1", "SELECT 1"]
            )  # both attached: the CREATEs race, not the ATTACH
            sql = "CREATE TABLE IF NOT EXISTS user_events (user_id INTEGER); INSERT INTO user_events VALUES ({})"
            tasks = _at_once(optimistic_plane, fresh, [sql.format(i) for i in range(n)])
            assert not any(t.failed for t in tasks), [[s.error for s in t.statements] for t in tasks]
            assert fresh.rows("SELECT user_id FROM user_events ORDER BY 1") == [(i,) for i in range(n)]
            named += [why for t in tasks for s in t.statements for why in s.retries]
    assert named, "no CREATE lost the race in 6 fresh catalogs"
    created = [why for why in named if "created main.user_events at the same time" in why]
    assert created and all(why.startswith("try 1: another worker (w") for why in created), named
    assert all("Failed to commit DuckLake transaction" in why for why in created), created


def test_a_write_to_a_worker_local_table_makes_no_snapshot_of_the_lake(stack, wp):
    """Each autocommit write is its own transaction carrying a commit message: one that touches only the worker's
    local database must still commit nothing to the lake."""
    ep = stack.platform.endpoints()
    with Lake(ep) as lake:
        before = lake.current_snapshot()
        target = Target("lake", None, ep.data_path)
        sql = "CREATE OR REPLACE TABLE local.pddl_x AS SELECT 1 AS one; INSERT INTO local.pddl_x VALUES (2)"
        task = wp.submit_call(run_step, target, [sql], {}, StepOptions(with_info=False), worker="w1").result()
        assert not task.failed, [s.error for s in task.statements]
        assert [s.affected_rows for s in task.statements] == [None, 1] and not any(
            s.snapshot_id for s in task.statements
        )
        assert lake.current_snapshot() == before


def test_only_a_write_whose_tables_are_all_in_the_tokens_catalog_is_decided_by_its_token(stack):
    """A commit to another catalog carries no token there: its failure is never tried again on the token's word."""
    with Lake(stack.platform.endpoints()) as lake:
        lake.con.execute("ATTACH ':memory:' AS other")
        for sql in [
            "INSERT INTO t VALUES (1)",
            "CREATE TABLE IF NOT EXISTS s.t (i INTEGER)",
            "INSERT INTO lake.s.t SELECT * FROM read_parquet('s3://raw/x.parquet')",
        ]:
            assert retries.token_decides(lake, sql), sql
        for sql in [
            "INSERT INTO other.t VALUES (1)",
            "INSERT INTO t SELECT * FROM other.main.u",
            "INSERT INTO t VALUES (",  # does not parse: undecided
        ]:
            assert not retries.token_decides(lake, sql), sql
        lake.con.execute("USE other")
        assert not retries.token_decides(lake, "INSERT INTO t VALUES (1)")  # unqualified: the default database
