"""The lake's shared primitives against the real catalog and S3: statements and their results, one transaction
with a commit message and its own snapshot, the change feed of any schema.table, fingerprints, quoting, and the
catalog's advisory lock. Everything here writes only the schema `lake_tests`."""

from __future__ import annotations

import threading

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake, StatementFailed
from ducklake_kit.lake.changes import change_counts
from ducklake_kit.lake.inventory import fingerprint
from ducklake_kit.lake.locks import advisory_lock, lock_key
from ducklake_kit.lake.sql import qualified, quote_literal, schema_exists, split_name, table_exists
from ducklake_kit.lake.transactions import commit, last_committed_snapshot

SCHEMA = "lake_tests"


@pytest.fixture(scope="module")
def lake(stack):
    with Lake(stack.platform.endpoints()) as lk:
        lk.run(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        yield lk


def test_quoting_by_hand():
    assert quote_literal("it's") == "'it''s'"
    assert qualified("a b", 'say "hi"') == '"a b"."say ""hi"""'
    assert split_name("timetravel.trips") == ("timetravel", "trips")
    assert split_name("trips") == ("main", "trips")
    for bad in ("lake.timetravel.trips", "timetravel.", '"odd".trips'):
        with pytest.raises(KitError, match="not a table name"):
            split_name(bad)


def test_a_name_that_needs_quoting_round_trips(lake):
    name = 'odd "name"; DROP'
    lake.run(f"CREATE TABLE {qualified(SCHEMA, name)} (x INTEGER)")
    assert table_exists(lake.con, lake.alias, SCHEMA, name)
    assert not table_exists(lake.con, lake.alias, SCHEMA, "odd")
    assert schema_exists(lake.con, lake.alias, SCHEMA) and not schema_exists(lake.con, lake.alias, "no_such_schema")


@pytest.mark.parametrize(
    "sql, columns, rows",
    [
        ("WITH t AS (SELECT 42 AS answer) SELECT * FROM t", ["answer"], [(42,)]),
        ("-- a leading comment\nSELECT 1 AS one", ["one"], [(1,)]),
        ("FROM (VALUES (1), (2)) v(n) ORDER BY n", ["n"], [(1,), (2,)]),
        ("DESCRIBE SELECT 1 AS one", None, 1),
        ("CALL ducklake_set_option('lake', 'parquet_compression', 'zstd')", None, None),
    ],
)
def test_run_returns_rows_whatever_the_first_keyword(lake, sql, columns, rows):
    (res,) = lake.run(sql)
    if columns is not None:
        assert (res.columns, res.rows) == (columns, rows)
    elif isinstance(rows, int):
        assert len(res.rows) == rows and res.columns  # DESCRIBE: one row per column
    assert res.affected_rows is None and res.seconds is not None and res.seconds >= 0


def test_run_counts_affected_rows_and_keeps_the_results_before_a_failure(lake):
    t = f"{SCHEMA}.counted"
    first, second, third = lake.run(
        f"CREATE TABLE {t} (x INTEGER); INSERT INTO {t} SELECT range FROM range(5); "
        f"UPDATE {t} SET x = x + 1 WHERE x < 3"
    )
    assert (first.affected_rows, second.affected_rows, third.affected_rows) == (None, 5, 3)
    with pytest.raises(StatementFailed) as info:
        lake.run(f"DELETE FROM {t} WHERE x = 1; SELECT * FROM no_such_table; CREATE TABLE {SCHEMA}.never (x INTEGER)")
    failed = info.value
    assert (failed.index, failed.total) == (1, 3)
    assert failed.statement.startswith("SELECT * FROM no_such_table")
    assert "no_such_table" in failed.error
    assert [r.affected_rows for r in failed.results] == [1]  # the DELETE ran and its count is kept
    assert failed.line().startswith("Error: SQL failed at statement 2 of 3")
    assert not table_exists(lake.con, lake.alias, SCHEMA, "never")  # the statement after the failure did not run
    # a single failing statement keeps the message it always had
    with pytest.raises(StatementFailed, match=r"^SQL failed: Catalog Error"):
        lake.run("SELECT * FROM no_such_table")


def test_commit_reports_its_own_snapshot_even_when_another_writer_commits_next(stack, lake):
    t = f"{SCHEMA}.committed"
    lake.run(f"CREATE TABLE {t} (x INTEGER)")
    done = commit(
        lake, [f"INSERT INTO {t} VALUES (1), (2)", f"DELETE FROM {t} WHERE x = 2"], "lake_tests: two rows, one deleted"
    )
    assert done.affected_rows == 3
    with Lake(stack.platform.endpoints()) as other:  # another writer commits after us
        other.run(f"INSERT INTO {t} VALUES (9)")
        theirs = last_committed_snapshot(other)
    assert theirs is not None and done.snapshot_id is not None and theirs > done.snapshot_id
    assert last_committed_snapshot(lake) == done.snapshot_id  # ours stays ours
    message = lake.scalar(
        "SELECT commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [done.snapshot_id]
    )
    assert message == "lake_tests: two rows, one deleted"
    assert lake.scalar(f"SELECT list(x ORDER BY x) FROM {t} AT (VERSION => {done.snapshot_id})") == [1]


def test_commit_finds_its_snapshot_by_its_token_when_the_instance_moved_on(lake, monkeypatch):
    # DuckLake's last_committed_snapshot() is per DuckDB instance: a cursor committing on another thread in between
    # would move it. Simulated here: it answers a later snapshot; the commit still reports its own.
    from ducklake_kit.lake import transactions

    t = f"{SCHEMA}.tokens"
    lake.run(f"CREATE TABLE {t} (x INTEGER)")
    cursor = lake.cursor()
    real = transactions.last_committed_snapshot

    def moved_on(lk):
        ours = real(lk)
        cursor.execute(f"INSERT INTO {t} VALUES (2)")  # another commit on the same instance, after ours
        return real(lk) if real(lk) != ours else None

    monkeypatch.setattr(transactions, "last_committed_snapshot", moved_on)
    done = commit(lake, f"INSERT INTO {t} VALUES (1)", "lake_tests: token")
    monkeypatch.undo()
    assert last_committed_snapshot(lake) > done.snapshot_id  # the instance moved on, as it would have
    assert (
        lake.scalar("SELECT commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [done.snapshot_id])
        == "lake_tests: token"
    )
    assert lake.scalar(f"SELECT list(x) FROM {t} AT (VERSION => {done.snapshot_id})") == [1]
    # a transaction that changes nothing makes no snapshot, and says so
    assert commit(lake, f"SELECT count(*) FROM {t}", "lake_tests: nothing").snapshot_id is None


def test_a_failed_commit_leaves_nothing(lake):
    t = f"{SCHEMA}.atomic"
    lake.run(f"CREATE TABLE {t} (x INTEGER)")
    before = lake.current_snapshot()
    with pytest.raises(StatementFailed):
        commit(lake, f"INSERT INTO {t} VALUES (1); INSERT INTO {t} VALUES ('not a number')", "lake_tests: never")
    assert lake.scalar(f"SELECT count(*) FROM {t}") == 0
    assert (
        lake.scalar("SELECT count(*) FROM ducklake_snapshots('lake') WHERE commit_message = 'lake_tests: never'") == 0
    )
    assert lake.current_snapshot() >= before  # nothing of ours; others may have committed


def test_change_feed_of_a_schema_qualified_table(lake):
    t = f"{SCHEMA}.feed"
    lake.run(f"CREATE TABLE {t} (k INTEGER, v VARCHAR)")
    a = commit(lake, f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b'), (3, 'c')", "feed: insert").snapshot_id
    b = commit(lake, f"DELETE FROM {t} WHERE k = 1", "feed: delete").snapshot_id
    c = commit(lake, f"UPDATE {t} SET v = 'B' WHERE k = 2", "feed: update").snapshot_id
    assert change_counts(lake, t, a, a) == {"insert": 3}
    assert change_counts(lake, t, b, b) == {"delete": 1}
    assert change_counts(lake, t, c, c) == {"update_postimage": 1, "update_preimage": 1}
    assert change_counts(lake, t, a, c) == {"delete": 1, "insert": 3, "update_postimage": 1, "update_preimage": 1}


def test_fingerprint_sees_rows_not_files_or_order(lake):
    lake.run(f"CREATE TABLE {SCHEMA}.fp_a (x INTEGER, s VARCHAR); CREATE TABLE {SCHEMA}.fp_b (x INTEGER, s VARCHAR)")
    lake.run(f"INSERT INTO {SCHEMA}.fp_a VALUES (1, 'x'), (2, NULL), (2, NULL)")
    for row in ("(2, NULL)", "(1, 'x')", "(2, NULL)"):  # same rows, other order, three commits (other files)
        lake.run(f"INSERT INTO {SCHEMA}.fp_b VALUES {row}")
    fp = fingerprint(lake)
    assert fp[f"{SCHEMA}.fp_a"] == fp[f"{SCHEMA}.fp_b"] and fp[f"{SCHEMA}.fp_a"][0] == 3
    lake.run(f"DELETE FROM {SCHEMA}.fp_b WHERE x = 2 AND rowid = (SELECT min(rowid) FROM {SCHEMA}.fp_b WHERE x = 2)")
    assert fingerprint(lake)[f"{SCHEMA}.fp_b"] != fp[f"{SCHEMA}.fp_a"]  # one duplicate fewer: another multiset


def test_advisory_lock_is_exclusive_and_says_when_busy(stack):
    ep = stack.platform.endpoints()
    key = lock_key("dlk-test")
    holding, release = threading.Event(), threading.Event()

    def holder():
        with advisory_lock(ep, key, timeout_s=5, busy=KitError("unexpected")):
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        with pytest.raises(KitError, match="busy for the test"):
            with advisory_lock(ep, key, timeout_s=1, busy=KitError("busy for the test")):
                pass
    finally:
        release.set()
        thread.join(10)
    with advisory_lock(ep, key, timeout_s=1, busy=KitError("still held")):  # released with its session
        pass
    with pytest.raises(ValueError):
        lock_key("longer than eight")
    with pytest.raises(ValueError, match="positive"):  # PostgreSQL's lock_timeout 0 would wait forever
        with advisory_lock(ep, key, timeout_s=0, busy=KitError("never")):
            pass


def test_a_refused_s3_credential_is_said_plainly(stack):
    # issue 16: with a wrong S3 secret, `sql "SELECT sum(...)"` said "HTTP 403 ... Try: fix the statement"
    import dataclasses

    ep = stack.platform.endpoints()
    with Lake(ep) as lake:
        lake.run(
            "CREATE SCHEMA IF NOT EXISTS s3_refused; "
            "CREATE OR REPLACE TABLE s3_refused.t AS SELECT range AS i FROM range(1000)"
        )  # a Parquet file
    wrong = dataclasses.replace(ep, s3=dataclasses.replace(ep.s3, secret="not-the-secret"))
    try:
        with Lake(wrong) as lake, pytest.raises(KitError) as info:
            lake.run("SELECT sum(i) FROM s3_refused.t")
        assert "the S3 server refused the lake's credentials" in info.value.what, info.value.line()
        assert "S3 key and secret" in info.value.fix and "fix the statement" not in info.value.fix
    finally:
        with Lake(ep) as lake:
            lake.run("DROP SCHEMA s3_refused CASCADE")


def test_the_lake_connection_does_not_check_the_extensions_signatures_again(lake):
    # they passed DuckDB's check once for these files (lake/connection.py: extensions_verified): the connection is
    # opened without a second one (connect_config), has all three loaded from the wheels, and the check is on again
    from ducklake_kit.lake.connection import connect_config

    assert connect_config()["allow_unsigned_extensions"] is True
    assert lake.scalar("SELECT current_setting('allow_unsigned_extensions')") is False
    loaded = lake.con.execute(
        "SELECT extension_name, install_path FROM duckdb_extensions() WHERE loaded AND extension_name IN "
        "('ducklake', 'httpfs', 'postgres_scanner') ORDER BY 1"
    ).fetchall()
    assert [name for name, _ in loaded] == ["ducklake", "httpfs", "postgres_scanner"]
