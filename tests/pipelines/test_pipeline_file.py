"""A pipeline file -> statements, headers and a DAG, without services: each of Sord's parser defects as a
regression test, the errors (one line with file:line), inference, --select, and lineage through a join, a CTE
and a subquery against hand-written expected rows."""

from __future__ import annotations

import pytest

from ducklake_kit.pipelines.dag import build, load
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
    stmts = split_statements(
        "-- id: 1\nSELECT 'a;b' AS s; -- trailing; comment\n-- id: 2\nSELECT \"x;y\" FROM t /* ; */;"
    )
    assert [(s.header("id"), s.sql) for s in stmts] == [("1", "SELECT 'a;b' AS s"), ("2", 'SELECT "x;y" FROM t')]


def test_headers_in_any_order_and_node_before_depends_on_keeps_the_dependency():
    # Sord read the headers in a fixed order: `-- node` before `-- depends_on` dropped the dependency
    p = build(
        "-- id: a\nSELECT 1;\n-- id: b\nSELECT 2;\n"
        "-- node: w2\n-- description: the join\n-- depends_on: a, b\n-- id: c\nSELECT 3;",
        "p.sql",
    )
    c = p.nodes["c"]
    assert (c.pin, c.description, p.parents("c")) == ("w2", "the join", {"a", "b"})


def test_a_comment_between_queries_drops_nothing():
    source = (
        "-- id: 1\nSELECT 1;\n\n-- a prose comment between queries\n/* and a block */\n"
        "-- id: 2\nSELECT 2;\n-- more prose\nSELECT 3;"
    )
    p = build(source, "p.sql")
    assert [(n.id, n.sql, n.line) for n in p.nodes.values()] == [
        ("1", "SELECT 1", 2),
        ("2", "SELECT 2", 7),
        ("3", "SELECT 3", 9),
    ]


def test_crlf_line_ends_and_nested_block_comments():
    p = build(
        "-- id: a\r\nSELECT 1;\r\n/* outer /* inner */ still a comment */\r\n-- id: b\r\n-- depends_on: a\r\nSELECT 2",
        "p.sql",
    )
    assert [(n.id, n.sql, n.line) for n in p.nodes.values()] == [("a", "SELECT 1", 2), ("b", "SELECT 2", 6)]
    assert p.parents("b") == {"a"}


def test_a_byte_order_mark_at_the_start_of_the_file_loses_no_header(tmp_path):
    # issue 29: with the BOM left in, `-- id: a` was not read and the first node became `1`
    path = tmp_path / "bom.sql"
    path.write_text("\ufeff-- id: a\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;", encoding="utf-8")
    p = load(path)
    assert [(n.id, n.sql, n.line) for n in p.nodes.values()] == [("a", "SELECT 1", 2), ("b", "SELECT 2", 5)]
    assert p.parents("b") == {"a"}


def test_a_file_without_headers_is_one_independent_node_per_statement():
    p = build("SELECT 1; SELECT 2;\nSELECT 3", "p.sql")
    assert list(p.nodes) == ["1", "2", "3"] and p.edges == [] and p.waves() == [["1", "2", "3"]]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("-- id: 1\nSELECT 1;\n-- id: 1\nSELECT 2;", "Error: p.sql:3: id '1' is used twice (first on line 2)."),
        (
            "-- id: 1\n-- depends_on: 7\nSELECT 1;",
            "Error: p.sql:2: node 1 depends on '7', which is no id of this file.",
        ),
        (
            "-- id: 1\n-- depend_on: 2\nSELECT 1;",
            "Error: p.sql:2: unknown header 'depend_on' (did you mean 'depends_on'?).",
        ),
        (
            "-- id: 1\nSELECT 1 =(^);",
            "Error: p.sql:2: DuckDB cannot parse statement 1 (Parser Error: syntax error at or near",
        ),
        (
            "-- id: 1\n-- id: 2\nSELECT 1;",
            "Error: p.sql:2: header 'id' given twice for one statement (first on line 1).",
        ),
        ("SELECT 1;\n-- id: 2\n", "Error: p.sql:2: headers with no statement after them."),
        ("-- id: 1\n-- depends_on: 1\nSELECT 1;", "Error: p.sql:2: node 1 depends on itself."),
        ("", "Error: p.sql: the file has no SQL statement."),
        ("SELECT 1\n-- id: 2", "Error: p.sql:2: headers with no statement after them."),
        ("-- id: a\n;\nSELECT 1;", "Error: p.sql:1: headers with no statement after them."),
        # a missing `;`: Sord would have run both as one query
        (
            "-- id: a\nCREATE TABLE x AS SELECT 1 AS v\n-- id: b\n-- depends_on: a\nCREATE TABLE y AS SELECT * FROM x;",
            "Error: p.sql:3: header 'id' inside a statement. Try: end the statement above it with `;`.",
        ),
        ("SELECT 1; -- id: b\nSELECT 2;", "Error: p.sql:1: header 'id' after the end of a statement."),
    ],
)
def test_bad_files_are_one_line_with_file_and_line(source, expected):
    assert error_of(source).startswith(expected)


