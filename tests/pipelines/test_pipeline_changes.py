"""Change-aware runs on the real lake and worker plane: a node is left `unchanged` when its normalised SQL and the
snapshots of the tables it reads are what they were at its last successful run, and runs (saying why) otherwise.

The oracle: after every change-aware run, the pipeline's tables hold what a `--force` run (every node rebuilt)
makes of the same inputs; a node wrongly left unchanged leaves a table that differs. Each test works in a schema of
its own, so the tests do not depend on one another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.pipelines import changes, dag, flow
from ducklake_kit.pipelines.runner import PipelineRun
from ducklake_kit.workers.config import PlaneConfig

PIPELINE = """
-- The tables below: `wide` from the source, two marts that read one column of it each, one from another source,
-- and a worker-local table made, read and dropped (its three nodes run together or not at all).
-- id: wide
CREATE OR REPLACE TABLE {s}.wide AS SELECT k, sum(v) AS v, sum(w) AS w FROM {s}.src GROUP BY k;

-- id: reads_v
CREATE OR REPLACE TABLE {s}.reads_v AS SELECT k, v * 2 AS v2 FROM {s}.wide;

-- id: reads_w
CREATE OR REPLACE TABLE {s}.reads_w AS SELECT k, w + 1 AS w1 FROM {s}.wide WHERE k > 0;

-- id: other
CREATE OR REPLACE TABLE {s}.other AS SELECT count(*) AS n, sum(x) AS x FROM {s}.src2;

-- id: mk_local
-- node: w1
CREATE OR REPLACE TABLE local.{s}_keys AS SELECT DISTINCT k FROM {s}.src;

-- id: use_local
CREATE OR REPLACE TABLE {s}.from_local AS SELECT count(*) AS n FROM local.{s}_keys;

-- id: drop_local
-- depends_on: use_local
-- node: w1
DROP TABLE local.{s}_keys;
"""
TABLES = ("wide", "reads_v", "reads_w", "other", "from_local")
ALL = {"wide", "reads_v", "reads_w", "other", "mk_local", "use_local", "drop_local"}


class Lab:
    """One schema, its source tables, the pipeline file over them, and the ways to run it."""

    def __init__(self, stack, folder: Path, schema: str, lake: Lake):
        self.ep = stack.platform.endpoints()
        self.lake = lake  # the module's one connection (each statement reads the newest snapshot)
        self.env = stack.env
        self.address = PlaneConfig.of(stack.state, None).address
        self.s = schema
        self.path = folder / f"{schema}.sql"
        self.write(PIPELINE)
        self.sql(
            f"DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; "
            f"CREATE TABLE {schema}.src AS SELECT i % 5 AS k, i AS v, 10 * i AS w FROM range(40) t(i); "
            f"CREATE TABLE {schema}.src2 AS SELECT i AS x FROM range(7) t(i)"
        )

    def write(self, text: str) -> None:
        self.path.write_text(text.format(s=self.s))

    def sql(self, text: str) -> None:
        self.lake.run(text)

    def run(self, **kw) -> PipelineRun:
        run = flow.run(self.path, self.address, self.ep, flow.Options(**kw)).run
        # the module's connection reads the lake as the run left it, or the oracle would compare older rows
        seen = self.lake.con.execute("SELECT count(*) FROM main.pipeline_runs WHERE run_id = ?", [run.run_id])
        assert seen.fetchall() == [(1,)], run.run_id
        return run

    def plan(self) -> dict[str, changes.Decision]:
        return flow.plan(self.path, self.address, self.ep).decisions

    def contents(self) -> dict[str, list[tuple]]:
        return {t: self.lake.con.execute(f"SELECT * FROM {self.s}.{t} ORDER BY ALL").fetchall() for t in TABLES}

    def equals_full_rebuild(self) -> None:
        """The lake's answers after a change-aware run equal those of a run that rebuilds every node."""
        left = self.contents()
        forced = self.run(force=True)
        assert {n.status for n in forced.nodes} == {"ok"}, forced.nodes
        assert {n.why for n in forced.nodes} == {"--force"}
        assert self.contents() == left


def statuses(run: PipelineRun) -> dict[str, str]:
    return {n.id: n.status for n in run.nodes}


def ran(run: PipelineRun) -> set[str]:
    return {n.id for n in run.nodes if n.status == "ok"}


@pytest.fixture
def lab(stack, workers, lake, tmp_path, request):
    return Lab(stack, tmp_path, f"pc_{request.node.name.removeprefix('test_')[:20]}", lake)


