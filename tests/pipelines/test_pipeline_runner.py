"""Pipelines run on the real worker plane (two Dask worker processes) against the real lake. Order is proven by the
workers' own start and finish times: a node starts after every dependency finished, independent slow nodes overlap,
and a dependent starts while an unrelated slow node is still running (no barrier per wave). Everything here writes
the schema `pipeline_tests`, plus the history tables in main (filtered by run id)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.pipelines import flow
from ducklake_kit.pipelines.runner import PipelineRun
from ducklake_kit.workers import WorkerPlane
from ducklake_kit.workers.config import PlaneConfig

S = "pipeline_tests"


def busy(seconds: float) -> str:
    """A CPU-bound query of roughly `seconds` on one DuckDB thread here (its result is not used)."""
    return f"SELECT sum(length(md5(i::VARCHAR))) AS busy FROM range({int(seconds * 4_000_000)}) t(i)"


class Pipes:
    def __init__(self, stack, folder: Path):
        self.ep = stack.platform.endpoints()
        self.address = PlaneConfig.of(stack.state, None).address
        self.folder = folder

    def file(self, name: str, source: str) -> Path:
        path = self.folder / f"{name}.sql"
        path.write_text(source)
        return path

    def run(self, name: str, source: str | None = None, **kw) -> PipelineRun:
        path = self.folder / f"{name}.sql" if source is None else self.file(name, source)
        outcome = flow.run(path, self.address, self.ep, flow.Options(**kw))
        return outcome.run if outcome else None


@pytest.fixture(scope="module")
def pipes(stack, workers, lake, tmp_path_factory):
    ep = stack.platform.endpoints()
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}")
    yield Pipes(stack, tmp_path_factory.mktemp("pipelines"))
    with WorkerPlane(workers.address, ep) as wp:  # the worker-local tables these tests made go with them
        for name in wp.names():
            wp.run("DROP TABLE IF EXISTS local.p_eph", worker=name)


def after(run: PipelineRun, child: str, parent: str) -> bool:
    c, p = run.node(child), run.node(parent)
    return c.started_at >= p.finished_at


def overlap(run: PipelineRun, a: str, b: str) -> bool:
    x, y = run.node(a), run.node(b)
    return x.started_at < y.finished_at and y.started_at < x.finished_at


def test_a_chain_runs_in_order_whatever_the_file_order(pipes, lake):
    # Sord ran the chain 1->2->3 as 1, 3, 2
    run = pipes.run(
        "chain",
        f"""
-- id: 3
-- depends_on: 2
CREATE OR REPLACE TABLE {S}.c3 AS SELECT x * 10 AS x FROM {S}.c2;
-- id: 1
CREATE OR REPLACE TABLE {S}.c1 AS SELECT 1 AS x;
-- id: 2
-- depends_on: 1
CREATE OR REPLACE TABLE {S}.c2 AS SELECT x + 1 AS x FROM {S}.c1;
""",
    )
    assert run.ok, [n.as_dict() for n in run.nodes]
    assert after(run, "2", "1") and after(run, "3", "2")
    assert lake.scalar(f"SELECT x FROM {S}.c3") == 20


def test_a_diamond_joins_after_both_branches_and_the_branches_overlap(pipes, lake):
    # Sord ran 4 before 2 and 3, and ran siblings one after another
    run = pipes.run(
        "diamond",
        f"""