def test_a_cycle_is_refused_and_named_from_dependency_to_dependent():
    # Sord accepted cycles
    line = error_of(
        "-- id: a\n-- depends_on: c\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;\n"
        "-- id: c\n-- depends_on: b\nSELECT 3;"
    )
    cycle = line.split("cycle: ")[1].split(".")[0]
    assert cycle in ("a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c")  # each arrow: needed by the next
    first = cycle[0]
    assert line.startswith(f"Error: p.sql:{ {'a': 2, 'b': 5, 'c': 8}[first] }: the dependencies form a cycle")


def test_inference_adds_the_edge_a_header_left_out_and_warns():
    source = (
        "-- id: base\nCREATE TABLE s.base AS SELECT 1 AS x;\n"
        "-- id: other\nCREATE TABLE s.other AS SELECT 2 AS x;\n"
        "-- id: top\n-- depends_on: other\nCREATE TABLE s.top AS SELECT * FROM s.base JOIN s.other USING (x);"
    )
    p = build(source, "p.sql")
    assert {(e.parent, e.child, e.kind) for e in p.edges} == {
        ("base", "top", "inferred"),
        ("other", "top", "declared+inferred"),
    }
    assert p.warnings == [
        "p.sql:7: node top uses s.base (made by base), but does not declare depends_on: base; the edge was added"
    ]
    assert "without declaring it (--strict)" in error_of(source, strict=True)


def test_an_inferred_edge_the_headers_already_imply_is_no_warning():
    p = build(
        "-- id: a\nCREATE TABLE a AS SELECT 1 AS x;\n-- id: b\n-- depends_on: a\nCREATE TABLE b AS SELECT * FROM a;\n"
        "-- id: c\n-- depends_on: b\nCREATE TABLE c AS SELECT * FROM a JOIN b USING (x)",
        "p.sql",
        strict=True,
    )
    assert ("a", "c") in {(e.parent, e.child) for e in p.edges} and p.warnings == []  # c waits for a through b


def test_inference_sees_tables_in_ctes_subqueries_and_joins_but_not_cte_names():
    source = (
        "CREATE TABLE a AS SELECT 1 AS x;\nCREATE TABLE b AS SELECT 1 AS x;\nCREATE TABLE c AS SELECT 1 AS x;\n"
        "CREATE TABLE d AS WITH a AS (SELECT * FROM b) SELECT * FROM a WHERE x IN (SELECT x FROM c)"
    )
    assert edges(source) == {("2", "4", "inferred"), ("3", "4", "inferred")}  # `a` there is the CTE, not table a


@pytest.mark.parametrize(
    "source, expected",
    [
        # drop then re-create: the CREATE comes after the DROP, not before it
        ("DROP TABLE IF EXISTS t;\nCREATE TABLE t AS SELECT 1 AS a", {("1", "2")}),
        # insert, then de-duplicate what the insert added
        (
            "CREATE TABLE IF NOT EXISTS t (a INT);\nINSERT INTO t SELECT 1;\nCREATE OR REPLACE TABLE t AS SELECT DISTINCT * FROM t",
            {("1", "2"), ("2", "3")},
        ),
        # keep a copy of the lake's own t, then append to t: the copy reads t before the insert changes it
        ("CREATE TABLE before AS SELECT * FROM t;\nINSERT INTO t SELECT 1", {("1", "2")}),
        # move a batch: archive it and delete it from staging, both after the batch was read
        (
            "CREATE TABLE batch AS SELECT * FROM staging;\nINSERT INTO archive SELECT * FROM batch;\n"
            "DELETE FROM staging WHERE id IN (SELECT id FROM batch)",
            {("1", "2"), ("1", "3")},
        ),
        # a schema is made before the tables in it, and dropped after every use of them
        (
            "CREATE SCHEMA s;\nCREATE TABLE s.x AS SELECT 1 AS a;\nSELECT * FROM s.x;\nDROP SCHEMA s CASCADE",
            {("1", "2"), ("1", "3"), ("1", "4"), ("2", "3"), ("2", "4"), ("3", "4")},
        ),
        # a rename drops the old name and makes the new one
        ("CREATE TABLE t AS SELECT 1 AS a;\nALTER TABLE t RENAME TO u;\nSELECT * FROM u", {("1", "2"), ("2", "3")}),
        # read before the file makes it: the reader waits for the CREATE further down
        ("SELECT * FROM later;\nCREATE TABLE later AS SELECT 1 AS a", {("2", "1")}),
    ],
)
def test_inference_follows_the_file_as_a_script_runs(source, expected):
    p = build(source, "p.sql")
    assert {(e.parent, e.child) for e in p.edges} == expected
    assert all(e.kind == "inferred" for e in p.edges)


