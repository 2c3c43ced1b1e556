"""Audits (`-- audit:`) on the real lake and worker plane: each kind passes on clean data and fails on data that
breaks it; a failed audit fails its node, skips its dependents with the reason, and rolls its write back (the
table's rows are those of the last good run and the only new snapshot is the run's history). Header errors are
one line naming the file and line (no services)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.pipelines import dag, flow
from ducklake_kit.pipelines.sqlfile import PipelineError
from ducklake_kit.workers.config import PlaneConfig

S = "pipeline_audits"
GOOD = "SELECT * FROM (VALUES (1, 'a'), (2, 'b'), (3, 'a')) v(k, s)"
# audit -> the source rows that break it
CASES = {
    "not_null(k)": "SELECT * FROM (VALUES (1, 'a'), (NULL, 'b')) v(k, s)",
    "unique(k)": "SELECT * FROM (VALUES (1, 'a'), (1, 'b'), (NULL, 'a'), (NULL, 'a')) v(k, s)",
    "accepted_values(s, 'a', 'b')": "SELECT * FROM (VALUES (1, 'a'), (2, 'c'), (3, NULL)) v(k, s)",
    "row_count > 0": "SELECT 1 AS k, 'a' AS s WHERE false",
    "sql_file('audits/no_negative.sql')": "SELECT * FROM (VALUES (1, 'a'), (-2, 'b')) v(k, s)",
}


class Audited:
    """The module's folder, its one lake connection (each statement reads the newest snapshot), and runs."""

    def __init__(self, stack, folder: Path, lake: Lake):
        self.ep = stack.platform.endpoints()
        self.address = PlaneConfig.of(stack.state, None).address
        self.folder = folder
        self.lake = lake

    def sql(self, text: str):
        return self.lake.con.execute(text).fetchall()

    def run(self, path: Path) -> flow.RunOutcome:
        outcome = flow.run(path, self.address, self.ep)
        # the module's connection reads the lake as the run left it (else a rolled-back table would be read old)
        assert self.sql(f"SELECT count(*) FROM main.pipeline_runs WHERE run_id = '{outcome.run.run_id}'") == [(1,)]
        return outcome

    def snapshots(self) -> int:
        return self.lake.con.execute(f"SELECT count(*) FROM ducklake_snapshots('{self.lake.alias}')").fetchone()[0]

    def last_snapshot(self) -> int:
        return self.lake.current_snapshot()


@pytest.fixture(scope="module")
def audited(stack, workers, lake, tmp_path_factory):
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}")
    return Audited(stack, tmp_path_factory.mktemp("audits"), lake)


