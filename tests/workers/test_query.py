"""The console's query on the real plane: SQL as one task on a worker, only a slice of the rows sent back with the
full count, the snapshot the rows were read at, DuckDB's own error text; each compared with the same SQL run through
the lake independently. Everything here writes only the schema `query_tests`."""

from __future__ import annotations

import pytest

from ducklake_kit.lake import Lake, StatementFailed
from ducklake_kit.platforms import postgres
from ducklake_kit.workers import WorkerPlane, plane
from ducklake_kit.workers.query import MOST_ROWS, answer_on, ask

SCHEMA = "query_tests"


@pytest.fixture(scope="module")
def env(stack):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 2)
    with Lake(ep) as lake:
        lake.run(
            f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; "
            f"CREATE TABLE {SCHEMA}.t AS SELECT range AS id, 'n' || (range % 7) AS name, range * 0.5 AS half "
            "FROM range(20000)"
        )
        with WorkerPlane(status.address, ep) as wp:
            yield wp, lake


def test_a_slice_crosses_with_the_full_count_and_the_snapshot_it_was_read_at(env):
    wp, lake = env
    text = f"SELECT id, name, half FROM {SCHEMA}.t WHERE id % 3 = 0 ORDER BY id DESC"
    answer = ask(wp, text, rows=37, worker="w2")
    expected = lake.run(text)[-1]
    assert answer.ok, answer.error
    assert answer.worker == "w2"
    assert answer.total_rows == len(expected.rows) == 6667
    assert answer.rows == expected.rows[:37]
    assert answer.columns == ["id", "name", "half"]
    assert answer.types == [str(d[1]) for d in lake.con.execute(text).description]
    assert answer.types[:2] == ["BIGINT", "VARCHAR"]
    assert answer.snapshot_id == lake.current_snapshot()


def test_the_snapshot_is_the_one_the_rows_came_from_after_a_write(env):
    wp, lake = env
    answer = ask(
        wp,
        f"CREATE OR REPLACE TABLE {SCHEMA}.w AS SELECT 1 AS x; INSERT INTO {SCHEMA}.w VALUES (2); "
        f"SELECT sum(x) AS s FROM {SCHEMA}.w",
    )
    assert answer.ok, answer.error
    assert answer.rows == [(3,)]
    # the catalog asked directly: the INSERT's snapshot is the newest, and the SELECT read it
    with postgres.connect(lake.endpoints.pg) as conn:
        newest = conn.execute("SELECT max(snapshot_id) FROM ducklake_snapshot").fetchone()[0]
    assert answer.snapshot_id == newest


def test_a_statement_without_rows_says_what_it_did(env):
    wp, lake = env
    answer = ask(wp, f"INSERT INTO {SCHEMA}.t SELECT range + 100000, 'x', 0 FROM range(4)")
    assert answer.ok, answer.error
    assert (answer.total_rows, answer.message) == (None, "INSERT: 4 rows affected")
    assert lake.scalar(f"SELECT count(*) FROM {SCHEMA}.t WHERE name = 'x'") == 4


def test_an_error_is_duckdbs_own_line(env):
    wp, lake = env
    text = f"SELECT * FROM {SCHEMA}.no_such_table"
    with pytest.raises(StatementFailed) as independent:
        lake.run(text)
    answer = ask(wp, text)
    assert answer.error == independent.value.error
    assert answer.error.startswith("Catalog Error: Table with name no_such_table does not exist")
    later = ask(wp, f"SELECT 1; SELECT * FROM {SCHEMA}.no_such_table")
    assert later.error == "statement 2 failed: " + independent.value.error


def test_rows_asked_are_clamped_and_zero_still_counts(env):
    wp, lake = env
    assert ask(wp, "SELECT * FROM range(5)", rows=0).rows == []
    assert ask(wp, "SELECT * FROM range(5)", rows=0).total_rows == 5
    assert len(answer_on(lake, "SELECT * FROM range(20000)", rows=10**9).rows) == MOST_ROWS


LONG = "SELECT sum(range % 7) AS s FROM range(50000000000)"  # minutes of work on one thread


def test_cancel_interrupts_the_running_query_and_frees_its_worker(env):
    import threading
    import time

    from ducklake_kit.workers.query import cancel

    wp, _lake = env
    got = {}
    runner = threading.Thread(target=lambda: got.update(a=ask(wp, LONG, worker="w1", query_id="q-long")))
    runner.start()
    deadline = time.monotonic() + 60
    while not any(wp.client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the task runs on w1
    time.sleep(0.5)
    started = time.monotonic()
    assert cancel(wp, "q-long") is True
    runner.join(60)
    assert not runner.is_alive()
    assert time.monotonic() - started < 15
    assert got["a"].error.startswith("cancelled (") and "Interrupt" in got["a"].error, got["a"].error
    # the worker is free and its connection answers the next query
    assert ask(wp, "SELECT 41 + 1", worker="w1").rows == [(42,)]
    # an id cancelled before its query starts: the query refuses to start
    assert cancel(wp, "q-later") is False
    assert ask(wp, "SELECT 1", query_id="q-later").error == "cancelled before it started"