def test_a_cte_named_like_a_table_reads_that_table_inside_itself():
    use = table_use("WITH trips AS (SELECT * FROM trips WHERE fare > 0) SELECT count(*) FROM trips")
    assert use.reads == {TableRef("lake", "main", "trips")}
    nested = table_use("SELECT * FROM (WITH t AS (SELECT 1 AS x) SELECT * FROM t) s JOIN t ON true")
    assert nested.reads == {TableRef("lake", "main", "t")}  # the outer t is the table


@pytest.mark.parametrize(
    "sql, word",
    [
        ("BEGIN", "BEGIN"),
        ("COMMIT", "COMMIT"),
        ("USE local", "USE"),
        ("SET threads = 4", "SET"),
        ("CREATE TEMP TABLE tt AS SELECT 1", "TEMP"),
    ],
)
def test_statements_that_cannot_be_a_node_are_refused_with_their_line(sql, word):
    line = error_of(f"SELECT 1;\n{sql};\nSELECT 2")
    assert line.startswith("Error: p.sql:2: statement 2 cannot be a pipeline node: ") and word in line


def test_chain_and_diamond_waves():
    # Sord ran a chain 1->2->3 as 1,3,2 and a diamond 1->{2,3}->4 with 4 before 2 and 3
    chain = build(
        "-- id: 1\nSELECT 1;\n-- id: 3\n-- depends_on: 2\nSELECT 3;\n-- id: 2\n-- depends_on: 1\nSELECT 2;", "p.sql"
    )
    assert chain.waves() == [["1"], ["2"], ["3"]]
    diamond = build(
        "-- id: 4\n-- depends_on: 2, 3\nSELECT 4;\n-- id: 1\nSELECT 1;\n-- id: 2\n-- depends_on: 1\nSELECT 2;\n"
        "-- id: 3\n-- depends_on: 1\nSELECT 3;",
        "p.sql",
    )
    assert diamond.waves() == [["1"], ["2", "3"], ["4"]]


def test_select_takes_dbts_forms():
    p = build(
        "-- id: a\nSELECT 1;\n-- id: b\n-- depends_on: a\nSELECT 2;\n-- id: c\n-- depends_on: b\nSELECT 3;\n"
        "-- id: d\nSELECT 4;",
        "p.sql",
    )
    assert p.select("b") == {"b"}
    assert p.select("+b") == {"a", "b"}
    assert p.select("b+") == {"b", "c"}
    assert p.select("+b+,d") == {"a", "b", "c", "d"}
    with pytest.raises(PipelineError, match="'x', which is no node"):
        p.select("x+")


def test_worker_local_tables_pin_their_readers_and_refuse_what_cannot_work():
    p = build(
        "-- node: w2\nCREATE TABLE local.eph AS SELECT 1 AS x;\nCREATE TABLE lakecopy AS SELECT * FROM local.eph",
        "p.sql",
    )
    assert (p.nodes["2"].pin, p.nodes["2"].pin_reason) == ("w2", "reads local.eph, made on w2 by node 1")
    assert "names no worker" in error_of("CREATE TABLE local.eph AS SELECT 1 AS x")
    assert "which node 1 makes on w2" in error_of(
        "-- node: w2\nCREATE TABLE local.eph AS SELECT 1 AS x;\n-- node: w1\nSELECT * FROM local.eph"
    )
    assert "which no earlier node of this file makes" in error_of("SELECT * FROM local.gone")
    p.check_pins(["w1", "w2"])
    with pytest.raises(PipelineError, match="must run on worker 'w2', which is not running"):
        p.check_pins(["w1"])