@pytest.mark.parametrize("audit", list(CASES))
def test_each_audit_passes_on_clean_data_and_fails_on_data_that_breaks_it(audited, audit):
    name = "".join(c for c in audit.split("(")[0].split(" ")[0] if c.isalnum() or c == "_")
    src, built, child = f"{S}.src_{name}", f"{S}.built_{name}", f"{S}.child_{name}"
    (audited.folder / "audits").mkdir(exist_ok=True)
    (audited.folder / "audits" / "no_negative.sql").write_text(f"SELECT * FROM {built} WHERE k < 0;\n")
    path = audited.folder / f"{name}.sql"
    path.write_text(
        f"-- id: build\n-- audit: {audit}\nCREATE OR REPLACE TABLE {built} AS SELECT * FROM {src};\n\n"
        f"-- id: child\nCREATE OR REPLACE TABLE {child} AS SELECT count(*) AS n FROM {built};\n"
    )
    audited.sql(f"CREATE OR REPLACE TABLE {src} AS {GOOD}")
    plan = flow.plan(path, audited.address, audited.ep).as_dict()
    assert plan["nodes"][0]["audits"][0]["audit"] == audit and plan["nodes"][0]["audited"] == built

    good = audited.run(path)
    assert {n.id: n.status for n in good.run.nodes} == {"build": "ok", "child": "ok"}, good.run.nodes
    assert good.run.node("build").audits == [{"audit": audit, "table": built, "status": "passed", "error": None}]
    rows = audited.sql(f"SELECT * FROM {built} ORDER BY ALL")
    assert rows == [(1, "a"), (2, "b"), (3, "a")]

    audited.sql(f"CREATE OR REPLACE TABLE {src} AS {CASES[audit]}")
    before = audited.snapshots()
    bad = audited.run(path)
    build = bad.run.node("build")
    assert (build.status, bad.run.node("child").status) == ("failed", "skipped"), bad.run.nodes
    assert f"audit {audit} failed on {built}: " in build.error and build.error.endswith("(rolled back)"), build.error
    assert bad.run.node("child").reason == "not run: its dependency build failed"
    assert build.audits[0]["status"] == "failed"
    # rolled back: the table holds the last good run's rows, and the run's history is the one new snapshot
    assert audited.sql(f"SELECT * FROM {built} ORDER BY ALL") == rows
    assert audited.snapshots() == before + 1
    assert audited.last_snapshot() == bad.history_snapshot
    recorded = audited.sql(
        f"SELECT status, audits FROM main.pipeline_nodes WHERE run_id = '{bad.run.run_id}' AND node_id = 'build'"
    )
    assert recorded[0][0] == "failed" and json.loads(recorded[0][1])[0]["status"] == "failed"

    # the data fixed, the audit passes again and the child runs
    audited.sql(f"CREATE OR REPLACE TABLE {src} AS {GOOD}")
    fixed = audited.run(path)
    assert {n.id: n.status for n in fixed.run.nodes} == {"build": "ok", "child": "ok"}


def test_audits_run_in_order_and_a_new_audit_runs_an_unchanged_node_again(audited, tmp_path):
    src, built = f"{S}.src_order", f"{S}.built_order"
    audited.sql(f"CREATE OR REPLACE TABLE {src} AS SELECT * FROM (VALUES (1, 'a'), (1, 'z')) v(k, s)")
    path = tmp_path / "order.sql"
    body = f"CREATE OR REPLACE TABLE {built} AS SELECT * FROM {src};\n"
    path.write_text("-- id: build\n-- audit: not_null(k)\n" + body)
    assert audited.run(path).run.node("build").status == "ok"
    assert audited.run(path).run.node("build").status == "unchanged"
    path.write_text("-- id: build\n-- audit: not_null(k), unique(k)\n-- audit: accepted_values(s, 'a')\n" + body)
    node = audited.run(path).run.node("build")
    assert node.why == "its audits are new or changed"
    assert [(a["audit"], a["status"]) for a in node.audits] == [
        ("not_null(k)", "passed"),
        ("unique(k)", "failed"),
        ("accepted_values(s, 'a')", "not run"),
    ]


@pytest.mark.parametrize(
    "header, expected",
    [
        (
            "nonsense(k)",
            "node 1: 'nonsense' is no audit (known: not_null, unique, accepted_values, row_count, sql_file)",
        ),
        ("not_null(1)", "node 1: not_null(1) takes one or more column names"),
        ("accepted_values(s, x)", "node 1: accepted_values(s, x) takes a column and one or more literal values"),
        ("not_null(k", "node 1: audit 'not_null(k' does not parse"),
        ("sql_file('none.sql')", "node 1: sql_file('none.sql'): cannot read"),
    ],
)
def test_a_bad_audit_is_one_line_with_its_line(tmp_path, header, expected):
    path = tmp_path / "p.sql"
    path.write_text(f"-- NOTE: a plain comment\n-- audit: {header}\nCREATE TABLE t AS SELECT 1 AS k;")
    with pytest.raises(PipelineError) as err:
        dag.load(path)
    assert str(err.value).startswith(f"{path}:2: {expected}"), str(err.value)


def test_an_audit_needs_one_table_written(tmp_path):
    with pytest.raises(PipelineError, match="node q has audits but writes 0 tables"):
        dag.build("-- id: q\n-- audit: row_count > 0\nSELECT 1 AS k;")
    n = dag.build('-- audit: not_null("T (degC)")\nCREATE TABLE t AS SELECT 1 AS "T (degC)";').nodes["1"]
    assert [a.text for a in n.audits] == ['not_null("T (degC)")'] and str(n.audited) == "t"