-- id: 1
CREATE OR REPLACE TABLE {S}.d1 AS SELECT 5 AS x;
-- id: 2
-- depends_on: 1
CREATE OR REPLACE TABLE {S}.d2 AS SELECT x, (SELECT busy FROM ({busy(1.0)})) AS b FROM {S}.d1;
-- id: 3
-- depends_on: 1
CREATE OR REPLACE TABLE {S}.d3 AS SELECT x, (SELECT busy FROM ({busy(1.0)})) AS b FROM {S}.d1;
-- id: 4
-- depends_on: 2, 3
CREATE OR REPLACE TABLE {S}.d4 AS SELECT d2.x + d3.x AS x FROM {S}.d2 JOIN {S}.d3 USING (x);
""",
    )
    assert run.ok, [n.as_dict() for n in run.nodes]
    assert all(after(run, c, p) for c, p in [("2", "1"), ("3", "1"), ("4", "2"), ("4", "3")])
    assert overlap(run, "2", "3"), "two independent slow nodes ran one after the other on two workers"
    assert {run.node("2").worker, run.node("3").worker} == {"w1", "w2"}
    assert lake.scalar(f"SELECT x FROM {S}.d4") == 10


def test_a_dependent_starts_as_soon_as_its_dependency_is_done_not_after_the_wave(pipes):
    run = pipes.run(
        "nobarrier",
        f"""
-- id: slow
{busy(2.0)};
-- id: fast
SELECT 1;
-- id: next
-- depends_on: fast
SELECT 2;
""",
    )
    assert run.ok
    assert run.node("next").started_at < run.node("slow").finished_at, "next waited for the slow node of wave 1"


FAILING = f"""
-- id: bad
CREATE OR REPLACE TABLE {S}.f_bad AS SELECT 'abc'::INTEGER AS x;
-- id: child
-- depends_on: bad
CREATE OR REPLACE TABLE {S}.f_child AS SELECT x FROM {S}.f_bad;
-- id: grandchild
-- depends_on: child
SELECT count(*) FROM {S}.f_child;
-- id: sibling
CREATE OR REPLACE TABLE {S}.f_sibling AS SELECT 7 AS x;
"""


def test_a_failure_skips_its_descendants_keeps_the_error_and_lets_the_rest_go_on(pipes, lake):
    run = pipes.run("failing", FAILING)
    status = {n.id: n.status for n in run.nodes}
    assert status == {"bad": "failed", "child": "skipped", "grandchild": "skipped", "sibling": "ok"}
    assert "Could not convert string 'abc' to INT32" in run.node("bad").error  # DuckDB's own words
    assert run.node("child").reason == "not run: its dependency bad failed"
    assert run.node("grandchild").reason == "not run: its dependency child was skipped (its dependency bad failed)"
    assert run.node("child").started_at is None and run.node("child").worker is None
    assert not run.ok
    tables = {
        r[0]
        for r in lake.con.execute(
            f"SELECT table_name FROM duckdb_tables() WHERE schema_name = '{S}' AND table_name LIKE 'f_%'"
        ).fetchall()
    }
    assert tables == {"f_sibling"}


def test_from_failed_reruns_only_the_failed_and_skipped_nodes(pipes, lake):
    first = pipes.run("failing", FAILING)
    assert not first.ok
    pipes.file("failing", FAILING.replace("'abc'::INTEGER", "41 + 1"))
    again = pipes.run("failing", from_failed=True)
    assert [n.id for n in again.nodes] == ["bad", "child", "grandchild"] and again.ok
    assert again.selector == f"from-failed {first.run_id}"
    assert lake.scalar(f"SELECT x FROM {S}.f_child") == 42
    assert pipes.run("failing", from_failed=True) is None  # nothing left to re-run


def test_select_runs_a_node_with_its_ancestors(pipes):
    source = f"""
-- id: a
CREATE OR REPLACE TABLE {S}.s_a AS SELECT 1 AS x;
-- id: b
CREATE OR REPLACE TABLE {S}.s_b AS SELECT x FROM {S}.s_a;
-- id: c
CREATE OR REPLACE TABLE {S}.s_c AS SELECT x FROM {S}.s_b;
-- id: other
SELECT 1;
"""
    assert [n.id for n in pipes.run("select", source, select="+b").nodes] == ["a", "b"]
    assert [n.id for n in pipes.run("select", source, select="b+").nodes] == ["b", "c"]


def test_each_lake_writing_node_commits_its_own_snapshot_with_a_message(pipes, lake):
    lake.run(f"DROP SCHEMA IF EXISTS {S}_m")
    run = pipes.run(
        "messages",
        f"""
