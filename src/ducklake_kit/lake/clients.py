"""How a person reaches the catalog and the lake by hand: psql, the DuckDB CLI, DBeaver.

Secrets go into 0600 files in the state folder (a pgpass file and the DuckDB init SQL), never on a command line.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.lake import setup_statements
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.state import State, write_private

CATALOG_QUERIES = [
    "SELECT snapshot_id, snapshot_time, schema_version FROM ducklake_snapshot ORDER BY snapshot_id;",
    "SELECT table_id, table_name, begin_snapshot, end_snapshot FROM ducklake_table;",
    "SELECT data_file_id, table_id, path, record_count, file_size_bytes FROM ducklake_data_file;",
]


def _psql() -> str:
    try:
        candidate = postgres.find_bin_dir() / "psql"
        if candidate.exists():
            return str(candidate)
    except KitError:
        pass
    return shutil.which("psql") or "psql"


def _duckdb_cli() -> str:
    here = Path(sys.prefix) / "bin" / "duckdb"
    return str(here) if here.exists() else (shutil.which("duckdb") or "duckdb")


def write_files(state: State, ep: Endpoints) -> dict[str, Path]:
    """(Re)write the pgpass file and the DuckDB init SQL, both 0600. Idempotent."""
    pg = ep.pg
    pgpass = state.home / "pgpass"
    write_private(pgpass, f"{pg.host}:{pg.port}:*:{pg.user}:{pg.password}\n")
    init_sql = state.home / "duckdb-init.sql"
    # `.output /dev/null` ... `.output`: the CLI would print a "Success" table for every CREATE SECRET and LOAD
    write_private(
        init_sql,
        "-- written by `connect`/`shell`: loads the extensions from the pinned wheels and attaches the lake\n"
        ".output /dev/null\n" + "\n".join(s + ";" for s in setup_statements(ep)) + "\n.output\n",
    )
    return {"pgpass": pgpass, "init_sql": init_sql}


def describe(state: State, ep: Endpoints) -> dict[str, Any]:
    files = write_files(state, ep)
    pg = ep.pg
    conninfo = f"host={pg.host} port={pg.port} user={pg.user} dbname={pg.dbname}"
    return {
        "psql": f"PGPASSFILE={shlex.quote(str(files['pgpass']))} {shlex.quote(_psql())} {shlex.quote(conninfo)}",
        "psql_queries": CATALOG_QUERIES,
        # for a playbook's catalog_connection: no password (the kit fills in its own, on its own server)
        "catalog_dsn": f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.dbname}",
        "duckdb_cli": f"{shlex.quote(_duckdb_cli())} -init {shlex.quote(str(files['init_sql']))}",
        "duckdb_init_sql": str(files["init_sql"]),
        "dbeaver": {
            "postgresql": {
                "host": pg.host,
                "port": pg.port,
                "database": pg.dbname,
                "user": pg.user,
                "password": f"from the pgpass file {files['pgpass']}",
            },
            "duckdb": {
                "path": ":memory:",
                "bootstrap_queries": f"the SQL statements in {files['init_sql']} (not the .output lines, which are DuckDB CLI commands)",
            },
        },
        "s3": {
            "endpoint": ep.s3.url,
            "key_id": ep.s3.key_id,
            "secret": "in the platform's credentials.json (.ducklake/ for local, .ducklake/k3d/ and .ducklake/podman/ for k3d "
            "and podman) or your external settings",
            "url_style": ep.s3.url_style,
            "region": ep.s3.region,
            "buckets": ["lake", "raw"],
        },
    }


def shell_argv(state: State, ep: Endpoints, extra: list[str]) -> list[str]:
    """The DuckDB CLI with the init SQL (extensions, secrets, ATTACH ... AS lake, USE lake), then the caller's arguments."""
    files = write_files(state, ep)
    return [_duckdb_cli(), "-init", str(files["init_sql"]), *extra]
