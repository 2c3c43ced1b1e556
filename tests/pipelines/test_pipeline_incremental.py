"""Incremental nodes (`-- kind:`) on the real lake and worker plane. The oracle: after every run, the incremental
node's table equals its query run in full now, by EXCEPT ALL both ways, over random streams of appends (late rows
included) for `incremental_by_time` and of inserts, updates and deletes (NULL keys included) for
`incremental_by_key`; and each run that could be incremental was (else the test would pass on full rebuilds)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ducklake_kit.lake import Lake
from ducklake_kit.pipelines import dag, flow
from ducklake_kit.pipelines.sqlfile import PipelineError
from ducklake_kit.workers.config import PlaneConfig

S = "pipeline_incr"
DAILY = (
    f"SELECT t.day, d.name, count(*) AS n, sum(t.v) AS v FROM {S}.events t JOIN {S}.dim d ON d.k = t.k "
    "GROUP BY t.day, d.name"
)
KEPT = f"SELECT day, k, v FROM {S}.events WHERE v > 2"
PER_KEY = f"SELECT k, count(*) AS n, sum(v) AS v, max(day) AS last_day FROM {S}.facts GROUP BY k"
PIPELINE = f"""
-- id: daily
-- kind: incremental_by_time(day)
CREATE OR REPLACE TABLE {S}.daily AS {DAILY};

-- id: kept
-- kind: incremental_by_time(day)
CREATE OR REPLACE TABLE {S}.kept AS {KEPT};

-- id: total
CREATE OR REPLACE TABLE {S}.total AS SELECT sum(n) AS n FROM {S}.daily;

-- id: per_key
-- kind: incremental_by_key(k)
CREATE OR REPLACE TABLE {S}.per_key AS {PER_KEY};
"""
DAY0 = dt.date(2024, 1, 1)


class Incr:
    """The pipeline and one lake connection for the module's reads and writes (a Lake per statement attached the
    lake again each time: most of the oracles' time)."""

    def __init__(self, stack, path, lake: Lake):
        self.ep = stack.platform.endpoints()
        self.address = PlaneConfig.of(stack.state, None).address
        self.path = path
        self.lake = lake

    def sql(self, text: str, params=None):
        return self.lake.con.execute(text, params).fetchall()

    def run(self, **kw):
        outcome = flow.run(self.path, self.address, self.ep, flow.Options(**kw))
        # the module's connection reads the lake as the run left it (each statement reads the newest snapshot), or
        # the oracle would compare a table with its query on an older snapshot
        seen = self.sql("SELECT count(*) FROM main.pipeline_runs WHERE run_id = ?", [outcome.run.run_id])
        assert seen == [(1,)], outcome.run.run_id
        return outcome.run

    def differs(self, table: str, query: str) -> tuple[int, int, int]:
        """(rows, rows only in the table, rows only in the full query)."""
        return self.sql(
            f"SELECT (SELECT count(*) FROM {S}.{table}), "
            f"(SELECT count(*) FROM (SELECT * FROM {S}.{table} EXCEPT ALL {query})), "
            f"(SELECT count(*) FROM ({query} EXCEPT ALL SELECT * FROM {S}.{table}))"
        )[0]


@pytest.fixture(scope="module")
def incr(stack, workers, lake, tmp_path_factory):
    lake.run(
        f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}; "
        f"CREATE TABLE {S}.dim AS SELECT * FROM (VALUES (0, 'a'), (1, 'b'), (2, 'a')) v(k, name)"
    )
    path = tmp_path_factory.mktemp("incremental") / "incr.sql"
    path.write_text(PIPELINE)
    return Incr(stack, path, lake)


def sql_day(d: dt.date | None) -> str:
    return "NULL" if d is None else f"DATE '{d.isoformat()}'"


def values(rows: list[tuple]) -> str:
    return ", ".join(f"({sql_day(d)}, {'NULL' if k is None else k}, {'NULL' if v is None else v})" for d, k, v in rows)


