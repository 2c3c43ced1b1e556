"""Playbooks run on the real worker plane (two Dask worker processes) against the real lake, each NoETL defect as a
regression test, every answer checked against the lake read independently (a `Lake` of the test's own). The tables
live in the schema `steps_tests` of the kit's catalog (dropped at the end)."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import psycopg
import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.steps import runner
from ducklake_kit.steps.results import PlaybookRun
from ducklake_kit.workers import WorkerPlane, plane

S = "steps_tests"
ROOT = Path(__file__).resolve().parents[2]


class Books:
    def __init__(self, stack, folder: Path, plane_: WorkerPlane):
        self.stack, self.folder, self.plane = stack, folder, plane_
        self.ep = stack.platform.endpoints()

    def file(self, body: str, name: str = "p") -> Path:
        path = self.folder / f"{name}.yaml"
        path.write_text(textwrap.dedent(body))
        return path

    def task(self, sql: str, worker: str, alias: str = "lake"):
        """One step task (run_step) on a named worker, against the kit's catalog under `alias`."""
        from ducklake_kit.steps.task import StepOptions, Target, run_step

        target = Target(alias, None, self.ep.data_path)
        return self.plane.result(
            self.plane.submit_call(run_step, target, [sql], {}, StepOptions(with_info=False), worker=worker)
        )

    def run(self, body_or_path: str | Path, **overrides) -> PlaybookRun:
        path = body_or_path if isinstance(body_or_path, Path) else self.file(body_or_path)
        return runner.run(runner.load(path, overrides), self.plane, self.stack.home, overrides=overrides)


@pytest.fixture(scope="module")
def lake(stack):
    """One connection for the module's reads (each statement reads the newest snapshot): a Lake per test attached
    the lake again each time."""
    with Lake(stack.platform.endpoints()) as lk:
        yield lk


@pytest.fixture(scope="module")
def books(stack, lake, tmp_path_factory):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 2)
    assert [w.name for w in status.workers] == ["w1", "w2"], status
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}")
    with WorkerPlane(status.address, ep) as wp:
        yield Books(stack, tmp_path_factory.mktemp("steps"), wp)
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE")


def step(run: PlaybookRun, name: str):
    return next(s for s in run.steps if s.step == name)


def commands(run: PlaybookRun, name: str) -> list[dict]:
    return step(run, name).as_dict()["result"]["commands"]


def test_every_statement_that_returns_rows_reports_them_and_counts_are_real(books, lake):
    run = books.run(f"""\
        workflow:
          - step: make
            tool: ducklake
            commands:
              - CREATE OR REPLACE TABLE {S}.t (k INTEGER NOT NULL, v VARCHAR)
              - INSERT INTO {S}.t SELECT i, 'v' || i FROM range(5) r(i)
              - UPDATE {S}.t SET v = 'x' WHERE k >= 2
              - DELETE FROM {S}.t WHERE k = 0
          - step: read
            tool: ducklake
            commands:
              - WITH c AS (SELECT count(*) AS n FROM {S}.t) SELECT n FROM c
              - "-- a comment first\\nSELECT max(k) AS top FROM {S}.t"
              - SHOW ALL TABLES
              - DESCRIBE {S}.t
              - CALL ducklake_table_info('lake')
              - "SELECT 1 AS one; SELECT 2 AS two"
        """)
    assert run.ok, run.as_dict()
    made = commands(run, "make")
    assert [c.get("affected_rows") for c in made[1:]] == [5, 3, 1]
    assert (
        lake.scalar(f"SELECT count(*) FROM {S}.t") == 4
        and lake.scalar(f"SELECT count(*) FROM {S}.t WHERE v = 'x'") == 3
    )
    read = commands(run, "read")
    assert len(read) == 7  # the last command holds two statements, each reported
    assert read[0]["rows"] == [{"n": 4}] and read[1]["rows"] == [{"top": 4}]
    assert all(c["row_count"] > 0 for c in read), [(c["sql"], c.get("row_count")) for c in read]
    assert [c["columns"][0] for c in read[5:]] == ["one", "two"] and [c["statement"] for c in read[5:]] == [0, 1]
    # each write's snapshot is the lake's own record of it
    snapshots = [c["snapshot_id"] for c in made]
    assert all(snapshots) and snapshots == sorted(snapshots)
    changes = lake.con.execute(
        "SELECT snapshot_id, changes FROM ducklake_snapshots('lake') WHERE snapshot_id IN "
        f"({', '.join(map(str, snapshots))}) ORDER BY 1"
    ).fetchall()
    assert [r[0] for r in changes] == snapshots


