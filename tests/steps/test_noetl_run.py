"""NoETL's own `ducklake_test` playbook (github:noetl/e2e, unmodified: tests/steps/noetl/) run by `steps run` on the
real worker plane, against a DuckLake catalog in a fresh PostgreSQL database, as a NoETL user would run it: the
credentials file names `noetl_connection` (the kit's PostgreSQL), `--set` gives the catalog connection (no password:
on the kit's own server the kit fills it in; the database is created as DuckLake's CREATE_IF_NOT_EXISTS would) and a
data path, `--drop-constraints` removes the users table's PRIMARY KEY.

The playbook's own postgres steps look for a database named `ducklake_catalog` and create it when missing: on the
kit's server that is the kit's own catalog database, so they find it and skip the CREATE DATABASE; the catalog the
ducklake steps use is the one `catalog_connection` names.

What the lake holds afterwards is read independently (a DuckDB connection of the test's own attaching that catalog),
and compared with what the playbook says it does: two users, one event per user id, every one of the parallel loop's
five iterations committed once."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import duckdb
import psycopg
import pytest

from ducklake_kit.lake.connection import load_statements
from ducklake_kit.workers import plane

NOETL = Path(__file__).resolve().parent / "noetl"
DUCKLAKE_TEST = NOETL / "e2e_ducklake_test.yaml"
PREFIX = "noetl_lake_"  # each run's catalog database: noetl_lake_0, noetl_lake_1, ...


@pytest.fixture(scope="module")
def noetl_stack(stack):
    """The stack with its worker plane up (two workers) and `noetl_connection` in its credentials file (the kit's
    PostgreSQL, database postgres), put back as it was afterwards, with the runs' catalog databases dropped."""
    ep = stack.platform.endpoints()
    assert len(plane.up(stack.state, ep, 2).workers) == 2
    pg = ep.pg
    path = stack.home / "steps-credentials.json"
    before = path.read_text() if path.exists() else None
    entries = json.loads(before) if before else {}
    entries["noetl_connection"] = {"connection": f"postgresql://{pg.user}@{pg.host}:{pg.port}/postgres"}
    path.write_text(json.dumps(entries))
    path.chmod(0o600)
    try:
        yield stack, pg
    finally:
        _drop_catalogs(pg)
        if before is None:
            path.unlink()
        else:
            path.write_text(before)


def _drop_catalogs(pg) -> None:
    with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
        names = [r[0] for r in con.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (PREFIX + "%",))]
        for name in names:
            con.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _databases(pg) -> set[str]:
    with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
        return {r[0] for r in con.execute("SELECT datname FROM pg_database")}


def _run(cli, stack, pg, catalog: str, data_path: Path, *extra: str):
    return cli(
        stack.env,
        "steps",
        "run",
        str(DUCKLAKE_TEST),
        "--set",
        f"catalog_connection=postgresql://{pg.user}@{pg.host}:{pg.port}/{catalog}",
        "--set",
        f"data_path={data_path}",
        *extra,
        "--json",
    )


def _lake(pg, catalog: str, data_path: Path):
    """The catalog the playbook made, read by a DuckDB connection of the test's own."""
    con = duckdb.connect()
    for statement in load_statements():
        con.execute(statement)
    con.execute(f"ATTACH 'ducklake:postgres:{pg.libpq(catalog)}' AS checked (DATA_PATH '{data_path}', READ_ONLY)")
    return con


@pytest.fixture
def shared_folder():
    """A local data path the workers can write: they run as the kit's unprivileged user when the tests run as root
    (pytest's tmp_path is the test user's own)."""
    folder = Path(tempfile.mkdtemp(prefix="noetl-data-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_noetls_ducklake_test_runs_as_written_on_fresh_catalogs(cli, noetl_stack, shared_folder):
    stack, pg = noetl_stack
    for n in range(3):  # three fresh catalogs: the parallel CREATE TABLE IF NOT EXISTS raced on each before
        catalog, data_path = f"{PREFIX}{n}", shared_folder / f"data{n}"
        assert catalog not in _databases(pg)
        result = _run(cli, stack, pg, catalog, data_path, "--drop-constraints")
        out = json.loads(result.stdout)
        assert "steps" in out["result"], (out, result.stderr)
        failed = [(s["step"], s["error"]) for s in out["result"]["steps"] if s["status"] == "error"]
        assert result.exit_code == 0, (failed, result.stderr)
        steps = {s["step"]: s for s in out["result"]["steps"]}
        assert steps["create_catalog_db"]["status"] == "ok"
        assert steps["create_db_sql"]["status"] == "skipped"  # ducklake_catalog exists: the kit's own
        assert catalog in _databases(pg)  # made by the kit for the first ducklake step
        loop = steps["loop_insert_events"]["result"]
        assert (loop["iteration_count"], loop["failed"]) == (5, 0)
        warnings = out["result"]["warnings"]
        assert any("PRIMARY KEY (id) removed" in w for w in warnings)
        assert any("is a local folder: workers on other machines will not see it" in w for w in warnings)
        assert out["result"]["ctx"]["user_count"] == 2
        assert int(out["result"]["ctx"]["event_count"]) == 5
        with _lake(pg, catalog, data_path) as con:
            users = con.execute("SELECT id, name FROM checked.users ORDER BY id").fetchall()
            events = con.execute("SELECT user_id, event_type FROM checked.user_events ORDER BY user_id").fetchall()
        assert users == [(1, "Alice"), (2, "Bob")]
        assert events == [(i, "test_event") for i in range(1, 6)]  # one per iteration: none lost, none twice


def test_without_drop_constraints_the_primary_key_is_refused_with_the_fix(cli, noetl_stack, tmp_path):
    stack, pg = noetl_stack
    result = _run(cli, stack, pg, f"{PREFIX}refused", tmp_path / "data")
    assert result.exit_code == 1
    steps = {s["step"]: s for s in json.loads(result.stdout)["result"]["steps"]}
    error = steps["create_users_table"]["error"]["message"]
    assert "PRIMARY KEY" in error and "--drop-constraints" in error
    assert steps["insert_initial_users"]["status"] == "skipped"


def test_a_catalog_connection_to_the_kits_own_catalog_with_another_data_path_is_refused(cli, noetl_stack, tmp_path):
    """NoETL's playbooks name `ducklake_catalog`, the kit's own catalog database: attached under another alias with
    another data path, its tables' files would be written where the kit's lake is not. Refused in one line."""
    stack, pg = noetl_stack
    result = _run(cli, stack, pg, "ducklake_catalog", tmp_path / "elsewhere", "--drop-constraints")
    assert result.exit_code == 1
    steps = {s["step"]: s for s in json.loads(result.stdout)["result"]["steps"]}
    error = steps["create_users_table"]["error"]["message"]
    assert "the kit's own catalog database (ducklake_catalog)" in error and str(tmp_path / "elsewhere") in error
    assert pg.password not in result.output