day = st.integers(0, 40).map(lambda i: DAY0 + dt.timedelta(days=i))
row = st.tuples(day, st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(0, 5)))
# by time: some rows have no time at all (their NULL group must be made again when one is appended)
timed_row = st.tuples(
    st.one_of(day, st.none()), st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.integers(0, 5))
)
appends = st.lists(st.lists(timed_row, min_size=1, max_size=6), min_size=1, max_size=3)


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(timed_row, min_size=1, max_size=8), stream=appends)
def test_incremental_by_time_equals_a_full_rebuild_after_random_appends(incr, first, stream):
    incr.sql(f"CREATE OR REPLACE TABLE {S}.events (day DATE, k INTEGER, v INTEGER)")
    incr.sql(f"INSERT INTO {S}.events VALUES {values(first)}")
    incr.sql(f"CREATE OR REPLACE TABLE {S}.facts AS SELECT * FROM {S}.events")
    built = incr.run(force=True)
    assert {n.id: n.status for n in built.nodes} == dict.fromkeys(("daily", "kept", "total", "per_key"), "ok")
    assert built.node("daily").incremental["mode"] == "full"
    for rows in stream:
        incr.sql(f"INSERT INTO {S}.events VALUES {values(rows)}")
        run = incr.run()
        for node, table, query in (("daily", "daily", DAILY), ("kept", "kept", KEPT)):
            n = run.node(node)
            assert n.status == "ok", (n.error, n.reason)
            assert n.incremental["mode"] == "incremental", n.incremental
            days = [d for d, _, _ in rows if d is not None]
            assert n.incremental["from"] == (min(days).isoformat() if days else None)  # from the earliest new row
            assert n.incremental["null_time_rows"] == len(rows) - len(days)
            assert n.incremental["new_rows"] == len(rows)
            total, only_table, only_full = incr.differs(table, query)
            assert (only_table, only_full) == (0, 0), (node, total, rows)
        assert run.node("per_key").status == "unchanged"  # it reads facts, which did not change
        assert incr.differs("total", f"SELECT sum(n) AS n FROM {S}.daily")[1:] == (0, 0)


changes = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(row, min_size=1, max_size=4)),
        st.tuples(st.just("delete"), st.one_of(st.none(), st.integers(0, 3))),
        st.tuples(st.just("update"), st.one_of(st.none(), st.integers(0, 3))),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=4, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=st.lists(row, min_size=1, max_size=8), stream=changes)
def test_incremental_by_key_equals_a_full_rebuild_after_inserts_updates_and_deletes(incr, first, stream):
    incr.sql(f"CREATE OR REPLACE TABLE {S}.facts (day DATE, k INTEGER, v INTEGER)")
    incr.sql(f"INSERT INTO {S}.facts VALUES {values(first)}")
    assert incr.run(select="per_key", force=True).node("per_key").status == "ok"
    for op, arg in stream:
        match_k = f"k IS NOT DISTINCT FROM {'NULL' if arg is None else arg}" if op != "insert" else ""
        if op == "insert":
            incr.sql(f"INSERT INTO {S}.facts VALUES {values(arg)}")
        elif op == "delete":
            incr.sql(f"DELETE FROM {S}.facts WHERE {match_k}")
        else:
            incr.sql(f"UPDATE {S}.facts SET v = coalesce(v, 0) + 1 WHERE {match_k}")
        n = incr.run(select="per_key").node("per_key")
        assert n.status in ("ok", "unchanged"), (n.error, n.reason)
        if n.status == "ok":  # a delete or update of no row changes nothing: the node is left unchanged
            assert n.incremental["mode"] == "incremental", n.incremental
        assert incr.differs("per_key", PER_KEY)[1:] == (0, 0), (op, arg)


