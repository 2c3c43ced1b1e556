"""The harness as a user drives it: exit codes, one-line errors, the JSON shape, and the `all` flow."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _json(result) -> dict:
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def first_all(stack) -> dict:
    """`all --json` once on the session's lake (about 90 s on 2 cores): its envelope, for the tests that read it or
    run the flow again on the same lake."""
    result = CliRunner().invoke(app, ["all", "--json"], env={**stack.env, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return _json(result)


def test_all_runs_the_flow_and_every_check_holds(first_all):
    doc = first_all
    assert doc["status"] == "ok"
    assert set(doc) == {"status", "result", "catalog_info"}
    assert doc["result"]["failed"] == 0 and doc["result"]["passed"] >= 10
    assert doc["catalog_info"]["data_path"] == "s3://lake/"
    names = [c["name"] for c in doc["result"]["checks"]]
    assert "the load made exactly one snapshot" in names and "re-running the load skips every file" in names
    assert (
        sum(n.startswith("pipeline: marts.") and "equals the same figure computed from trips" in n for n in names) == 5
    )
    assert "dynamic: main.daily_revenue_by_borough refreshed incrementally" in names
    assert sum(n.startswith("dynamic: ") and "equals its query run in full at snapshot" in n for n in names) == 3
    assert doc["catalog_info"]["snapshot_id"] >= doc["result"]["load"]["snapshot_id"]


def test_sql_returns_rows_for_any_row_returning_statement_and_real_affected_counts(stack, cli):
    sql = (
        "CREATE OR REPLACE TABLE cli_t (id INT, name VARCHAR); "
        "INSERT INTO cli_t VALUES (1, 'a'), (2, 'b'), (3, NULL); "
        "UPDATE cli_t SET name = 'z' WHERE id >= 2; "
        "DELETE FROM cli_t WHERE id = 1; "
        "FROM cli_t ORDER BY id; "
        "WITH x AS (SELECT count(*) AS n FROM cli_t) SELECT n FROM x"
    )
    result = cli(stack.env, "sql", sql, "--json")
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert doc["status"] == "ok"
    stmts = doc["result"]["statements"]
    assert [s["affected_rows"] for s in stmts[1:4]] == [3, 2, 1]
    assert stmts[4]["columns"] == ["id", "name"] and stmts[4]["rows"] == [[2, "z"], [3, "z"]]
    assert stmts[5]["rows"] == [[2]]  # a WITH query returns rows too
    assert isinstance(doc["catalog_info"]["snapshot_id"], int)


def test_time_travel_syntax_parses_through_sql(stack, cli):
    cli(stack.env, "sql", "CREATE OR REPLACE TABLE tt (i INT); INSERT INTO tt VALUES (1)")
    v1 = _json(cli(stack.env, "sql", "SELECT max(snapshot_id) FROM ducklake_snapshots('lake')", "--json"))["result"][
        "statements"
    ][0]["rows"][0][0]
    cli(stack.env, "sql", "INSERT INTO tt VALUES (2), (3)")
    doc = _json(cli(stack.env, "sql", f"SELECT count(*) FROM tt AT (VERSION => {v1})", "--json"))
    assert doc["result"]["statements"][0]["rows"] == [[1]]


@pytest.mark.parametrize(
    "query, message",
    [
        ("SELEC 1", "Error: SQL does not parse: Parser Error"),
        (
            "SELECT * FROM no_such_table",
            "Error: SQL failed: Catalog Error: Table with name no_such_table does not exist",
        ),
    ],
)
def test_bad_sql_gives_one_line_and_a_nonzero_exit(stack, cli, query, message):
    result = cli(stack.env, "sql", query)
    assert result.exit_code == 3
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    doc = _json(cli(stack.env, "sql", query, "--json"))
    assert doc["status"] == "error" and doc["result"]["error"].startswith(message)


def test_sql_reads_a_file_or_stdin_that_starts_with_a_comment(stack, cli, tmp_path):
    # issue 29: `sql "$(cat file.sql)"` failed with "No such option: -- ..." when the file began with a comment
    text = "-- how many, from a file\nSELECT 40 + 2 AS answer; -- the end\n"
    path = tmp_path / "q.sql"
    path.write_text("\ufeff" + text, encoding="utf-8")  # an editor's byte-order mark is not SQL
    for args, stdin in ((["--file", str(path)], None), (["-f", "-"], text), (["--", text], None)):
        result = cli(stack.env, "sql", "--json", *args, input=stdin)
        assert result.exit_code == 0, (args, result.output)
        assert _json(result)["result"]["statements"][0]["rows"] == [[42]], args
    assert cli(stack.env, "sql", "--file", str(path), "--expect", "42").exit_code == 0


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "Error: give the SQL as text or with --file, one of the two."),
        (["SELECT 1", "--file", "q.sql"], "Error: give the SQL as text or with --file, one of the two."),
        (
            ["--file", "/no/such/file.sql"],
            "Error: cannot read the SQL file /no/such/file.sql (No such file or directory).",
        ),
    ],
)
def test_sql_without_exactly_one_readable_source_is_one_line_and_exit_3(stack, cli, args, message):
    result = cli(stack.env, "sql", *args)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1, result.stderr
    doc = _json(cli(stack.env, "sql", *args, "--json"))
    assert doc["status"] == "error" and doc["result"]["error"].startswith(message)


def test_sql_when_the_s3_server_was_killed_names_it_and_up(fresh_stack, cli):
    # issue 29: a statement that could not reach the lake's files said "fix the statement"
    import psutil

    from ducklake_kit.lake import Lake
    from ducklake_kit.platforms import procs

    p = fresh_stack.platform
    p.up()
    with Lake(p.endpoints()) as lake:  # more rows than DuckLake inlines: its data is a Parquet file on S3
        lake.run("CREATE TABLE on_s3 AS SELECT range AS id FROM range(1000)")
    pid = procs.read_pid(p.state.pid_file("s3")).pid
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(10) if psutil.pid_exists(pid) else None
    url = p.endpoints().s3.url
    result = cli(fresh_stack.env, "sql", "SELECT sum(id) FROM on_s3")
    assert result.exit_code == 3, result.output
    assert result.stderr.strip() == (
        f"Error: SQL failed because the lake's S3 server stopped answering (S3 at {url} "
        "is not reachable). Try: run `up` (it restarts what is down), then the SQL "
        "that did not run."
    ), result.stderr
    doc = _json(cli(fresh_stack.env, "sql", "SELECT sum(id) FROM on_s3", "--json"))
    assert doc["status"] == "error" and "S3 server stopped answering" in doc["result"]["error"]
    p.up()  # what the message says to do works (the fixture discards the stack afterwards)
    assert cli(fresh_stack.env, "sql", "SELECT sum(id) FROM on_s3", "--expect", "499500").exit_code == 0


def test_a_failed_statement_leaves_stored_data_untouched(stack, cli):
    cli(stack.env, "sql", "CREATE OR REPLACE TABLE keep_me AS SELECT 42 AS answer")
    result = cli(stack.env, "sql", "INSERT INTO keep_me VALUES ('not a number')")
    assert result.exit_code == 3
    doc = _json(cli(stack.env, "sql", "FROM keep_me", "--json"))
    assert doc["result"]["statements"][0]["rows"] == [[42]]


def test_status_reports_health_ports_and_sizes(stack, cli):
    result = cli(stack.env, "status", "--json")
    assert result.exit_code == 0, result.output
    services = {s["name"]: s for s in _json(result)["result"]["services"]}
    assert set(services) == {"postgres", "s3"} and all(s["healthy"] for s in services.values())
    if stack.env["DUCKLAKE_PLATFORM"] == "local":
        assert services["postgres"]["port"] == stack.pg_port and services["s3"]["port"] == stack.s3_port
        assert services["postgres"]["data_bytes"] > 1_000_000


def test_connect_prints_working_psql_and_duckdb_commands(stack, cli, local_only):
    result = cli(stack.env, "connect", "--json")
    assert result.exit_code == 0, result.output
    info = _json(result)["result"]
    init_sql = Path(info["duckdb_init_sql"])
    assert oct(init_sql.stat().st_mode & 0o777) == "0o600"
    # the printed psql command works as printed, with the password from the 0600 pgpass file
    import subprocess

    out = subprocess.run(
        info["psql"] + " -tAc 'select count(*) > 0 from ducklake_snapshot'",
        shell=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout.strip() == "t", out.stderr
    duck = subprocess.run(
        info["duckdb_cli"] + " -batch -noheader -csv -c \"SELECT count(*) > 0 FROM ducklake_snapshots('lake')\"",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert duck.returncode == 0 and duck.stdout.strip().splitlines()[-1] == "true", duck.stdout + duck.stderr


def test_all_again_on_the_external_platform_is_safe_and_every_check_holds(stack, cli, local_only, first_all):
    # the same lake reached as --platform external, where `all` already ran: re-running the flow's lake stages is safe
    # (the foundation table is rebuilt, the load is skipped, the lessons' answers and time travel hold again on the
    # lake as the first run left it), and they run on that platform; the plane's stages (workers, pipeline, steps,
    # dynamic) and the bench are left out (--stages): the first run checked them, and they reach the lake the same way
    ep = stack.platform.endpoints()
    env = {
        "DUCKLAKE_PLATFORM": "external",
        "DUCKLAKE_HOME": str(stack.home),
        "DUCKLAKE_PG_DSN": f"postgresql://{ep.pg.user}:{ep.pg.password}@127.0.0.1:{ep.pg.port}/{ep.pg.dbname}",
        "DUCKLAKE_S3_ENDPOINT": ep.s3.url,
        "DUCKLAKE_S3_KEY_ID": ep.s3.key_id,
        "DUCKLAKE_S3_SECRET": ep.s3.secret,
    }
    again = cli(env, "all", "--stages", "foundation,load,queries,timetravel,maintain")
    assert again.exit_code == 0, again.output
    assert "ducklake-test on --platform external" in again.output
    summary = again.output[again.output.index("Summary") :]
    ran = [
        s
        for s in ("foundation", "load", "queries", "timetravel", "maintain", "workers", "dynamic", "bench")
        if s in summary
    ]
    assert ran == ["foundation", "load", "queries", "timetravel", "maintain"], summary
    assert "re-running the load skips every file" in again.output
    assert re.search(r"(\d+)/\1 checks passed", again.output), again.output
    assert _json(cli(env, "sql", "SELECT 1", "--json"))["catalog_info"]["platform"] == "external"
    down = cli(env, "down")
    assert down.exit_code == 0 and "nothing to stop" in down.output
    reset = cli(env, "reset", "--yes")
    assert reset.exit_code == 3 and "only works on the platforms the kit runs" in reset.stderr


@pytest.mark.parametrize(
    ("stages", "line"),
    [
        ("foundation,nope", "Error: unknown stage 'nope'. Try: choose from: foundation, load, queries,"),
        ("maintain", "Error: stage maintain needs timetravel"),
    ],
)
def test_all_refuses_an_unknown_or_incomplete_stage_list_before_anything_runs(cli, tmp_path, stages, line):
    result = cli({"DUCKLAKE_HOME": str(tmp_path)}, "all", "--stages", stages)
    assert result.exit_code == 3 and result.stderr.startswith(line), result.output
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_external_platform_without_settings_says_what_to_set(cli, tmp_path):
    result = cli({"DUCKLAKE_PLATFORM": "external", "DUCKLAKE_HOME": str(tmp_path)}, "status")
    assert result.exit_code == 3
    assert result.stderr.startswith("Error: --platform external needs DUCKLAKE_PG_DSN, DUCKLAKE_S3_ENDPOINT")


def test_external_wrong_password_is_one_line(stack, cli, local_only):
    ep = stack.platform.endpoints()
    env = {
        "DUCKLAKE_PLATFORM": "external",
        "DUCKLAKE_HOME": str(stack.home),
        "DUCKLAKE_PG_DSN": f"postgresql://{ep.pg.user}:wrong@127.0.0.1:{ep.pg.port}/{ep.pg.dbname}",
        "DUCKLAKE_S3_ENDPOINT": ep.s3.url,
        "DUCKLAKE_S3_KEY_ID": ep.s3.key_id,
        "DUCKLAKE_S3_SECRET": ep.s3.secret,
    }
    result = cli(env, "sql", "SELECT 1")
    assert result.exit_code == 3
    assert result.stderr.strip() == (
        f"Error: PostgreSQL at 127.0.0.1:{ep.pg.port} refused the password for user "
        f"'{ep.pg.user}'. Try: check the catalog credentials."
    )


def test_commands_before_up_say_to_run_up(cli, tmp_path):
    result = cli({"DUCKLAKE_HOME": str(tmp_path / "new")}, "sql", "SELECT 1")
    assert result.exit_code == 3
    assert "has not been set up" in result.stderr and "run `up` first" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["spark", "up", "--workers", "2"],
            "Error: spark up takes --spark-workers N (the Spark workers); --workers is the worker plane's Dask "
            "workers. Try: spark up --spark-workers 2.",
        ),
        (
            ["bench", "--suite", "concurrency", "--workers", "3"],
            "Error: bench --suite concurrency takes --writers N (the concurrent writers); --workers is the worker "
            "plane's Dask workers. Try: bench --suite concurrency --writers 3.",
        ),
        (
            ["bench", "--suite", "pipeline", "--writers", "2"],
            "Error: --writers is for --suite concurrency, not pipeline. Try: bench --suite pipeline --workers 2.",
        ),
    ],
    ids=["spark-up", "bench-concurrency", "bench-pipeline"],
)
def test_workers_means_dask_workers_and_the_other_meanings_are_refused_with_their_name(cli, tmp_path, args, message):
    # one name per concept: --workers counts the worker plane's Dask workers; Spark's and the writers' have their own
    home = tmp_path / "home"
    result = cli({"DUCKLAKE_HOME": str(home)}, *args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == message
    assert not home.exists()  # refused before anything started


def test_reset_asks_first_and_keeps_data_when_declined(fresh_stack, cli):
    fresh_stack.platform.up()
    result = cli(fresh_stack.env, "reset", input="n\n")
    assert result.exit_code == 3 and "nothing was deleted" in result.stderr
    assert fresh_stack.state.credentials_file.exists()
    result = cli(fresh_stack.env, "reset", "--yes")
    assert result.exit_code == 0, result.output
    assert not fresh_stack.home.exists()


@pytest.mark.parametrize("stdin", ["</dev/null", "<&-"], ids=["at-its-end", "closed"])
def test_reset_with_no_answer_is_a_no_exit_3_and_one_line(tmp_path, stdin):
    # issue 16: no input gave "Aborted." with exit 1, a closed stdin a traceback; docs/harness.md promises exit 3
    env = {**os.environ, "DUCKLAKE_HOME": str(tmp_path / "state"), "DUCKLAKE_PLATFORM": "local"}
    proc = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" "{ROOT / "ducklake_test.py"}" reset {stdin}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (
        "Error: reset cancelled; nothing was deleted. Try: pass --yes to reset without asking."
    ), proc.stderr


@pytest.mark.parametrize("command", ["up", "status"])
@pytest.mark.parametrize("where", ["under-a-file", "is-a-file"])
def test_an_unusable_state_folder_is_one_line_and_exit_3(cli, tmp_path, command, where):
    # issue 16: a state folder the kit cannot write ended in a 40-60 line traceback with exit 1 (as root, permission
    # bits do not stop a write, so the folder is made unusable by a file standing where it must be)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    home = blocker / "state" if where == "under-a-file" else blocker
    result = cli({"DUCKLAKE_HOME": str(home), "DUCKLAKE_PLATFORM": "local"}, command)
    assert result.exit_code == 3, result.output
    assert result.stderr.startswith(f"Error: cannot use the state folder {home} ("), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_k3d_platform_without_docker_or_k3d_says_what_is_missing(cli, tmp_path):
    # a PATH with neither docker nor k3d (kubectl is still found in this venv): one line naming both, exit 3
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = cli({"DUCKLAKE_HOME": str(tmp_path / "home"), "PATH": str(empty_bin)}, "--platform", "k3d", "up")
    assert result.exit_code == 3
    assert result.stderr.startswith(
        "Error: docker, k3d not found (--platform k3d needs docker, k3d, kubectl). Try: install Docker Engine"
    ), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_every_command_has_help_and_is_documented():
    harness = (ROOT / "docs" / "harness.md").read_text()
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        assert (cmd.callback.__doc__ or "").strip(), f"{name} has no help text"
        assert f"`{name}`" in harness, f"docs/harness.md does not document `{name}`"