-- id: schema
CREATE SCHEMA IF NOT EXISTS {S}_m;
-- id: one
CREATE OR REPLACE TABLE {S}.m1 AS SELECT 1 AS x;
-- id: two
INSERT INTO {S}.m1 SELECT 2;
-- id: read
SELECT count(*) FROM {S}.m1;
""",
    )
    assert run.ok
    snaps = {n.id: n.snapshot_id for n in run.nodes}
    assert snaps["read"] is None and None not in (snaps["one"], snaps["two"]) and snaps["one"] != snaps["two"]
    messages = dict(
        lake.con.execute(
            "SELECT snapshot_id, commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id IN (?, ?, ?)",
            [snaps["schema"], snaps["one"], snaps["two"]],
        ).fetchall()
    )
    assert messages == {snaps[n]: f"pipeline messages: node {n} (run {run.run_id})" for n in ("schema", "one", "two")}
    # each snapshot holds exactly its node's write
    assert [lake.scalar(f"SELECT count(*) FROM {S}.m1 AT (VERSION => {snaps[n]})") for n in ("one", "two")] == [1, 2]
    assert run.node("read").statements[0].rows == [(2,)]


def test_worker_local_tables_stay_on_their_worker_and_lineage_says_where(pipes, lake):
    source = f"""