def test_a_failing_command_fails_its_step_and_stops_what_follows(books, lake, cli, stack):
    body = f"""\
        workflow:
          - step: ok_first
            tool: ducklake
            command: CREATE OR REPLACE TABLE {S}.f (k INTEGER NOT NULL)
          - step: breaks
            tool: ducklake
            commands:
              - INSERT INTO {S}.f VALUES (1)
              - INSERT INTO {S}.f VALUES (NULL)
              - INSERT INTO {S}.f VALUES (3)
          - step: never
            tool: ducklake
            command: INSERT INTO {S}.f VALUES (4)
        """
    run = books.run(body)
    assert not run.ok
    broke = step(run, "breaks")
    assert broke.status == "error"
    err = broke.error
    assert err.command_index == 1 and "VALUES (NULL)" in err.sql and "NOT NULL" in err.message
    assert [c["status"] for c in commands(run, "breaks")] == ["executed", "error"]  # the third never ran
    assert step(run, "never").status == "skipped" and "breaks" in step(run, "never").reason
    assert sorted(r[0] for r in lake.con.execute(f"SELECT k FROM {S}.f").fetchall()) == [1]
    # the CLI: exit 1, and the JSON says which command failed
    result = cli(stack.env, "steps", "run", str(books.folder / "p.yaml"), "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "error" and doc["result"]["steps"][1]["error"]["command_index"] == 1


def test_on_error_continue_runs_the_later_commands_and_when_sees_the_status(books, lake):
    run = books.run(f"""\
        workflow:
          - step: start
            tool: ducklake
            on_error: continue
            commands:
              - CREATE OR REPLACE TABLE {S}.c (k INTEGER NOT NULL)
              - INSERT INTO {S}.c VALUES (NULL)
              - INSERT INTO {S}.c VALUES (2)
            next:
              - when: "{{{{ status == 'error' }}}}"
                then: [{{step: cleanup}}]
              - else: [{{step: celebrate}}]
          - step: cleanup
            tool: ducklake
            command: INSERT INTO {S}.c VALUES (99)
          - step: celebrate
            tool: ducklake
            command: INSERT INTO {S}.c VALUES (100)
        """)
    assert not run.ok  # a failed command fails the run even when routing handled it
    assert [c["status"] for c in commands(run, "start")] == ["executed", "error", "executed"]
    assert step(run, "cleanup").status == "ok" and step(run, "celebrate").status == "skipped"
    assert sorted(r[0] for r in lake.con.execute(f"SELECT k FROM {S}.c").fetchall()) == [2, 99]


def test_a_transaction_step_is_one_snapshot_or_nothing(books, lake):
    books.run(
        f"workflow:\n  - step: t\n    tool: ducklake\n    command: CREATE OR REPLACE TABLE {S}.x (k INTEGER NOT NULL)\n"
    )
    before = lake.current_snapshot()
    run = books.run(f"""\
        metadata: {{name: tx}}
        workflow:
          - step: both
            tool: ducklake
            transaction: true
            commands: ["INSERT INTO {S}.x VALUES (1)", "INSERT INTO {S}.x VALUES (2)"]
          - step: half
            tool: ducklake
            transaction: true
            commands: ["INSERT INTO {S}.x VALUES (3)", "INSERT INTO {S}.x VALUES (NULL)"]
        """)
    both = step(run, "both")
    assert both.status == "ok" and both.attempt.snapshot_id is not None
    message = lake.scalar(
        "SELECT commit_message FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [both.attempt.snapshot_id]
    )
    assert message == f"steps tx: step both (run {run.execution_id})"
    assert step(run, "half").status == "error" and "rolled back" in step(run, "half").error.message
    assert sorted(r[0] for r in lake.con.execute(f"SELECT k FROM {S}.x").fetchall()) == [1, 2]
    assert (
        lake.current_snapshot() == before + 1
        or lake.scalar(  # other writers may commit meanwhile: count ours
            "SELECT count(*) FROM ducklake_snapshots('lake') WHERE snapshot_id > ? AND commit_message LIKE 'steps tx:%'",
            [before],
        )
        == 1
    )


def test_async_iterations_overlap_on_different_workers_and_sequential_ones_do_not(books, lake):
    busy = "SELECT sum(length(md5(i::VARCHAR))) AS busy FROM range(1500000) t(i)"
    body = f"""\
        workload: {{ids: [1, 2, 3, 4]}}
        workflow:
          - step: make
            tool: ducklake
            command: CREATE OR REPLACE TABLE {S}.l (id INTEGER NOT NULL, worker VARCHAR)
          - step: each
            tool: ducklake
            loop: {{collection: "{{{{ ids }}}}", element: id, mode: MODE}}
            params: {{id: "{{{{ id }}}}"}}
            commands:
              - {busy}
              - INSERT INTO {S}.l VALUES ($id, getvariable('worker_name'))
        """
    run = books.run(body.replace("MODE", "async"))
    its = step(run, "each").iterations
    assert run.ok and [it.index for it in its] == [0, 1, 2, 3]
    assert {it.worker for it in its} == {"w1", "w2"}
    spans = sorted((it.started_at, it.finished_at) for it in its)
    assert any(b[0] < a[1] for a, b in itertools.pairwise(spans)), spans  # some iteration started before another ended
    assert sorted(lake.con.execute(f"SELECT id FROM {S}.l").fetchall()) == [(1,), (2,), (3,), (4,)]
    assert {r[0] for r in lake.con.execute(f"SELECT worker FROM {S}.l").fetchall()} == {"w1", "w2"}

    run = books.run(body.replace("MODE", "sequential"))
    spans = [(it.started_at, it.finished_at) for it in step(run, "each").iterations]
    assert run.ok and all(b[0] >= a[1] for a, b in itertools.pairwise(spans)), spans


def test_catalog_info_is_the_catalogs_real_state(books, lake):
    run = books.run(f"""\
        workflow:
          - step: s
            tool: ducklake
            catalog_name: info_alias
            commands: ["CREATE OR REPLACE TABLE {S}.i (k INTEGER)", "INSERT INTO {S}.i VALUES (1)"]
            vars:
              snapshots: "{{{{ catalog_info.snapshot_count }}}}"
        """)
    info = step(run, "s").catalog_info
    latest = info["latest_snapshot"]
    assert info["catalog_name"] == "info_alias"
    row = lake.con.execute("SELECT * FROM ducklake_snapshots('lake') WHERE snapshot_id = ?", [latest["snapshot_id"]])
    columns = [d[0] for d in row.description]
    assert list(latest) == columns and dict(zip(columns, row.fetchone())) == latest
    assert info["snapshot_count"] == lake.scalar(
        "SELECT count(*) FROM ducklake_snapshots('lake') WHERE snapshot_id <= ?", [latest["snapshot_id"]]
    )
    assert info["snapshot_count"] > 5  # the seed capped it at 5
    assert f"{S}.i" in info["tables"] and info["table_count"] == len(info["tables"])
    assert step(run, "s").vars["snapshots"] == info["snapshot_count"]


def test_v1_and_v2_fixtures_give_the_same_results(books, lake):
    results = []
    for shape in ("v1", "v2"):
        run = books.run(ROOT / f"steps/ducklake_test_{shape}.yaml")
        assert run.ok, run.as_dict()
        rows = {
            s.step: [
                (c["sql"], c.get("rows") if "ducklake_" not in c["sql"] else None, c.get("affected_rows"))
                for c in s.as_dict()["result"].get("commands", [])
            ]
            for s in run.steps
        }
        loop = step(run, "loop_insert_events").iterations
        results.append((rows, {k: v for k, v in run.vars.items() if k != "snapshot_count"}, len(loop)))
        assert lake.scalar("SELECT count(*) FROM lake.main.user_events") == 5
    assert results[0] == results[1]
    tables_now = lake.scalar("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake'")
    assert results[0][1] == {"user_count": 2, "event_count": 5, "table_count": tables_now}
    lake.run("DROP TABLE lake.main.users; DROP TABLE lake.main.user_events")


def test_primary_key_is_refused_before_anything_runs(books, lake):
    run = books.run(f"""\
        workflow:
          - step: users
            tool: ducklake
            commands:
              - CREATE TABLE {S}.pk_users (id INTEGER PRIMARY KEY, name VARCHAR)
        """)
    err = step(run, "users").error
    assert not run.ok and "only NOT NULL" in err.message and "pk_users" in err.message
    assert (
        lake.scalar(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name = '{S}' AND table_name = 'pk_users'") == 0
    )


def test_seed_time_travel_reads_what_the_lake_had(books, lake):
    run = books.run(ROOT / "steps/time_travel.yaml")
    assert run.ok, run.as_dict()
    first = run.vars["first_snapshot"]
    counts = [c["rows"][0] for c in commands(run, "query_historical_data")]
    expected_then = lake.scalar(f"SELECT count(*) FROM lake.main.tt_sales AT (VERSION => {int(first)})")
    assert expected_then == 3
    assert counts == [{"current_count": 4}, {"snapshot_count": 3}, {"timestamp_count": 3}, {"version_count": 3}]
    assert sum("rewrote `FOR SYSTEM_TIME AS OF" in w for w in run.warnings) == 2
    lake.run("DROP TABLE lake.main.tt_sales")


def test_an_undefined_value_at_run_time_fails_the_step_naming_it(books):
    run = books.run("""\
        workflow:
          - step: q
            tool: ducklake
            command: SELECT 1 AS one
            vars:
              missing: "{{ result.commands[0].rows[0].nope }}"
        """)
    assert step(run, "q").status == "error" and "nope" in step(run, "q").error.message


def test_another_catalog_by_dsn_is_attached_once_per_worker_and_its_password_never_printed(books, stack, cli):
    pg = books.ep.pg
    with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
        con.execute("DROP DATABASE IF EXISTS steps_other")
        con.execute("CREATE DATABASE steps_other")
    dsn = f"postgresql://{pg.user}:{pg.password}@{pg.host}:{pg.port}/steps_other"
    body = """\
        workload: {ids: [1, 2, 3, 4]}
        workflow:
          - step: make
            tool: ducklake
            catalog_connection: "{{ dsn }}"
            catalog_name: other
            data_path: s3://raw/steps-other/
            command: CREATE OR REPLACE TABLE things (id INTEGER NOT NULL)
          - step: fill
            tool: ducklake
            catalog_connection: "{{ dsn }}"
            catalog_name: other
            data_path: s3://raw/steps-other/
            loop: {collection: "{{ ids }}", element: id, mode: async}
            params: {id: "{{ id }}"}
            command: INSERT INTO things VALUES ($id)
          - step: count
            tool: ducklake
            catalog_connection: "{{ dsn }}"
            catalog_name: other
            data_path: s3://raw/steps-other/
            memory_limit: 1GB
            command: SELECT count(*) AS n, current_setting('memory_limit') AS mem FROM things
        """
    path = books.file(body, "other")
    result = cli(stack.env, "steps", "run", str(path), "--set", f"dsn={dsn}", "--json")
    assert result.exit_code == 0, result.output
    assert pg.password not in result.output
    doc = json.loads(result.stdout)
    count = doc["result"]["steps"][2]
    assert count["result"]["commands"][0]["rows"][0]["n"] == 4 and count["catalog_info"]["catalog_name"] == "other"
    assert count["result"]["commands"][0]["rows"][0]["mem"].startswith("95")  # 1GB = 953.6 MiB, for this step only
    # independently: the other catalog's own tables in PostgreSQL hold the table, and the kit's lake does not
    with psycopg.connect(pg.libpq("steps_other"), autocommit=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM ducklake_table WHERE end_snapshot IS NULL")]
    assert names == ["things"]
    for name in books.plane.names():  # the worker's own memory limit is back after the step
        assert "95" not in books.plane.run("SELECT current_setting('memory_limit')", worker=name).rows[0][0]
    # a bad DSN is one line with the step's name and no password
    bad = books.file(body.replace("{{ dsn }}", "postgresql://someone:s3cret@127.0.0.1:1/nowhere"), "bad")
    result = cli(stack.env, "steps", "run", str(bad))
    assert result.exit_code == 1 and "s3cret" not in result.output and "step make" in result.output.replace("'", "")


def test_what_a_worker_remembers_between_steps_never_outlives_another_task(books, lake):
    """A step skips the `USE` and the snapshot lookup it already knows the answer to; a task of another kind in between
    (which may USE anything and commit) makes it ask again: a SELECT after it is credited with no snapshot, and an
    unqualified name still means the step's catalog."""

    def step_on_w1(sql: str):
        return books.task(sql, "w1")

    step_on_w1(f"CREATE OR REPLACE TABLE {S}.m (k INTEGER)")
    first = step_on_w1(f"INSERT INTO {S}.m VALUES (1)")
    assert first.statements[0].snapshot_id is not None
    other = books.plane.run([f"INSERT INTO {S}.m VALUES (2)", "USE local"], worker="w1")  # commits, then moves USE
    assert other.ok and other.snapshot_id > first.statements[0].snapshot_id
    after = step_on_w1(f"SELECT count(*) AS n FROM {S}.m")
    assert after.statements[0].rows == [(2,)] and after.statements[0].snapshot_id is None
    books.plane.run("USE local", worker="w1")
    created = step_on_w1("CREATE OR REPLACE TABLE steps_default_db (k INTEGER)")
    assert not created.failed, created.error or created.statements
    assert (
        lake.scalar(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND table_name = 'steps_default_db'"
        )
        == 1
    )
    lake.run("DROP TABLE steps_default_db")


def test_steps_on_a_worker_share_its_one_pooled_connection(books):
    """NoETL opened a new connection per task (extensions installed twice, a DETACH that always failed): here a value
    a step leaves on its worker's connection is there for the next step on that worker, and its catalog is attached
    once (the worker's attachment count does not grow)."""

    def on_w2(sql: str):
        return books.task(sql, "w2", "pool_alias")

    first = on_w2("SET VARIABLE steps_probe = 42")
    attached = books.plane.run("SELECT count(*) FROM duckdb_databases()", worker="w2").rows[0][0]
    second = on_w2("SELECT getvariable('steps_probe') AS probe, current_database() AS db")
    assert not first.failed and second.statements[0].rows == [(42, "pool_alias")]
    assert books.plane.run("SELECT count(*) FROM duckdb_databases()", worker="w2").rows[0][0] == attached


def test_an_alias_moves_to_another_catalog_on_a_worker(books):
    """The same catalog_name aimed at another catalog on the same worker: the old one is detached (never while it is
    the default database, which DuckDB refuses), and snapshot ids are the new catalog's own."""
    import dataclasses

    from ducklake_kit.steps.task import StepOptions, Target, run_step

    pg = books.ep.pg
    with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
        if not con.execute("SELECT 1 FROM pg_database WHERE datname = 'steps_switch'").fetchone():
            con.execute("CREATE DATABASE steps_switch")
    kit = Target("switch", None, books.ep.data_path)
    other = Target("switch", dataclasses.replace(pg, dbname="steps_switch"), "s3://raw/steps-switch/")

    def on_w1(target, sql):
        return books.plane.result(
            books.plane.submit_call(run_step, target, [sql], {}, StepOptions(with_info=False), worker="w1")
        )

    first = on_w1(kit, f"CREATE OR REPLACE TABLE {S}.sw (i INTEGER); INSERT INTO {S}.sw VALUES (1)")
    moved = on_w1(other, "CREATE OR REPLACE TABLE sw_other (i INTEGER); INSERT INTO sw_other VALUES (7), (8)")
    assert not first.failed and not moved.failed, (first.error, moved.error, [s.error for s in moved.statements])
    with psycopg.connect(pg.libpq("steps_switch")) as con:
        latest = con.execute("SELECT max(snapshot_id) FROM ducklake_snapshot").fetchone()[0]
    assert moved.statements[1].snapshot_id == latest  # the other catalog's own snapshot
    assert on_w1(other, "SELECT count(*) FROM sw_other").statements[0].rows == [(2,)]
    assert on_w1(kit, f"SELECT count(*) FROM {S}.sw").statements[0].rows == [(1,)]  # and back again


def test_a_value_that_breaks_out_of_its_literal_is_refused_and_numbers_still_paste(books, lake):
    """NoETL pasted values into the SQL: `--set "who=x' AS x; DROP TABLE victim; SELECT 'y"` ran the DROP. Here it is
    refused before a worker sees it; a value that stays inside its literal, and NoETL's `{{ user_id }}`, still run."""
    lake.run(f"CREATE OR REPLACE TABLE {S}.victim (i INTEGER)")
    greet = """\
        workload:
          who: nobody
        workflow:
          - step: greet
            tool: ducklake
            command: "SELECT '{{ who }}' AS x"
        """
    evil = books.run(greet, who=f"x' AS x; DROP TABLE {S}.victim; SELECT 'y")
    assert not evil.ok and step(evil, "greet").attempt is None  # nothing was sent to a worker
    assert "breaks out of its quoted literal, so it was not run" in step(evil, "greet").error.line()
    assert lake.scalar(f"SELECT count(*) FROM duckdb_tables() WHERE schema_name = '{S}' AND table_name = 'victim'") == 1
    fine = books.run(greet, who="it is; fine -- really")
    assert fine.ok and commands(fine, "greet")[0]["rows"] == [{"x": "it is; fine -- really"}]
    assert any("{{ who | sql }}" in w for w in fine.warnings)
    noetl = books.run(f"""\
        workload:
          user_ids: [1, 2, 3]
        workflow:
          - step: fill
            tool: ducklake
            loop: {{collection: "{{{{ user_ids }}}}", element: user_id, mode: async}}
            command: "INSERT INTO {S}.victim VALUES ({{{{ user_id }}}})"
        """)
    assert noetl.ok, noetl.as_dict()
    assert lake.scalar(f"SELECT sum(i) FROM {S}.victim") == 6
    huge = books.run(greet.replace("{{ who }}", "{{ 'a' * 100000000 }}"))
    assert not huge.ok and "more than 16 MiB" in step(huge, "greet").error.line()


def test_a_rendered_command_that_would_change_the_workers_connection_is_refused(books):
    """A template can hide an ATTACH from `steps validate`: the rendered command is checked again before it is sent,
    and no worker ever sees it (every worker still has only its own databases)."""

    def databases() -> dict[str, list[str]]:
        return {
            w: [r[0] for r in books.plane.run("SELECT database_name FROM duckdb_databases() ORDER BY 1", worker=w).rows]
            for w in ("w1", "w2")
        }

    before = databases()
    run = books.run("""\
        workflow:
          - step: sneaky
            tool: ducklake
            command: "{% if true %}ATTACH ':memory:' AS evil{% endif %}"
        """)
    sneaky = step(run, "sneaky")
    assert sneaky.status == "error" and sneaky.attempt is None
    assert "ATTACH is refused in a step" in sneaky.error.line()
    assert databases() == before
    declared = books.run("""\
        workflow:
          - step: declared
            tool: ducklake
            catalog_name: hygiene_alias
            command: "{% if true %}USE hygiene_alias{% endif %}; SELECT current_database() AS db"
        """)
    assert declared.ok and commands(declared, "declared")[-1]["rows"] == [{"db": "hygiene_alias"}], declared.as_dict()