def test_a_second_run_leaves_every_node_unchanged_and_so_does_a_layout_edit(lab):
    first = lab.run()
    assert statuses(first) == dict.fromkeys(ALL, "ok") and {n.why for n in first.nodes} == {
        "new: no earlier run of this node"
    }
    second = lab.run()
    assert statuses(second) == dict.fromkeys(ALL, "unchanged"), second.nodes
    assert {n.reason for n in second.nodes} == {f"unchanged since run {first.run_id}"}
    assert second.ok and all(n.snapshot_id is None for n in second.nodes)
    assert not any(d.run for d in lab.plan().values())
    # whitespace, comments and the case of keywords are no change
    lab.write(
        PIPELINE.replace("SELECT k, v * 2 AS v2 FROM", "select k,\n       v*2 as v2 -- doubled\n  from").replace(
            "-- id: other\n", "-- id: other\n-- NOTE: a comment of the user's\n"
        )
    )
    third = lab.run()
    assert statuses(third) == dict.fromkeys(ALL, "unchanged"), third.nodes
    rows = lab.lake.con.execute(  # the history says why, with each node's fingerprint
        "SELECT node_id, status, why, fingerprint, inputs FROM pipeline_nodes WHERE run_id = ?", [third.run_id]
    ).fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows}["reads_v"] == ("unchanged", f"unchanged since run {first.run_id}")
    assert all(r[3] for r in rows)
    assert set(json.loads({r[0]: r[4] for r in rows}["wide"])) == {f"{lab.s}.src"}
    lab.equals_full_rebuild()


def test_an_sql_edit_reruns_the_node_and_only_the_readers_of_the_columns_it_changed(lab):
    lab.run()
    # a breaking change of one column: w is computed differently; reads_v does not read w
    lab.write(PIPELINE.replace("sum(w) AS w", "sum(w) * 10 AS w"))
    plan = lab.plan()
    assert {n for n, d in plan.items() if d.run} == {"wide", "reads_w"}
    assert plan["wide"].reason == "SQL changed (breaking: changes w)"
    assert plan["reads_w"].reason == "its input " + f"{lab.s}.wide was changed by node wide in this run"
    run = lab.run()
    assert ran(run) == {"wide", "reads_w"} and statuses(run)["reads_v"] == "unchanged", run.nodes
    lab.equals_full_rebuild()
    # a non-breaking change: a column added, which no node reads
    lab.write(PIPELINE.replace("sum(w) AS w", "sum(w) * 10 AS w, count(*) AS n"))
    assert lab.plan()["wide"].reason == "SQL changed (non-breaking: adds n)"
    run = lab.run()
    assert ran(run) == {"wide"}, run.nodes
    lab.equals_full_rebuild()
    # a change beyond the SELECT list (its WHERE): every column may change, so both readers run
    lab.write(
        PIPELINE.replace("sum(w) AS w", "sum(w) * 10 AS w, count(*) AS n").replace(
            "FROM {s}.src GROUP", "FROM {s}.src WHERE v > 3 GROUP"
        )
    )
    change = lab.plan()["wide"].change
    assert change.breaking and change.every
    run = lab.run()
    assert ran(run) == {"wide", "reads_v", "reads_w"}, run.nodes
    lab.equals_full_rebuild()


def test_an_outside_write_reruns_the_readers_of_that_table(lab):
    lab.run()
    lab.sql(f"INSERT INTO {lab.s}.src VALUES (1, 1000, 1000)")
    plan = lab.plan()
    assert plan["wide"].reason.startswith(f"its input {lab.s}.src changed (snapshot ")
    assert plan["mk_local"].run and plan["drop_local"].run and not plan["other"].run
    run = lab.run()
    # mk_local reads src; the worker-local table's other users run with it; `other` reads src2 only
    assert ran(run) == ALL - {"other"}, run.nodes
    assert run.node("reads_v").why == f"its input {lab.s}.wide was changed by node wide in this run"
    lab.equals_full_rebuild()
    lab.sql(f"UPDATE {lab.s}.src2 SET x = x + 1 WHERE x = 3")
    assert ran(lab.run()) == {"other"}
    lab.equals_full_rebuild()


def test_an_output_changed_or_dropped_outside_is_rebuilt(lab):
    first = lab.run()
    assert first.ok, first.nodes  # the outputs are there to change
    lab.sql(f"DELETE FROM {lab.s}.reads_v WHERE k = 1; DROP TABLE {lab.s}.reads_w")
    plan = lab.plan()
    assert plan["reads_v"].reason.startswith(f"its output {lab.s}.reads_v was changed outside this pipeline")
    assert plan["reads_w"].reason == f"its output {lab.s}.reads_w is missing"
    run = lab.run()
    assert ran(run) == {"reads_v", "reads_w"}, run.nodes
    lab.equals_full_rebuild()


def test_a_failed_node_runs_next_time_and_a_skip_never_hides_a_failure(lab, cli):
    lab.run()
    lab.sql(f"ALTER TABLE {lab.s}.src2 RENAME TO src2_away")
    failed = lab.run()
    assert statuses(failed)["other"] == "failed" and not failed.ok
    assert failed.node("other").why == f"its input {lab.s}.src2 is missing"
    assert {n for n, st in statuses(failed).items() if st == "unchanged"} == ALL - {"other"}
    lab.sql(f"ALTER TABLE {lab.s}.src2_away RENAME TO src2")
    plan = lab.plan()
    assert plan["other"].reason == f"its last run ({failed.run_id}) failed"
    again = lab.run()
    assert ran(again) == {"other"} and again.ok
    lab.equals_full_rebuild()