def test_what_makes_an_incremental_node_build_in_full_is_said(incr):
    incr.sql(
        f"CREATE OR REPLACE TABLE {S}.events AS SELECT DATE '2024-01-01' + (i % 9)::INTEGER AS day, (i % 4)::INTEGER AS k, i::INTEGER AS v "
        "FROM range(30) t(i)"
    )
    incr.sql(f"CREATE OR REPLACE TABLE {S}.facts AS SELECT * FROM {S}.events")
    incr.run(force=True)
    incr.sql(f"INSERT INTO {S}.events VALUES (DATE '2024-01-03', 1, 7)")
    said = flow.plan(incr.path, incr.address, incr.ep).decisions
    assert said["daily"].reason.endswith(f"; incremental: 1 new row(s) of {S}.events from day 2024-01-03"), said
    assert said["total"].run and said["total"].reason == f"its input {S}.daily was changed by node daily in this run"
    assert incr.run().node("daily").incremental["mode"] == "incremental"
    incr.sql(f"UPDATE {S}.dim SET name = 'c' WHERE k = 2")  # another input: older rows may change
    assert incr.run().node("daily").incremental["why"] == f"a full build: {S}.dim changed too"
    incr.sql(f"DELETE FROM {S}.events WHERE k = 1")
    why = incr.run().node("daily").incremental["why"]
    assert why.startswith(f"a full build: {S}.events had ") and "deleted or updated since" in why
    incr.sql(f"CREATE OR REPLACE TABLE {S}.events AS SELECT * FROM {S}.facts")
    assert incr.run().node("kept").incremental["why"].startswith(f"a full build: {S}.events was made again since")
    for node, table, query in (("daily", "daily", DAILY), ("kept", "kept", KEPT), ("per_key", "per_key", PER_KEY)):
        assert incr.differs(table, query)[1:] == (0, 0), node
    history = incr.sql(
        "SELECT count(*) FROM main.pipeline_nodes WHERE pipeline = 'incr' AND node_id = 'daily' "
        'AND incremental LIKE \'%"mode": "full"%\''
    )
    assert history[0][0] >= 3


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("CREATE TABLE x AS SELECT count(*) AS day FROM e", "incremental_by_time(day) needs day in its SELECT list"),
        ("CREATE TABLE x AS SELECT day, count(*) AS n FROM e", "and aggregates, but does not GROUP BY day"),
        ("CREATE TABLE x AS SELECT day, row_number() OVER () AS n FROM e", "has a window function"),
        ("CREATE TABLE x AS SELECT day FROM e a JOIN f b USING (k)", "cannot tell which table day comes from"),
        ("INSERT INTO x SELECT day FROM e", "is no CREATE TABLE ... AS SELECT"),
    ],
)
def test_a_node_that_cannot_be_incremental_fails_plan_with_its_line(sql, expected):
    with pytest.raises(PipelineError, match=expected.replace("(", r"\(").replace(")", r"\)")) as err:
        dag.build(f"-- id: n\n-- kind: incremental_by_time(day)\n{sql};", "p.sql")
    assert str(err.value).startswith("p.sql:2: ")


def test_a_kind_change_alone_runs_nothing_and_the_next_run_goes_the_new_kinds_way(incr, tmp_path):
    """Every kind builds the same rows, so a change of `-- kind:` alone leaves the node unchanged (docs/pipelines.md
    says why); the next run after an append is then incremental, and equal to the query in full."""
    src, query = f"{S}.kind_events", f"SELECT day, k, v FROM {S}.kind_events WHERE v > 2"
    incr.sql(
        f"CREATE OR REPLACE TABLE {src} AS SELECT DATE '2024-01-01' + CAST(i AS INTEGER) AS day, i AS k, i AS v "
        "FROM range(6) t(i)"
    )
    path = tmp_path / "kinds.sql"
    body = f"CREATE OR REPLACE TABLE {S}.kinds AS {query};\n"
    path.write_text("-- id: kinds\n" + body)
    run = flow.run(path, incr.address, incr.ep).run
    assert run.node("kinds").status == "ok"
    path.write_text("-- id: kinds\n-- kind: incremental_by_time(day)\n" + body)
    run = flow.run(path, incr.address, incr.ep).run
    assert run.node("kinds").status == "unchanged", run.node("kinds").reason
    incr.sql(f"INSERT INTO {src} VALUES (DATE '2024-03-01', 9, 9), (DATE '2023-12-31', 8, 8)")
    node = flow.run(path, incr.address, incr.ep).run.node("kinds")
    assert node.status == "ok" and node.incremental["mode"] == "incremental", (node.reason, node.incremental)
    assert node.incremental["from"] == "2023-12-31" and node.incremental["new_rows"] == 2
    assert incr.differs("kinds", query)[1:] == (0, 0)
