"""The one way into the lake: DuckDB with the ducklake, httpfs and postgres extensions loaded offline,
an S3 secret, a PostgreSQL secret, and the DuckLake catalog ATTACHed as `lake`.

The same statements (`setup_statements`) also make the DuckDB CLI's init file, so what a learner runs by
hand is exactly what the kit runs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from .errors import KitError
from .platforms.base import Endpoints

LAKE = "lake"  # the ATTACH alias: tables are lake.main.<table>
EXTENSIONS = {  # DuckDB extension name -> the Python package of its pinned wheel
    "ducklake": "duckdb_extension_ducklake",
    "httpfs": "duckdb_extension_httpfs",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
}
# Many writers commit to one catalog; a commit that loses a race is retried after a short, growing wait.
RETRY_SETTINGS = {"ducklake_max_retry_count": 30, "ducklake_retry_wait_ms": 20, "ducklake_retry_backoff": 1.3}


def extension_path(name: str) -> Path | None:
    """The extension file shipped by its wheel for exactly this DuckDB version, or None."""
    spec = importlib.util.find_spec(EXTENSIONS[name])
    if not spec or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    return path if path.exists() else None


def _sql_str(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def load_statements() -> list[str]:
    """LOAD each extension from its wheel; INSTALL from the internet only when a wheel is absent."""
    out = []
    for name in EXTENSIONS:
        path = extension_path(name)
        out.append(f"LOAD {_sql_str(str(path))}" if path else f"INSTALL {name}; LOAD {name}")
    return out


def secret_statements(ep: Endpoints) -> list[str]:
    s3, pg = ep.s3, ep.pg
    return [
        "CREATE OR REPLACE SECRET lake_s3 (TYPE s3, "
        f"KEY_ID {_sql_str(s3.key_id)}, SECRET {_sql_str(s3.secret)}, ENDPOINT {_sql_str(s3.endpoint)}, "
        f"URL_STYLE {_sql_str(s3.url_style)}, USE_SSL {'true' if s3.use_ssl else 'false'}, REGION {_sql_str(s3.region)})",
        # named in ATTACH's METADATA_PARAMETERS, so the ATTACH path carries no password
        "CREATE OR REPLACE SECRET lake_catalog (TYPE postgres, "
        f"HOST {_sql_str(pg.host)}, PORT {pg.port}, DATABASE {_sql_str(pg.dbname)}, "
        f"USER {_sql_str(pg.user)}, PASSWORD {_sql_str(pg.password)})",
    ]


def attach_statement(ep: Endpoints, alias: str = LAKE) -> str:
    return (
        f"ATTACH {_sql_str('ducklake:postgres:dbname=' + ep.pg.dbname)} AS {alias} "
        f"(DATA_PATH {_sql_str(ep.data_path)}, METADATA_PARAMETERS MAP {{'SECRET': 'lake_catalog'}})"
    )


def setup_statements(ep: Endpoints, alias: str = LAKE) -> list[str]:
    retry = [f"SET {k} = {v}" for k, v in RETRY_SETTINGS.items()]
    return [*load_statements(), *secret_statements(ep), *retry, attach_statement(ep, alias), f"USE {alias}"]


@dataclass
class StatementResult:
    statement_type: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    affected_rows: int | None = None  # real counts for INSERT/UPDATE/DELETE, None where it has no meaning

    def as_dict(self) -> dict[str, Any]:
        return {
            "statement_type": self.statement_type,
            "columns": self.columns,
            "rows": [list(r) for r in self.rows],
            "row_count": len(self.rows),
            "affected_rows": self.affected_rows,
        }


_DML = {"INSERT", "UPDATE", "DELETE", "MERGE_INTO"}


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


class Lake:
    """One DuckDB connection with the lake attached, reused for every statement (`cursor()` per thread)."""

    def __init__(self, endpoints: Endpoints, *, alias: str = LAKE):
        self.endpoints = endpoints
        self.alias = alias
        # no automatic downloads: extensions come from the pinned wheels
        self.con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
        for stmt in setup_statements(endpoints, alias):
            try:
                self.con.execute(stmt)
            except duckdb.Error as exc:
                self.con.close()
                raise self._explain_setup(stmt, exc) from None

    def _explain_setup(self, stmt: str, exc: duckdb.Error) -> KitError:
        msg = _first_line(exc)
        if stmt.startswith(("LOAD", "INSTALL")):
            return KitError(
                f"could not load a DuckDB extension ({msg})",
                f"run `uv sync`: the wheels duckdb-extension-*=={duckdb.__version__} must match duckdb {duckdb.__version__}",
            )
        if "password authentication failed" in str(exc):
            return KitError(f"PostgreSQL at {self.endpoints.pg.host}:{self.endpoints.pg.port} refused the password for user '{self.endpoints.pg.user}'", "check the catalog credentials")
        if stmt.startswith("ATTACH"):
            return KitError(f"could not attach the lake ({msg})", "run `up`, then `status` to see what is down")
        return KitError(f"lake setup failed at `{stmt.split('(')[0].strip()}` ({msg})", "run `status`")

    def __enter__(self) -> "Lake":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor on the same database instance, for use from another thread."""
        cur = self.con.cursor()
        cur.execute(f"USE {self.alias}")
        return cur

    def run(self, sql: str) -> list[StatementResult]:
        """Run one or more statements; rows for every statement that returns rows, real affected counts for DML."""
        try:
            statements = self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise KitError(f"SQL does not parse: {_first_line(exc)}", "check the statement's syntax") from None
        if not statements:
            raise KitError("no SQL statement given", 'pass one, e.g. `sql "SHOW TABLES"`')
        results = []
        for stmt in statements:
            kind = stmt.type.name
            try:
                rel = self.con.execute(stmt)
                columns = [d[0] for d in rel.description] if rel.description else []
                rows = rel.fetchall() if rel.description else []
            except duckdb.Error as exc:
                raise KitError(f"SQL failed: {_first_line(exc)}", "fix the statement; `sql \"SHOW ALL TABLES\"` lists the tables") from None
            if kind in _DML and columns == ["Count"] and len(rows) == 1:
                results.append(StatementResult(kind, [], [], int(rows[0][0])))
            else:
                results.append(StatementResult(kind, columns, rows, None))
        return results

    def scalar(self, sql: str, params: list | None = None) -> Any:
        row = self.con.execute(sql, params or []).fetchone()
        return row[0] if row else None

    def current_snapshot(self) -> int:
        return int(self.scalar(f"SELECT max(snapshot_id) FROM ducklake_snapshots({_sql_str(self.alias)})"))

    def catalog_info(self, platform: str) -> dict[str, Any]:
        pg, s3 = self.endpoints.pg, self.endpoints.s3
        return {
            "platform": platform,
            "catalog": f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.dbname}",
            "data_path": self.endpoints.data_path,
            "s3_endpoint": s3.url,
            "snapshot_id": self.current_snapshot(),
            "duckdb_version": duckdb.__version__,
        }