def test_a_sql_file_audit_orders_its_node_after_the_tables_it_reads_and_their_change_runs_it_again(audited, tmp_path):
    (tmp_path / "audits").mkdir()
    (tmp_path / "audits" / "known.sql").write_text(
        f"SELECT * FROM {S}.fa_built WHERE k NOT IN (SELECT k FROM {S}.fa_known) AND k NOT IN (SELECT k FROM {S}.fa_made)"
    )
    path = tmp_path / "fa.sql"
    # `made` comes after `build` in the file and only build's audit reads its table: the edge is inferred from it
    path.write_text(
        f"-- id: build\n-- audit: sql_file('audits/known.sql')\n"
        f"CREATE OR REPLACE TABLE {S}.fa_built AS SELECT * FROM {S}.fa_src;\n\n"
        f"-- id: made\nCREATE OR REPLACE TABLE {S}.fa_made AS SELECT 9 AS k;\n"
    )
    pipeline = dag.load(path)
    assert [(e.parent, e.child, e.kind) for e in pipeline.edges] == [("made", "build", "inferred")]
    assert pipeline.waves() == [["made"], ["build"]]
    assert pipeline.nodes["build"].audit_reads == {
        dag.TableRef("lake", S, "fa_known"),
        dag.TableRef("lake", S, "fa_made"),
    }
    audited.sql(
        f"CREATE OR REPLACE TABLE {S}.fa_src AS SELECT * FROM (VALUES (1), (3), (9)) v(k); "
        f"CREATE OR REPLACE TABLE {S}.fa_known AS SELECT * FROM (VALUES (1), (3)) v(k)"
    )
    first = audited.run(path).run
    assert {n.id: n.status for n in first.nodes} == {"build": "ok", "made": "ok"}, first.nodes
    again = audited.run(path).run
    assert {n.id: n.status for n in again.nodes} == {"build": "unchanged", "made": "unchanged"}, again.nodes

    # the audit's table changes (3 is no longer known), nothing the node's statement reads does: it runs, and fails
    audited.sql(f"DELETE FROM {S}.fa_known WHERE k = 3")
    third = audited.run(path).run
    build = third.node("build")
    assert build.status == "failed" and build.why.startswith(f"its input {S}.fa_known changed"), build
    assert "audit sql_file('audits/known.sql') failed" in build.error and "1 offending row(s)" in build.error


def test_an_incremental_nodes_audits_are_told_apart_though_its_write_is_two_statements(audited, tmp_path):
    """An incremental run's write is a DELETE and an INSERT before the audits: the outcome of each audit is its own,
    not its neighbour's (found by position, the first audit would be taken for the INSERT and each verdict shifted)."""
    src, built = f"{S}.src_incr", f"{S}.built_incr"
    audited.sql(
        f"CREATE OR REPLACE TABLE {src} AS SELECT i AS k, 'a' AS s, DATE '2024-01-01' + CAST(i AS INTEGER) AS day FROM range(3) t(i)"
    )
    path = tmp_path / "incr.sql"
    path.write_text(
        "-- id: build\n-- kind: incremental_by_time(day)\n-- audit: not_null(k), unique(k), accepted_values(s, 'a')\n"
        f"CREATE OR REPLACE TABLE {built} AS SELECT k, s, day FROM {src};\n"
    )
    first = audited.run(path).run.node("build")
    assert first.status == "ok" and [a["status"] for a in first.audits] == ["passed"] * 3, first
    audited.sql(f"INSERT INTO {src} VALUES (1, 'a', DATE '2024-02-01')")  # a newer day that repeats key 1
    node = audited.run(path).run.node("build")
    assert [s.statement_type for s in node.statements[:2]] == ["DELETE", "INSERT"], node.statements  # incremental
    assert [(a["audit"], a["status"]) for a in node.audits] == [
        ("not_null(k)", "passed"),
        ("unique(k)", "failed"),
        ("accepted_values(s, 'a')", "not run"),
    ]
    assert "audit unique(k) failed on" in node.audits[1]["error"]
