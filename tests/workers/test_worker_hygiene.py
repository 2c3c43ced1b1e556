"""A task cannot poison the plane: what one task changes on its worker's pooled connection (databases attached or
detached, the default database) is undone before the next task, a worker whose lake was detached attaches it again
before its next task, and `workers` reports the lake attached only when the connection has it. Real Dask workers,
the real lake; tables only in the schema `hygiene_tests`."""

from __future__ import annotations

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.workers import WorkerPlane, plane

SCHEMA = "hygiene_tests"


@pytest.fixture(scope="module")
def workers(stack):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 2)
    assert [w.name for w in status.workers] == ["w1", "w2"], status
    with Lake(ep) as lake:
        lake.run(
            f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; "
            f"CREATE TABLE {SCHEMA}.kept AS SELECT 1 AS k"
        )
    with WorkerPlane(status.address, ep) as wp:
        yield wp
    with Lake(ep) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


def databases(wp: WorkerPlane, worker: str) -> list[str]:
    r = wp.run("SELECT database_name FROM duckdb_databases() WHERE NOT internal ORDER BY 1", worker=worker)
    assert r.ok, r.error
    return [row[0] for row in r.rows]


def test_a_database_a_task_attaches_is_gone_before_the_next_task(workers):
    before = databases(workers, "w1")
    # a file the worker's user may write would do the same; the workers may run as another user than the test
    evil = workers.run("ATTACH ':memory:' AS evil; CREATE TABLE evil.planted AS SELECT 1 AS p", worker="w1")
    assert evil.ok, evil.error
    assert databases(workers, "w1") == before and "evil" not in before
    seen = workers.run("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'planted'", worker="w1")
    assert seen.rows == [(0,)]


def test_a_task_that_detaches_the_lake_leaves_it_attached_for_the_next(workers):
    for name in ("w1", "w2"):  # what left BOTH workers without the lake: every later pipeline failed
        r = workers.run("USE memory; DETACH lake", worker=name)
        # it did detach: the task's own snapshot bookkeeping, after its statements, no longer finds the lake
        assert not r.ok and "last_committed_snapshot does not exist" in r.error.error, r.error
    for name in ("w1", "w2"):
        after = workers.run(f"SELECT k, current_database() FROM {SCHEMA}.kept", worker=name)
        assert after.ok and after.rows == [(1, "lake")], after.error
    assert {w.name: w.lake for w in workers.workers()} == {"w1": "attached", "w2": "attached"}


def test_the_default_database_and_schema_are_put_back(workers):
    moved = workers.run([f"USE lake.{SCHEMA}", "SELECT current_schema()"], worker="w2")
    assert moved.ok and moved.rows == [(SCHEMA,)], moved.error
    back = workers.run("SELECT current_database(), current_schema()", worker="w2")
    assert back.rows == [("lake", "main")]
    workers.run("USE local", worker="w2")
    assert workers.run("SELECT current_database()", worker="w2").rows == [("lake",)]


def _detach_outside_a_task(plugin: str, dask_worker=None):
    """Run in the worker's event loop (client.run), not as a task: the lake goes without any task noticing."""
    from ducklake_kit.workers.plugin import plugin_on

    lake_plugin = plugin_on(dask_worker, plugin)
    with lake_plugin.task_lock:
        lake_plugin.lake.con.execute("USE local")
        lake_plugin.lake.con.execute("DETACH lake")


def test_workers_reports_the_lake_from_the_connection_and_the_next_task_attaches_it(workers):
    import sys

    import cloudpickle

    address = workers.names()["w2"]
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import the tests
    try:
        workers.client.run(_detach_outside_a_task, workers.plugin, workers=[address])
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    listed = {w.name: w.lake for w in workers.workers()}
    assert listed["w1"] == "attached"
    assert listed["w2"].startswith("NOT attached: a task detached the lake's database"), listed
    r = workers.run(f"SELECT k FROM {SCHEMA}.kept", worker="w2")
    assert r.ok and r.rows == [(1,)], r.error
    assert {w.name: w.lake for w in workers.workers()}["w2"] == "attached"