-- id: eph
-- node: w2
CREATE OR REPLACE TABLE local.p_eph AS SELECT range AS zone_id, range * 2 AS n FROM range(5);
-- id: ids
CREATE OR REPLACE TABLE {S}.l_ids AS SELECT 1 AS x UNION ALL SELECT 3;
-- id: keep
CREATE OR REPLACE TABLE {S}.kept AS SELECT e.zone_id, e.n FROM local.p_eph e WHERE e.zone_id IN (SELECT x FROM {S}.l_ids);
"""
    run = pipes.run("local", source)
    assert run.ok, [n.as_dict() for n in run.nodes]
    assert [run.node(n).worker for n in ("eph", "keep")] == ["w2", "w2"]
    rows = lake.con.execute(
        "SELECT child, parent, node_id, location, parent_location FROM lineage_tables "
        "WHERE pipeline = 'local' ORDER BY ALL"
    ).fetchall()
    assert rows == [
        (f"{S}.kept", "local.p_eph", "keep", "lake", "w2"),
        (f"{S}.kept", f"{S}.l_ids", "keep", "lake", "lake"),
    ]
    assert lake.con.execute(f"SELECT * FROM {S}.kept ORDER BY ALL").fetchall() == [(1, 2), (3, 6)]
    cols = lake.con.execute(
        "SELECT child_column, parent, parent_column FROM lineage_columns "
        "WHERE pipeline = 'local' AND node_id = 'keep' ORDER BY ALL"
    ).fetchall()
    assert cols == [("n", "local.p_eph", "n"), ("zone_id", "local.p_eph", "zone_id")]
    pipes.run("local", source)  # a re-run replaces the lineage rows instead of adding copies
    assert lake.scalar("SELECT count(*) FROM lineage_tables WHERE pipeline = 'local'") == 2
    assert lake.scalar("SELECT count(*) FROM lineage_columns WHERE pipeline = 'local'") == 2
    runs = lake.con.execute(
        "SELECT count(*), count(DISTINCT run_id) FROM pipeline_runs WHERE pipeline = 'local'"
    ).fetchone()
    assert runs == (2, 2)


def test_the_modules_one_connection_reads_what_another_committed_after_it_attached(pipes, lake, stack):
    """The premise of the modules that read the lake through one connection (conftest.py's `lake`): each statement
    reads the newest snapshot, so what a worker or another connection commits later is seen, not an older lake."""
    lake.run(f"CREATE OR REPLACE TABLE {S}.seen AS SELECT 1 AS x")
    before = lake.current_snapshot()
    with Lake(stack.platform.endpoints()) as other:
        other.write(f"INSERT INTO {S}.seen VALUES (2)")
        landed = other.current_snapshot()
    assert landed > before
    assert lake.current_snapshot() == landed
    assert lake.con.execute(f"SELECT x FROM {S}.seen ORDER BY x").fetchall() == [(1,), (2,)]


def test_history_in_the_lake_matches_the_run(pipes, lake):
    run = pipes.run("failing2", FAILING.replace("f_", "g_"))
    rows = lake.con.execute(
        "SELECT node_id, status, worker, error, reason, snapshot_id FROM pipeline_nodes "
        "WHERE run_id = ? ORDER BY node_id",
        [run.run_id],
    ).fetchall()
    assert rows == sorted((n.id, n.status, n.worker, n.error, n.reason, n.snapshot_id) for n in run.nodes)
    assert lake.con.execute(
        "SELECT status, nodes_ok, nodes_failed, nodes_skipped FROM pipeline_runs WHERE run_id = ?", [run.run_id]
    ).fetchone() == ("failed", 1, 1, 2)


def test_a_node_over_its_timeout_is_interrupted_on_its_worker_and_only_it(pipes):
    run = pipes.run(
        "timeout",
        f"-- id: slow\n-- node: w1\n{busy(20)};\n-- id: after\n-- depends_on: slow\nSELECT 1;\n-- id: free\nSELECT 2;",
        timeout_s=0.5,
    )
    slow = run.node("slow")
    assert slow.status == "failed" and slow.error.startswith("interrupted after the task's timeout of 0.5s"), slow.error
    assert slow.duration_ms < 10_000
    assert run.node("after").status == "skipped" and run.node("free").status == "ok"
    # the next task on the same worker runs to its end: no interrupt meant for the slow node reaches it
    later = pipes.run("timeout-after", f"-- node: w1\n{busy(1.0)}")
    assert later.ok and later.node("1").worker == "w1", later.nodes
    # a node within its timeout is not interrupted, and its commit is never interrupted either
    quick = pipes.run("timeout-ok", f"CREATE OR REPLACE TABLE {S}.t_ok AS SELECT 1 AS x", timeout_s=30)
    assert quick.ok and quick.node("1").snapshot_id is not None


def test_cli_json_plan_and_run_and_exit_codes(pipes, stack, cli):
    path = pipes.file("cli", FAILING.replace("f_", "h_"))
    plan = cli(stack.env, "pipeline", "plan", str(path), "--json")
    assert plan.exit_code == 0, plan.output
    body = json.loads(plan.stdout)
    assert body["status"] == "ok" and body["result"]["waves"] == [["bad", "sibling"], ["child"], ["grandchild"]]
    assert body["result"]["workers"] == ["w1", "w2"]
    run = cli(stack.env, "pipeline", "run", str(path), "--json")
    assert run.exit_code == 1, run.output
    body = json.loads(run.stdout)
    assert body["status"] == "error" and body["catalog_info"]["snapshot_id"] >= body["result"]["history_snapshot"]
    nodes = {n["id"]: n for n in body["result"]["nodes"]}
    assert {k: n["status"] for k, n in nodes.items()} == {
        "bad": "failed",
        "child": "skipped",
        "grandchild": "skipped",
        "sibling": "ok",
    }
    ok = nodes["sibling"]
    assert ok["started_at"].endswith("+00:00") and len(ok["started_at"].split(".")[1]) == len("123456+00:00")
    assert ok["duration_ms"] > 0 and ok["statements"][0]["statement_type"] == "CREATE"
    pinned = pipes.file("pinned", "-- node: w9\nSELECT 1")
    bad = cli(stack.env, "pipeline", "run", str(pinned))
    assert bad.exit_code == 3
    assert bad.stderr.strip().startswith(
        f"Error: {pinned}:1: node 1 must run on worker 'w9', which is not running (running: w1, w2)."
    )
