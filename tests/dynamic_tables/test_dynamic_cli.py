"""`dynamic ...` and `sql` with dynamic-table DDL, as a user runs them: exit codes, one-line errors, the JSON shape,
and `refresh --check` (the full-recompute comparison a lab's Verify uses) failing when a table is wrong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

S = "dt_cli"
ROOT = Path(__file__).resolve().parents[2]


def _json(result) -> dict:
    return json.loads(result.stdout)


@pytest.fixture
def cli_env(stack, cli):
    def run(*args: str):
        return cli(stack.env, *args)

    # one `sql` each way (each run attaches the lake: seven runs were a third of this file's time); the dynamic
    # tables go first (`over` reads `per_g`), the schema with what a test or an earlier run left in it
    drop = (
        f"DROP DYNAMIC TABLE IF EXISTS {S}.over; DROP DYNAMIC TABLE IF EXISTS {S}.per_g; "
        f"DROP DYNAMIC TABLE IF EXISTS {S}.snow; DROP DYNAMIC TABLE IF EXISTS {S}.both; "
        f"DROP SCHEMA IF EXISTS {S} CASCADE"
    )
    made = run(
        "sql", f"{drop}; CREATE SCHEMA {S}; CREATE TABLE {S}.t AS SELECT range % 4 AS g, range AS v FROM range(40)"
    )
    assert made.exit_code == 0, made.output
    yield run
    dropped = run("sql", drop)
    assert dropped.exit_code == 0, dropped.output


def test_create_show_refresh_check_and_history(cli_env, tmp_path):
    f = tmp_path / "per_g.sql"
    f.write_text(
        f"\ufeffCREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '5 minutes' AS\n"  # an editor's byte-order mark
        f"  SELECT g, sum(v) AS s, count(*) AS n FROM {S}.t GROUP BY g;\n",
        encoding="utf-8",
    )
    made = cli_env("dynamic", "create", str(f))
    assert made.exit_code == 0, made.output
    assert f"created {S}.per_g (lag 5 minutes, ADAPTIVE): 4 rows" in made.output
    shown = _json(cli_env("dynamic", "show", f"{S}.per_g", "--json"))["result"]
    assert (shown["plan"], shown["lag"], shown["columns"]) == ("aggregate", "5 minutes", ["g", "s", "n"])
    assert list(shown["sources"]) == [f"{S}.t"] and shown["sources"][f"{S}.t"] == shown["data_snapshot"]
    assert cli_env("sql", f"INSERT INTO {S}.t VALUES (1, 1000), (9, 1)").exit_code == 0
    refreshed = cli_env("dynamic", "refresh", f"{S}.per_g", "--check", "--json")
    assert refreshed.exit_code == 0, refreshed.output
    doc = _json(refreshed)["result"]
    [r] = doc["refreshes"]
    assert (r["status"], r["mode"], r["rows_inserted"], r["rows_deleted"]) == ("SUCCEEDED", "INCREMENTAL", 2, 1)
    assert doc["checks"] == {f"{S}.per_g": {"only_in_table": 0, "only_in_query": 0}}
    history = _json(cli_env("dynamic", "history", f"{S}.per_g", "--json"))["result"]["refreshes"]
    assert [(h["trigger"], h["mode"]) for h in history] == [("manual", "INCREMENTAL"), ("create", "FULL")]


def test_snowflakes_ddl_as_written_creates_shows_what_was_ignored_and_refreshes_incrementally(cli_env):
    # the shape of Snowflake's documentation: WAREHOUSE (required there), clustering, a comment, a column list
    text = (
        f"CREATE OR REPLACE DYNAMIC TABLE lake.{S}.snow (grp, total)\n  LAG = '1 hour'\n  WAREHOUSE = transform_wh\n"
        f"  REFRESH_MODE = INCREMENTAL\n  CLUSTER BY (grp)\n  COMMENT = 'totals per group'\n"
        f"AS SELECT g, sum(v) FROM {S}.t GROUP BY g"
    )
    made = cli_env("dynamic", "create", "--sql", text)
    assert made.exit_code == 0, made.output
    assert f"created {S}.snow (lag 1 hour, INCREMENTAL): 4 rows" in made.output
    assert "ignored: WAREHOUSE = transform_wh; CLUSTER BY (grp) (Snowflake's" in made.output
    shown = _json(cli_env("dynamic", "show", f"{S}.snow", "--json"))["result"]
    assert (shown["columns"], shown["comment"]) == (["grp", "total"], "totals per group")
    assert shown["ignored"] == "WAREHOUSE = transform_wh; CLUSTER BY (grp)" and shown["plan"] == "aggregate"
    assert cli_env("sql", f"INSERT INTO {S}.t VALUES (2, 500)").exit_code == 0
    refreshed = cli_env("dynamic", "refresh", f"{S}.snow", "--check", "--json")
    assert refreshed.exit_code == 0, refreshed.output
    doc = _json(refreshed)["result"]
    assert [r["mode"] for r in doc["refreshes"]] == ["INCREMENTAL"]
    assert doc["checks"] == {f"{S}.snow": {"only_in_table": 0, "only_in_query": 0}}


def test_a_union_all_over_a_cte_and_a_distinct_branch_is_incremental(cli_env):
    text = (
        f"CREATE OR REPLACE DYNAMIC TABLE lake.{S}.both LAG = '1 hour' WAREHOUSE = wh REFRESH_MODE = INCREMENTAL AS\n"
        f"WITH evens AS (SELECT g, v FROM {S}.t WHERE v % 2 = 0)\n"
        f"SELECT g, v FROM evens UNION ALL SELECT DISTINCT g, -1 FROM {S}.t"
    )
    made = cli_env("dynamic", "create", "--sql", text)
    assert made.exit_code == 0, made.output
    assert f"created {S}.both (lag 1 hour, INCREMENTAL): 24 rows" in made.output
    shown = _json(cli_env("dynamic", "show", f"{S}.both", "--json"))["result"]
    assert shown["plan"] == "union" and shown["how"].startswith("union: UNION ALL of 2 branches (rows, rows)")
    changed = cli_env("sql", f"DELETE FROM {S}.t WHERE g = 3; INSERT INTO {S}.t VALUES (5, 50), (5, 51)")
    assert changed.exit_code == 0, changed.output
    refreshed = cli_env("dynamic", "refresh", f"{S}.both", "--check", "--json")
    assert refreshed.exit_code == 0, refreshed.output
    doc = _json(refreshed)["result"]
    assert [(r["mode"], r["rows_deleted"], r["rows_inserted"]) for r in doc["refreshes"]] == [("INCREMENTAL", 1, 2)]
    assert doc["checks"] == {f"{S}.both": {"only_in_table": 0, "only_in_query": 0}}


def test_refresh_check_fails_when_a_table_is_wrong(cli_env):
    assert (
        cli_env(
            "sql",
            f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '1 hour' AS SELECT g, count(*) AS n FROM {S}.t GROUP BY g",
        ).exit_code
        == 0
    )
    cli_env("sql", f"UPDATE {S}.per_g SET n = n + 1 WHERE g = 0")  # someone wrote into it behind the refresher's back
    result = cli_env("dynamic", "refresh", f"{S}.per_g", "--check")
    assert result.exit_code == 1, result.output
    assert (
        f"FAIL: {S}.per_g differs from its query run in full (1 rows only in the table, 1 only in the query)"
        in result.output
    )


def test_check_reports_a_table_of_the_clock_as_not_compared_and_compares_the_others(cli_env):
    # issue 29: a table over now() failed every `refresh --check`, for all tables, forever
    made = cli_env(
        "sql",
        f"CREATE DYNAMIC TABLE {S}.over TARGET_LAG = '1 hour' AS SELECT g, v, now() AS seen FROM {S}.t; "
        f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '1 hour' AS SELECT g, count(*) AS n FROM {S}.t GROUP BY g",
    )
    assert made.exit_code == 0, made.output
    assert cli_env("sql", f"INSERT INTO {S}.t VALUES (1, 1000)").exit_code == 0
    result = cli_env("dynamic", "refresh", "--check", "--json")
    assert result.exit_code == 0, result.output
    doc = _json(result)["result"]
    assert doc["checks"][f"{S}.per_g"] == {"only_in_table": 0, "only_in_query": 0}  # still compared
    assert f"{S}.over" not in doc["checks"]  # neither passed nor failed
    assert doc["not_compared"] == {f"{S}.over": "not comparable: depends on the time (now())"}
    cli_env("sql", f"UPDATE {S}.per_g SET n = n + 1 WHERE g = 0")  # a wrong table still fails the run
    text = cli_env("dynamic", "refresh", "--check")
    assert text.exit_code == 1, text.output
    assert f"not compared: {S}.over: not comparable: depends on the time (now())" in text.output
    assert f"FAIL: {S}.per_g differs from its query run in full" in text.output


def test_sql_takes_the_ddl_among_other_statements(cli_env):
    result = cli_env(
        "sql",
        f"INSERT INTO {S}.t VALUES (7, 7); "
        f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = DOWNSTREAM AS SELECT g, max(v) AS hi FROM {S}.t GROUP BY g; "
        f"CREATE DYNAMIC TABLE {S}.over TARGET_LAG = '1 minute' AS SELECT g, hi FROM {S}.per_g WHERE hi > 30; "
        "SHOW DYNAMIC TABLES",
        "--json",
    )
    assert result.exit_code == 0, result.output
    statements = _json(result)["result"]["statements"]
    assert statements[0]["affected_rows"] == 1
    assert [s["rows"][0][:2] for s in statements[1:3]] == [[f"{S}.per_g", 5], [f"{S}.over", 4]]
    listed = {r[0]: r for r in statements[3]["rows"]}
    assert listed[f"{S}.per_g"][2] == "DOWNSTREAM" and listed[f"{S}.over"][2] == "1 minute"
    refused = cli_env("dynamic", "drop", f"{S}.per_g")
    assert refused.exit_code == 3
    assert refused.stderr.strip() == f"Error: dynamic table {S}.per_g is read by {S}.over. Try: drop those first."
    altered = cli_env("dynamic", "alter", f"{S}.over", "lag", "2 hours")
    assert altered.exit_code == 0 and f"{S}.over: ACTIVE, lag 2 hours" in altered.output
    suspended = cli_env("sql", f"ALTER DYNAMIC TABLE {S}.over SUSPEND", "--json")
    assert _json(suspended)["result"]["statements"][0]["rows"][0][1] == "SUSPENDED"
    ran = cli_env("dynamic", "run", "--once", "--json")
    assert ran.exit_code == 0, ran.output
    assert all(r["name"] != f"{S}.over" for r in _json(ran)["result"]["refreshes"])  # suspended: not scheduled


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["dynamic", "create", "--sql", "CREATE DYNAMIC TABLE x TARGET_LAG = 'soon' AS SELECT 1 AS a"],
            "Error: TARGET_LAG 'soon' is not a lag. Try: give a positive whole number and a unit",
        ),
        (
            ["dynamic", "create", "--sql", f"CREATE DYNAMIC TABLE x TARGET_LAG = '1 hour' AS SELECT * FROM {S}.nope"],
            f"Error: dynamic table main.x reads {S}.nope, which does not exist in the lake.",
        ),
        (
            [
                "dynamic",
                "create",
                "--sql",
                "CREATE DYNAMIC TABLE x TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
                f"SELECT g, row_number() OVER (ORDER BY g) AS r FROM {S}.t",
            ],
            "Error: dynamic table main.x cannot be refreshed incrementally: WINDOW_WITHOUT_PARTITION_BY: a window "
            "function without PARTITION BY, or windows partitioned differently.",
        ),
        # issue 29: blamed on the services (NumericValueOutOfRange ... Try: run `status`)
        (
            [
                "dynamic",
                "create",
                "--sql",
                f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '99999999999999999999 days' AS SELECT g FROM {S}.t",
            ],
            "Error: TARGET_LAG '99999999999999999999 days' is too long: the longest lag is 24855 days. "
            "Try: give at most '24855 days'",
        ),
        (
            ["sql", f"ALTER DYNAMIC TABLE {S}.per_g SET TARGET_LAG = '9999999999 seconds'"],
            "Error: TARGET_LAG '9999999999 seconds' is too long: the longest lag is 24855 days.",
        ),
        (
            ["dynamic", "alter", "whatever", "lag", "2147483648 seconds"],
            "Error: TARGET_LAG '2147483648 seconds' is too long: the longest lag is 24855 days.",
        ),
        # issue 29: accepted, then every `refresh --check` failed
        (
            [
                "dynamic",
                "create",
                "--sql",
                f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '1 hour' AS "
                f"SELECT g, v FROM {S}.t WHERE v < random() * 1000",
            ],
            f"Error: the query of dynamic table {S}.per_g calls random(), which is not deterministic",
        ),
        (["dynamic", "show", "no_such_table"], "Error: there is no dynamic table main.no_such_table"),
        (["dynamic", "alter", "whatever", "explode"], "Error: `explode` is not an alteration."),
        (["dynamic", "run", "--once", "--for", "3"], "Error: give --once or --for, not both."),
    ],
)
def test_bad_input_is_one_line_and_exit_3(cli_env, args, message):
    result = cli_env(*args)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_run_stops_on_sigterm_after_the_round_under_way(stack, cli_env):
    """`dynamic run` as its own process: it refreshes a stale table, and SIGTERM stops it cleanly (exit 0)."""
    assert (
        cli_env(
            "sql",
            f"CREATE DYNAMIC TABLE {S}.per_g TARGET_LAG = '1 second' INITIALIZE = ON_SCHEDULE AS "
            f"SELECT g, sum(v) AS s FROM {S}.t GROUP BY g",
        ).exit_code
        == 0
    )
    proc = subprocess.Popen(
        [sys.executable, "ducklake_test.py", "dynamic", "run", "--for", "120", "--tick", "0.2"],
        cwd=ROOT,
        env={**os.environ, **stack.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the first round fills the table (ON_SCHEDULE: empty until then)
            if cli_env("sql", f"SELECT count(*) FROM {S}.per_g", "--expect", "4").exit_code == 0:
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"{S}.per_g: SUCCEEDED full" in out and "stopped (signal)" in out
