"""`--json` of the commands tests/cli/test_cli.py does not drive through the CLI: query, maintain --dry-run,
timetravel, bench --out FILE and --json, and failures (a bad name, a failed check) as `status: error` with a non-zero exit.
Thin on purpose: the figures themselves are checked by test_queries, test_maintain, test_timetravel, test_bench.
On a stack of this module's own: `maintain --dry-run` fingerprints every table of the lake twice, and on the session's
lake (every other test's tables) that took 77 s at load 18."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.integration]
MONTH = "2012-05"  # the only month on this module's lake
ROWS = 2000
SHAPE = {"status", "result", "catalog_info"}


def _json(result) -> dict:
    return json.loads(result.stdout)


def _snapshot_count(module_stack, cli) -> int:
    doc = _json(cli(module_stack.env, "sql", "SELECT count(*) FROM ducklake_snapshots('lake')", "--json"))
    return doc["result"]["statements"][0]["rows"][0][0]


@pytest.fixture(scope="module")
def may_2012(module_stack) -> int:
    """Loads one small synthetic month through the CLI (skipped when already there); its accepted trips."""
    from typer.testing import CliRunner

    from ducklake_kit.cli import app

    result = CliRunner().invoke(
        app,
        ["load", "--source", "synthetic", "--months", MONTH, "--rows-per-month", str(ROWS), "--json"],
        env={**module_stack.env, "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert doc["status"] == "ok" and set(doc) == SHAPE
    files = doc["result"]["files"]
    assert [f["period"] for f in files] == [MONTH]
    return files[0]["rows_accepted"]


@pytest.mark.spark
def test_query_json_has_the_shape_the_answer_and_its_check(module_stack, cli, may_2012):
    result = cli(module_stack.env, "query", "daily_summary", "q1_trips_by_vendor", "--json")
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert set(doc) == SHAPE and doc["status"] == "ok"
    assert isinstance(doc["catalog_info"]["snapshot_id"], int) and doc["catalog_info"]["data_path"] == "s3://lake/"
    res = doc["result"]
    assert list(res["queries"]) == ["daily_summary", "q1_trips_by_vendor"]
    # each named query's answer was checked against the source files, and only those
    assert [(c["name"], c["passed"]) for c in res["checks"]] == [
        ("query daily_summary matches the source", True),
        ("query q1_trips_by_vendor matches the source", True),
    ]
    assert res["failed"] == 0 and res["passed"] == 2
    # the answer itself: the days of May 2012 hold exactly the trips this module loaded
    daily = res["queries"]["daily_summary"]
    assert daily["columns"][:2] == ["pickup_date", "trips"]
    may = [row for row in daily["rows"] if row[0].startswith(MONTH)]
    assert may and sum(row[1] for row in may) == may_2012
    # --no-check: the same answers, no check computed, and nothing failed (it said `error` before)
    unchecked = cli(module_stack.env, "query", "daily_summary", "--no-check", "--json")
    assert unchecked.exit_code == 0, unchecked.output
    doc = _json(unchecked)
    assert (doc["status"], doc["result"]["checks"]) == ("ok", [])
    assert doc["result"]["queries"]["daily_summary"]["rows"] == daily["rows"]


@pytest.mark.spark
def test_query_json_reports_a_failed_check_as_error(module_stack, cli, may_2012, monkeypatch):
    from ducklake_kit.lessons import queries

    # a reference that counts one trip too many: the lake's (right) answer must now fail its check
    wrong = queries.REFERENCE_SQL["q1_trips_by_vendor"].replace("count(*)", "count(*) + 1", 1)
    assert wrong != queries.REFERENCE_SQL["q1_trips_by_vendor"]
    monkeypatch.setitem(queries.REFERENCE_SQL, "q1_trips_by_vendor", wrong)
    result = cli(module_stack.env, "query", "q1_trips_by_vendor", "--json")
    assert result.exit_code == 1, result.output
    doc = _json(result)
    assert doc["status"] == "error" and set(doc) == SHAPE
    assert [(c["name"], c["passed"]) for c in doc["result"]["checks"]] == [
        ("query q1_trips_by_vendor matches the source", False)
    ]


def test_an_unknown_query_is_status_error_and_exit_3(module_stack, cli):
    result = cli(module_stack.env, "query", "no_such_query", "--json")
    assert result.exit_code == 3
    doc = _json(result)
    assert set(doc) == SHAPE and doc["status"] == "error"
    assert doc["result"]["error"].startswith(
        "Error: unknown query 'no_such_query'. Try: choose one of: q1_trips_by_vendor"
    )


@pytest.mark.spark
def test_maintain_dry_run_json_changes_nothing(module_stack, cli, may_2012):
    snapshots = _snapshot_count(module_stack, cli)
    assert snapshots > 1  # a history to list: the lake's first snapshot and may_2012's load, at least
    result = cli(module_stack.env, "maintain", "--dry-run", "--older-than", "0 seconds", "--json")
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert set(doc) == SHAPE and doc["status"] == "ok"
    res = doc["result"]
    assert res["dry_run"] is True and res["failed"] == 0 and res["passed"] >= 1
    # a cutoff of '0 seconds' is now (the word `now` is not an interval and is refused): everything but the current
    # snapshot would expire, and is listed, not done
    assert len(res["would"]["expire_snapshots"]) == snapshots - 1
    assert "done" not in res
    assert res["after"] == res["before"]
    assert _snapshot_count(module_stack, cli) == snapshots  # a dry run commits nothing, not even a snapshot


@pytest.mark.spark
def test_timetravel_json_every_figure_checked(module_stack, cli):
    result = cli(module_stack.env, "timetravel", "--rows-per-month", "1500", "--json")
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert set(doc) == SHAPE and doc["status"] == "ok"
    res = doc["result"]
    assert res["failed"] == 0 and res["passed"] >= 8
    counts = {c["step"]: c["trips"] for c in res["counts_at_version"]}
    assert set(counts) == {"month 1", "month 2", "correction", "restore"}
    assert counts["month 1"] < counts["month 2"] and counts["correction"] < counts["month 2"] == counts["restore"]
    assert res["at_timestamp"]["trips"] == counts["month 1"]
    # every snapshot the lesson names is one the catalog lists
    listed = {s["snapshot_id"] for s in res["snapshots"]}
    assert {c["snapshot_id"] for c in res["counts_at_version"]} <= listed


def test_bench_concurrency_out_file(module_stack, cli, tmp_path):
    out = tmp_path / "bench" / "concurrency.json"
    out.parent.mkdir()
    # the two modes this test reads (the others, and their figures, are tests/bench/test_bench.py's)
    result = cli(
        module_stack.env, "bench", "--suite", "concurrency", "--writers", "2", "--ops", "5", "--modes", "file,ducklake",
        "--out", str(out), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    # --json: stdout is the envelope alone (the table and progress went to stderr); --out: the same figures in a file
    envelope = _json(result)
    assert envelope["status"] == "ok" and set(envelope) == SHAPE
    assert "bench --suite concurrency: 2 writers x 5 inserts" in result.stderr
    doc = json.loads(out.read_text())
    assert envelope["result"]["results"]["ducklake"]["actual_rows"] == doc["results"]["ducklake"]["actual_rows"] == 10
    assert (doc["suite"], doc["writers"], doc["ops_per_writer"]) == ("concurrency", 2, 5)
    assert list(doc["results"]) == ["file", "ducklake"]
    lake, file = doc["results"]["ducklake"], doc["results"]["file"]
    assert (lake["expected_rows"], lake["actual_rows"], lake["rows_lost"], lake["errors"]) == (10, 10, 0, 0)
    assert file["rows_lost"] == file["errors"] and file["succeeded"] + file["errors"] == 10
    # the goals are printed as computed (the rule itself: tests/bench/test_bench.py::test_goals_met_and_reachable)
    met = doc["goals"]["met"]
    assert (met["errors"], met["rows_lost"]) == (True, True)
    assert " ".join(str(met).split()) in " ".join(result.stderr.split())
    assert doc["floor"]["cpu_ms_per_insert"] > 0 and doc["floor"]["total_s_at_least"] > 0
