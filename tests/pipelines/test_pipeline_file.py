"""A pipeline file -> statements, headers and a DAG, without services: each of Sord's parser defects as a
regression test, the errors (one line with file:line), inference, --select, and lineage through a join, a CTE
and a subquery against hand-written expected rows."""

from __future__ import annotations

import pytest

from ducklake_kit.pipelines.dag import build
from ducklake_kit.pipelines.lineage import column_edges, table_edges
from ducklake_kit.pipelines.sqlfile import PipelineError, split_statements
from ducklake_kit.pipelines.tables import TableRef, table_use


def error_of(source: str, **kw) -> str:
    with pytest.raises(PipelineError) as exc:
        build(source, "p.sql", **kw)
    return exc.value.line()


def edges(source: str) -> set[tuple[str, str, str]]:
    return {(e.parent, e.child, e.kind) for e in build(source, "p.sql").edges}


def test_a_semicolon_inside_a_string_or_comment_splits_nothing():
    # Sord's regex split 'a;b' in two and silently dropped a query
    stmts = split_statements("-- id: 1\nSELECT 'a;b' AS s; -- trailing; comment\n-- id: 2\nSELECT \"x;y\" FROM t /* ; */;")
    assert [(s.header("id"), s.sql) for s in stmts] == [("1", "SELECT 'a;b' AS s"),
                                                         ("2", 'SELECT "x;y" FROM t')]


def test_headers_in_any_order_and_node_before_depends_on_keeps_the_dependency():
    # Sord read the headers in a fixed order: `-- node` before `-- depends_on` dropped the dependency
    p = build("-- id: a\nSELECT 1;\n-- id: b\nSELECT 2;\n"
              "-- node: w2\n-- description: the join\n-- depends_on: a, b\n-- id: c\nSELECT 3;", "p.sql")
    c = p.nodes["c"]
    assert (c.pin, c.description, p.parents("c")) == ("w2", "the join", {"a", "b"})


def test_a_comment_between_queries_drops_nothing():
    source = ("-- id: 1\nSELECT 1;\n\n-- a prose comment between queries\n/* and a block */\n"
              "-- id: 2\nSELECT 2;\n-- more prose\nSELECT 3;")
    p = build(source, "p.sql")
    assert [(n.id, n.sql, n.line) for n in p.nodes.values()] == [("1", "SELECT 1", 2), ("2", "SELECT 2", 7),
                                                                 ("3", "SELECT 3", 9)]


def test_a_file_without_headers_is_one_independent_node_per_statement():
    p = build("SELECT 1; SELECT 2;\nSELECT 3", "p.sql")
    assert list(p.nodes) == ["1", "2", "3"] and p.edges == [] and p.waves() == [["1", "2", "3"]]


@pytest.mark.parametrize("source, expected", [
    ("-- id: 1\nSELECT 1;\n-- id: 1\nSELECT 2;", "Error: p.sql:3: id '1' is used twice (first on line 2)."),
    ("-- id: 1\n-- depends_on: 7\nSELECT 1;", "Error: p.sql:2: node 1 depends on '7', which is no id of this file."),
    ("-- id: 1\n-- needs: 2\nSELECT 1;", "Error: p.sql:2: unknown header 'needs'."),
    ("-- id: 1\n-- id: 2\nSELECT 1;", "Error: p.sql:2: header 'id' given twice for one statement (first on line 1)."),
    ("SELECT 1;\n-- id: 2\n", "Error: p.sql:2: headers with no statement after them."),
    ("-- id: 1\n-- depends_on: 1\nSELECT 1;", "Error: p.sql:2: node 1 depends on itself."),
    ("", "Error: p.sql: the file has no SQL statement."),
])
def test_bad_files_are_one_line_with_file_and_line(source, expected):
    assert error_of(source).startswith(expected)


def test_a_cycle_is_refused_and_named():
    # Sord accepted cycles
    line = error_of("-- id: a\n-- depends_on: c\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;\n"
                    "-- id: c\n-- depends_on: b\nSELECT 3;")
    assert "the dependencies form a cycle" in line
    cycle = line.split("cycle: ")[1].split(".")[0].split(" -> ")
    assert set(cycle) == {"a", "b", "c"} and cycle[0] == cycle[-1] and len(cycle) == 4


def test_inference_adds_the_edge_a_header_left_out_and_warns():
    source = ("-- id: base\nCREATE TABLE s.base AS SELECT 1 AS x;\n"
              "-- id: other\nCREATE TABLE s.other AS SELECT 2 AS x;\n"
              "-- id: top\n-- depends_on: other\nCREATE TABLE s.top AS SELECT * FROM s.base JOIN s.other USING (x);")
    p = build(source, "p.sql")
    assert {(e.parent, e.child, e.kind) for e in p.edges} == {("base", "top", "inferred"),
                                                              ("other", "top", "declared+inferred")}
    assert p.warnings == ["p.sql:7: node top uses s.base (made by base), but does not declare "
                          "depends_on: base; the edge was added"]
    assert "without declaring it (--strict)" in error_of(source, strict=True)


def test_inference_sees_tables_in_ctes_subqueries_and_joins_but_not_cte_names():
    source = ("CREATE TABLE a AS SELECT 1 AS x;\nCREATE TABLE b AS SELECT 1 AS x;\nCREATE TABLE c AS SELECT 1 AS x;\n"
              "CREATE TABLE d AS WITH a AS (SELECT * FROM b) SELECT * FROM a WHERE x IN (SELECT x FROM c)")
    assert edges(source) == {("2", "4", "inferred"), ("3", "4", "inferred")}  # `a` there is the CTE, not table a