SCHEMA = {
    "lake": {
        "main": {
            "trips": {"pu": "INT", "fare": "DOUBLE", "tip": "DOUBLE", "day": "DATE"},
            "zones": {"zone_id": "INT", "borough": "VARCHAR"},
            "vip": {"zone_id": "INT"},
        }
    },
    "local": {"main": {"eph": {"zone_id": "INT", "n": "BIGINT"}}},
}
L = TableRef("lake", "main", "x")


def ref(name: str, catalog: str = "lake") -> TableRef:
    return TableRef(catalog, "main", name)


def test_lineage_through_a_join_a_cte_and_a_subquery():
    # Sord took the parents from top-level tokens: the CTE's and the subquery's tables went missing
    sql = (
        "CREATE TABLE marts AS WITH paid AS (SELECT pu, fare + tip AS total FROM trips WHERE fare > 0) "
        "SELECT z.borough, sum(p.total) AS revenue, count(*) AS trips "
        "FROM paid p JOIN zones z ON z.zone_id = p.pu WHERE z.zone_id IN (SELECT zone_id FROM vip) GROUP BY 1"
    )
    use = table_use(sql)
    assert [(str(e.child), str(e.parent)) for e in table_edges(use)] == [
        ("marts", "trips"),
        ("marts", "vip"),
        ("marts", "zones"),
    ]
    got = {(e.child_column, str(e.parent), e.parent_column) for e in column_edges(use, SCHEMA)}
    assert got == {("borough", "zones", "borough"), ("revenue", "trips", "fare"), ("revenue", "trips", "tip")}


def test_column_lineage_of_an_insert_and_a_star_over_a_worker_local_table():
    insert = table_use("INSERT INTO vip (zone_id) SELECT e.zone_id FROM local.eph e WHERE e.n > 3")
    assert {(e.child, e.child_column, e.parent, e.parent_column) for e in column_edges(insert, SCHEMA)} == {
        (ref("vip"), "zone_id", ref("eph", "local"), "zone_id")
    }
    star = table_use("CREATE TABLE copy AS SELECT * FROM local.main.eph")
    assert {(e.child_column, str(e.parent), e.parent_column) for e in column_edges(star, SCHEMA)} == {
        ("zone_id", "local.eph", "zone_id"),
        ("n", "local.eph", "n"),
    }


def test_a_plain_comment_with_a_colon_is_a_comment_wherever_it_stands():
    # Sord's files carry prose comments; only the kit's four words (or a near miss of one) are headers
    source = (
        "-- README: marts from the trips\n-- id: a\n-- NOTE: the first\nCREATE TABLE x AS SELECT 1 AS v; -- TODO: more\n"
        "-- id: b\nCREATE TABLE y AS\n-- Source: x, as a note inside the statement\nSELECT * FROM x;\n-- Author: me\n"
    )
    p = build(source, "p.sql")
    assert list(p.nodes) == ["a", "b"] and [(e.parent, e.child) for e in p.edges] == [("a", "b")]


def test_column_lineage_keeps_quoted_names_whole_and_as_spelled():
    # Jena-climate columns: a dot inside the quotes, and upper case DuckDB keeps
    schema = {"lake": {"main": {"climate": {"Date Time": "VARCHAR", "max. wv (m/s)": "DOUBLE", "T (degC)": "DOUBLE"}}}}
    star = table_use("CREATE TABLE t AS SELECT * FROM climate")
    # the built table's columns as the catalog gives them after the run (pipelines.history passes them)
    got = {
        (e.child_column, e.parent_column) for e in column_edges(star, schema, list(schema["lake"]["main"]["climate"]))
    }
    assert got == {("Date Time", "Date Time"), ("max. wv (m/s)", "max. wv (m/s)"), ("T (degC)", "T (degC)")}
    renamed = table_use(
        'CREATE TABLE w AS SELECT "max. wv (m/s)" AS "Max WV", "T (degC)" + 273.15 AS kelvin FROM climate'
    )
    got = {(e.child_column, e.parent_column) for e in column_edges(renamed, schema, ["Max WV", "kelvin"])}
    assert got == {("Max WV", "max. wv (m/s)"), ("kelvin", "T (degC)")}
