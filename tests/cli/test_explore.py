"""Exploring by hand: `shell` (the DuckDB CLI with the lake attached) and `sql --expect` (the labs' checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _shell(stack, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "ducklake_test.py"), "shell", *args],
        cwd=ROOT,
        env={**os.environ, **stack.env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_shell_answers_from_the_lake_and_passes_its_arguments_to_duckdb(stack, cli):
    made = cli(stack.env, "sql", "CREATE OR REPLACE TABLE explore_shell AS SELECT range AS id FROM range(7)")
    assert made.exit_code == 0, made.output
    # arguments go to duckdb: -c runs one command; the init SQL (extensions, secrets, ATTACH, USE lake) ran first
    r = _shell(stack, "-batch", "-noheader", "-csv", "-c", "SELECT count(*), sum(id) FROM explore_shell")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "7,21", r.stdout  # only the answer: the init file's statements print nothing
    # piped SQL on stdin, as a learner's script would
    piped = _shell(stack, "-batch", "-noheader", "-csv", stdin="SELECT max(id) FROM lake.main.explore_shell;\n")
    assert piped.returncode == 0 and piped.stdout.strip() == "6", piped.stdout + piped.stderr


def test_shell_exits_non_zero_on_bad_sql(stack):
    r = _shell(stack, "-batch", "-c", "SELECT * FROM explore_no_such_table")
    assert r.returncode != 0
    assert "explore_no_such_table does not exist" in r.stderr


def test_sql_expect_passes_and_fails_on_the_computed_value(stack, cli):
    assert (
        cli(stack.env, "sql", "CREATE OR REPLACE TABLE explore_expect AS SELECT range AS id FROM range(5)").exit_code
        == 0
    )
    ok = cli(stack.env, "sql", "SELECT count(*) FROM explore_expect", "--expect", "5")
    assert ok.exit_code == 0 and "ok: expected 5, got 5" in ok.output, ok.output
    wrong = cli(stack.env, "sql", "SELECT count(*) FROM explore_expect", "--expect", "6")
    assert wrong.exit_code == 1 and "FAIL: expected 6, got 5" in wrong.output, wrong.output
    # booleans and NULL as SQL prints them; DML compares the affected-row count
    assert cli(stack.env, "sql", "SELECT count(*) = 5 FROM explore_expect", "--expect", "true").exit_code == 0
    assert cli(stack.env, "sql", "SELECT NULL", "--expect", "NULL").exit_code == 0
    dml = cli(stack.env, "sql", "DELETE FROM explore_expect WHERE id < 2", "--expect", "2")
    assert dml.exit_code == 0, dml.output
    # more than one value is not silently compared with its first cell
    many = cli(stack.env, "sql", "SELECT id FROM explore_expect", "--expect", "2")
    assert many.exit_code == 1 and "3 rows x 1 columns" in many.output, many.output


def test_sql_expect_json_says_error_when_the_value_differs(stack, cli):
    r = cli(stack.env, "sql", "SELECT 41 + 1", "--expect", "43", "--json")
    assert r.exit_code == 1
    body = json.loads(r.stdout)
    assert body["status"] == "error"
    assert body["result"]["expect"] == {"expected": "43", "actual": "42", "passed": False}