def test_a_table_is_made_then_changed_then_read_then_dropped_whatever_the_file_order():
    p = build("-- id: read\nSELECT * FROM t;\n-- id: drop\nDROP TABLE t;\n-- id: change\nINSERT INTO t SELECT 2;\n"
              "-- id: make\nCREATE TABLE t AS SELECT 1 AS x", "p.sql")
    assert p.waves() == [["make"], ["change"], ["read"], ["drop"]]
    assert {(e.parent, e.child) for e in p.edges} == {("make", "change"), ("make", "read"), ("change", "read"),
                                                      ("make", "drop"), ("change", "drop"), ("read", "drop")}
    # two statements that make (or change) one table keep their file order
    assert edges("CREATE TABLE t AS SELECT 1 AS x;\nCREATE OR REPLACE TABLE t AS SELECT 2 AS x") == {("1", "2", "inferred")}


def test_chain_and_diamond_waves():
    # Sord ran a chain 1->2->3 as 1,3,2 and a diamond 1->{2,3}->4 with 4 before 2 and 3
    chain = build("-- id: 1\nSELECT 1;\n-- id: 3\n-- depends_on: 2\nSELECT 3;\n-- id: 2\n-- depends_on: 1\nSELECT 2;", "p.sql")
    assert chain.waves() == [["1"], ["2"], ["3"]]
    diamond = build("-- id: 4\n-- depends_on: 2, 3\nSELECT 4;\n-- id: 1\nSELECT 1;\n-- id: 2\n-- depends_on: 1\nSELECT 2;\n"
                    "-- id: 3\n-- depends_on: 1\nSELECT 3;", "p.sql")
    assert diamond.waves() == [["1"], ["2", "3"], ["4"]]


def test_select_takes_dbts_forms():
    p = build("-- id: a\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;\n-- id: c\n-- depends_on: b\nSELECT 3;\n"
              "-- id: d\nSELECT 4;", "p.sql")
    assert p.select("b") == {"b"}
    assert p.select("+b") == {"a", "b"}
    assert p.select("b+") == {"b", "c"}
    assert p.select("+b+,d") == {"a", "b", "c", "d"}
    with pytest.raises(PipelineError, match="'x', which is no node"):
        p.select("x+")


def test_worker_local_tables_pin_their_readers_and_refuse_what_cannot_work():
    p = build("-- node: w2\nCREATE TABLE local.eph AS SELECT 1 AS x;\nCREATE TABLE lakecopy AS SELECT * FROM local.eph",
              "p.sql")
    assert (p.nodes["2"].pin, p.nodes["2"].pin_reason) == ("w2", "reads local.eph, made on w2 by node 1")
    assert "names no worker" in error_of("CREATE TABLE local.eph AS SELECT 1 AS x")
    assert "which node 1 makes on w2" in error_of(
        "-- node: w2\nCREATE TABLE local.eph AS SELECT 1 AS x;\n-- node: w1\nSELECT * FROM local.eph")
    assert "which no earlier node of this file makes" in error_of("SELECT * FROM local.gone")
    p.check_pins(["w1", "w2"])
    with pytest.raises(PipelineError, match="must run on worker 'w2', which is not running"):
        p.check_pins(["w1"])


SCHEMA = {"lake": {"main": {"trips": {"pu": "INT", "fare": "DOUBLE", "tip": "DOUBLE", "day": "DATE"},
                            "zones": {"zone_id": "INT", "borough": "VARCHAR"},
                            "vip": {"zone_id": "INT"}}},
          "local": {"main": {"eph": {"zone_id": "INT", "n": "BIGINT"}}}}
L = TableRef("lake", "main", "x")


def ref(name: str, catalog: str = "lake") -> TableRef:
    return TableRef(catalog, "main", name)


def test_lineage_through_a_join_a_cte_and_a_subquery():
    # Sord took the parents from top-level tokens: the CTE's and the subquery's tables went missing
    sql = ("CREATE TABLE marts AS WITH paid AS (SELECT pu, fare + tip AS total FROM trips WHERE fare > 0) "
           "SELECT z.borough, sum(p.total) AS revenue, count(*) AS trips "
           "FROM paid p JOIN zones z ON z.zone_id = p.pu WHERE z.zone_id IN (SELECT zone_id FROM vip) GROUP BY 1")
    use = table_use(sql)
    assert [(str(e.child), str(e.parent)) for e in table_edges(use)] == [("marts", "trips"), ("marts", "vip"),
                                                                         ("marts", "zones")]
    got = {(e.child_column, str(e.parent), e.parent_column) for e in column_edges(use, SCHEMA)}
    assert got == {("borough", "zones", "borough"), ("revenue", "trips", "fare"), ("revenue", "trips", "tip")}


def test_column_lineage_of_an_insert_and_a_star_over_a_worker_local_table():
    insert = table_use("INSERT INTO vip (zone_id) SELECT e.zone_id FROM local.eph e WHERE e.n > 3")
    assert {(e.child, e.child_column, e.parent, e.parent_column) for e in column_edges(insert, SCHEMA)} == {
        (ref("vip"), "zone_id", ref("eph", "local"), "zone_id")}
    star = table_use("CREATE TABLE copy AS SELECT * FROM local.main.eph")
    assert {(e.child_column, str(e.parent), e.parent_column) for e in column_edges(star, SCHEMA)} == {
        ("zone_id", "local.eph", "zone_id"), ("n", "local.eph", "n")}
