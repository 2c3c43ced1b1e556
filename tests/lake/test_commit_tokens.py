"""Every autocommit write `sql` makes commits with a token of its own in its commit_extra_info (which run, which
statement), read back from the catalog; a user's own BEGIN ... COMMIT keeps the user's message; and when a COMMIT
raises, the token in the lake decides what the user is told: a real conflict that did not land says nothing
committed, a commit that landed before its error is a success, never run again."""

from __future__ import annotations

import json

import duckdb
import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.lake.connection import AUTHOR, StatementFailed

pytestmark = [pytest.mark.integration]
SCHEMA = "token_tests"


@pytest.fixture(scope="module")
def ep(stack):
    ep = stack.platform.endpoints()
    with Lake(ep) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
    return ep


def commits_since(lake: Lake, after: int) -> list[tuple[int, str | None, str | None, dict | None]]:
    """(snapshot, author, message, extra info) of every commit after snapshot `after`, from the catalog."""
    rows = lake.con.execute(
        "SELECT snapshot_id, author, commit_message, commit_extra_info FROM ducklake_snapshots('lake') "
        "WHERE snapshot_id > ? ORDER BY snapshot_id",
        [after],
    ).fetchall()
    return [(r[0], r[1], r[2], json.loads(r[3]) if r[3] else None) for r in rows]


def test_each_write_of_a_sql_run_carries_its_own_token_and_the_runs_id(stack, ep, cli):
    with Lake(ep) as lake:
        before = lake.current_snapshot()
    text = (
        f"CREATE TABLE {SCHEMA}.a AS SELECT range AS id FROM range(5); SELECT count(*) FROM {SCHEMA}.a; "
        f"INSERT INTO {SCHEMA}.a VALUES (10), (11); "
        f"BEGIN; DELETE FROM {SCHEMA}.a WHERE id = 0; CALL ducklake_set_commit_message('lake', 'me', 'mine'); COMMIT"
    )
    result = cli(stack.env, "sql", text)
    assert result.exit_code == 0, result.output
    with Lake(ep) as lake:
        made = commits_since(lake, before)
        assert lake.scalar(f"SELECT count(*) FROM {SCHEMA}.a") == 6  # 5 + 2 - 1: every statement ran once
    assert len(made) == 3, made  # the SELECT committed nothing
    (_, a1, m1, x1), (_, a2, m2, x2), (_, a3, m3, x3) = made
    assert (a1, m1, a2, m2) == (AUTHOR, None, AUTHOR, None)
    assert x1["run"] == x2["run"] == "sql" and x1["id"] == x2["id"]  # one run: one id
    assert (x1["statement"], x2["statement"]) == (1, 3)  # their places in the text (the SELECT was 2)
    assert x1["commit"] != x2["commit"] and len(x1["commit"]) == 32
    assert (a3, m3, x3) == ("me", "mine", None)  # the user's own transaction: the user's own message


def test_a_commit_that_lost_a_real_conflict_says_nothing_committed(ep, monkeypatch):
    """Another writer creates the same table between our statement and our COMMIT (optimistic: no gate to queue
    at), a real DuckLake conflict: the error says it did not land, and the lake holds the other writer's table."""
    with Lake(ep, commit_gate="optimistic") as lake, Lake(ep, commit_gate="optimistic") as other:
        lake.autocommit_tag = {"run": "test"}
        lake.con.execute("SET ducklake_max_retry_count = 0")  # DuckLake's own retry would only meet it again
        real = lake._commit_now

        def other_writer_first() -> None:
            other.run(f"CREATE TABLE {SCHEMA}.race AS SELECT 'other' AS who")
            real()

        monkeypatch.setattr(lake, "_commit_now", other_writer_first)
        before = lake.current_snapshot()
        with pytest.raises(StatementFailed) as failed:
            lake.run(f"CREATE TABLE {SCHEMA}.race AS SELECT 'us' AS who")
        assert "did not land (its token is not in the lake): nothing of it committed" in failed.value.error
        assert lake.scalar(f"SELECT string_agg(who) FROM {SCHEMA}.race") == "other"
        assert not lake.in_transaction
        assert [x for *_, x in commits_since(lake, before) if x and x.get("run") == "test"] == []


def test_a_commit_that_landed_before_its_error_is_a_success(ep, monkeypatch):
    """The COMMIT reaches the catalog and then raises (a connection lost on the way back, made here by raising after
    the real COMMIT): the token is in the lake, so the statement is a success, its rows there once."""
    with Lake(ep) as lake:
        lake.autocommit_tag = {"run": "test-landed"}
        real = lake._commit_now

        def lost_on_the_way_back() -> None:
            real()
            raise duckdb.IOException("connection lost after COMMIT")

        monkeypatch.setattr(lake, "_commit_now", lost_on_the_way_back)
        before = lake.current_snapshot()
        (result,) = lake.run(f"CREATE TABLE {SCHEMA}.landed AS SELECT range AS id FROM range(3)")
        assert result.statement_type == "CREATE"
        monkeypatch.undo()
        assert lake.scalar(f"SELECT count(*) FROM {SCHEMA}.landed") == 3
        tagged = [x for *_, x in commits_since(lake, before) if x and x.get("run") == "test-landed"]
        assert len(tagged) == 1 and tagged[0]["statement"] == 1