def test_cli_plan_says_why_and_run_json_and_force(lab, cli):
    lab.run()
    lab.write(PIPELINE.replace("v * 2 AS v2", "v * 3 AS v2"))
    plan = cli(lab.env, "pipeline", "plan", str(lab.path))
    assert plan.exit_code == 0, plan.output
    assert "A run now would run 1 of 7 node(s)" in plan.stdout
    assert "SQL changed (breaking: changes v2)" in plan.stdout
    assert plan.stdout.count("unchanged since run") == 6
    body = json.loads(cli(lab.env, "pipeline", "plan", str(lab.path), "--json").stdout)["result"]
    by_id = {n["id"]: n for n in body["nodes"]}
    assert by_id["reads_v"]["would_run"] is True and by_id["wide"]["would_run"] is False
    assert by_id["reads_v"]["decision"]["change"]["modified"] == ["v2"]
    run = cli(lab.env, "pipeline", "run", str(lab.path), "--json")
    assert run.exit_code == 0, run.output
    body = json.loads(run.stdout)["result"]
    assert (body["ok"], body["unchanged"], body["failed"], body["skipped"]) == (1, 6, 0, 0)
    nodes = {n["id"]: n for n in body["nodes"]}
    assert nodes["reads_v"]["why"].startswith("SQL changed") and nodes["wide"]["reason"].startswith("unchanged")
    text = cli(lab.env, "pipeline", "run", str(lab.path))
    assert text.exit_code == 0 and "PASS: 0 ok, 0 failed, 0 skipped, 7 unchanged" in text.stdout, text.output
    forced = cli(lab.env, "pipeline", "run", str(lab.path), "--force", "--json")
    assert json.loads(forced.stdout)["result"]["ok"] == 7


def test_fingerprints_ignore_layout_and_comments_but_not_names():
    base = dag.build("CREATE TABLE m.t AS SELECT a, sum(b) AS s FROM trips GROUP BY a").nodes["1"]
    same = dag.build("create  table M.T as\n select A, SUM(b) as s -- the sum\n from lake.main.trips group by a").nodes[
        "1"
    ]
    other = dag.build("CREATE TABLE m.t AS SELECT a, sum(c) AS s FROM trips GROUP BY a").nodes["1"]
    assert changes.sql_hash(base) == changes.sql_hash(same) != changes.sql_hash(other)


@pytest.mark.parametrize(
    ("after", "text"),
    [
        ("SELECT a, sum(b) AS s, count(*) AS n FROM t GROUP BY a", "non-breaking: adds n"),
        ("SELECT a FROM t GROUP BY a", "breaking: removes s"),
        ("SELECT a, max(b) AS s FROM t GROUP BY a", "breaking: changes s"),
        ("SELECT a, sum(b) AS s FROM t WHERE b > 0 GROUP BY a", "breaking: more than its SELECT list changed"),
        ("SELECT sum(b) AS s, a FROM t GROUP BY a", "breaking: its columns were reordered"),
    ],
)
def test_a_change_is_categorised_by_the_columns_it_touches(after, text):
    node = dag.build(f"CREATE TABLE m.x AS {after}").nodes["1"]
    assert (
        changes.column_change("CREATE TABLE m.x AS SELECT a, sum(b) AS s FROM t GROUP BY a", node)
        .describe()
        .startswith(text)
    )


def test_a_node_that_drops_a_lake_table_is_left_unchanged_while_the_table_stays_away(stack, workers, lake, tmp_path):
    s = "pc_drop"
    lab = Lab(stack, tmp_path, s, lake)
    lab.sql(f"CREATE TABLE {s}.old AS SELECT 1 AS x")
    lab.path.write_text(f"-- id: tidy\nDROP TABLE {s}.old;\n")
    assert statuses(lab.run()) == {"tidy": "ok"}
    assert statuses(lab.run()) == {"tidy": "unchanged"}  # run again, DROP TABLE (no IF EXISTS) would fail
    lab.sql(f"CREATE TABLE {s}.old AS SELECT 2 AS x")
    again = lab.run()
    assert statuses(again) == {"tidy": "ok"} and again.node("tidy").why.startswith(f"its output {s}.old was changed")


def test_a_run_that_leaves_out_the_maker_of_a_worker_local_table_still_knows_its_version(lab):
    # --select or --from-failed may choose a reader without the node that makes its worker-local table: the
    # table's version is then the maker's recorded fingerprint (it was "unknown", so the reader ran, found the
    # table gone, and the next full run ran the three of them again)
    lab.run()
    assert statuses(lab.run(select="use_local")) == {"use_local": "unchanged"}
    assert statuses(lab.run()) == dict.fromkeys(ALL, "unchanged")
