"""The one way into the lake: DuckDB with the ducklake, httpfs and postgres extensions loaded offline,
an S3 secret, a PostgreSQL secret, and the DuckLake catalog ATTACHed as `lake`.

The same statements (`setup_statements`) also make the DuckDB CLI's init file, so what a learner runs by
hand is exactly what the kit runs.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import random
import sys
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake.gate import ADVISORY, CommitGate, gate_mode
from ducklake_kit.lake.sql import quote_ident
from ducklake_kit.lake.sql import quote_literal as _sql_str
from ducklake_kit.platforms.base import Endpoints

LAKE = "lake"  # the ATTACH alias: tables are lake.main.<table>
EXTENSIONS = {  # DuckDB extension name -> the Python package of its pinned wheel
    "ducklake": "duckdb_extension_ducklake",
    "httpfs": "duckdb_extension_httpfs",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
}
# Many writers commit to one catalog; a commit that loses the race for the next snapshot id is retried by DuckLake
# after waiting retry_wait_ms x U(0.5, 1.0) x backoff^attempt (DuckLake jitters the wait itself; it has no cap).
# A retry runs a conflict check that reads ducklake_snapshot and ducklake_snapshot_changes whole (DuckLake 1.5.5
# with a PostgreSQL catalog): it takes ~3x as long as a fresh insert from snapshot read to write, so under
# sustained contention a retrying writer keeps losing to fresh inserts until the others pause (PostgreSQL log:
# 60 failed attempts in a row over 2.8 s, with constant 5-10 ms waits), and every attempt costs CPU that grows
# with the catalog. Frequent retries therefore make a storm (16 writers x 1,000, measured: flat 10-20 ms waits,
# 8 commits/s at 8 rollbacks per commit; 8 DuckLake retries then re-runs capped at 1 s, 19 commits/s; these
# settings, 65 commits/s and 0.15 rollbacks per commit). Growing, uncapped waits keep the losers out of the way,
# at the price of a long tail; a commit that still gives up is re-run by `execute_retrying`. The kit's own writers
# now queue at the commit gate instead (lake/gate.py, the default: the 16 x 1,000 tail came from this race), so these
# settings matter for optimistic commits: DUCKLAKE_COMMIT_GATE=optimistic, loads, maintain, writers outside the kit.
RETRY_SETTINGS = {"ducklake_max_retry_count": 30, "ducklake_retry_wait_ms": 20, "ducklake_retry_backoff": 1.3}
DUCKLAKE_GAVE_UP = "Exceeded the maximum retry count"  # DuckLake's error once its own retries of a commit ran out
# For a process that commits many small transactions (one-row INSERTs from an application or a stream): one
# DuckDB thread. A DuckLake commit runs ~6 small catalog queries through DuckDB's own executor; with a second
# thread the client thread spins waiting for it (pthread mutex lock/unlock at the top of `perf`), doubling the
# CPU an insert costs (13 -> 6 ms measured), which on a busy machine is the latency. Not for analytical queries.
SMALL_WRITER_SETTINGS: dict[str, Any] = {"threads": 1}


def extension_path(name: str) -> Path | None:
    """The extension file shipped by its wheel for exactly this DuckDB version, or None."""
    spec = importlib.util.find_spec(EXTENSIONS[name])
    if not spec or not spec.submodule_search_locations:
        return None
    path = (
        Path(next(iter(spec.submodule_search_locations)))
        / "extensions"
        / f"v{duckdb.__version__}"
        / f"{name}.duckdb_extension"
    )
    return path if path.exists() else None


# DuckDB checks an extension's signature at every LOAD into a new database by hashing the whole file: the kit's three
# are 100 MB, 0.15 s of CPU for every Lake (so for every CLI command), the same files each time. The kit runs that
# check once per file version: DuckDB's own LOAD, signatures enforced, in a scratch database; then it remembers each
# file by what changes when it is written or replaced (device, inode, size, mtime and ctime, which cannot be set
# back) in a record in the virtual environment, beside the files, and opens connections with
# allow_unsigned_extensions only while all three still match it. A file that changed is checked again; one that fails
# is loaded with the check on, and DuckDB refuses it with its own error. Whoever can write the record can write the
# extension files and DuckDB's own library too: the record adds no way in. Right after the kit's own LOADs the
# connection turns the setting off (`load_statements`' last), which DuckDB then refuses to turn on again while the
# database runs: a statement from a playbook, a pipeline or the console that LOADs (or INSTALLs) another file is
# checked as in any DuckDB (docs/guarantees.md, Security).
VERIFIED_RECORD = Path(sys.prefix) / "ducklake-kit-extensions-verified.json"
_verified_now: set[str] = set()  # the records this process checked or read


def _extension_stamps(names: tuple[str, ...]) -> dict[str, list[int]] | None:
    """What identifies these extension files now, by path; None when one is not a wheel's file."""
    stamps = {}
    for name in names:
        path = extension_path(name)
        if path is None:
            return None
        st = path.stat()
        stamps[str(path)] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return stamps


def extensions_verified(names: tuple[str, ...] = tuple(EXTENSIONS), record_file: Path | None = None) -> bool:
    """Whether these extension files, as they are now, passed DuckDB's signature check (checked now when unknown)."""
    stamps = _extension_stamps(names)
    if stamps is None:
        return False
    now = {json.dumps([duckdb.__version__, path, stamp]) for path, stamp in stamps.items()}
    if now <= _verified_now:
        return True
    record_file = record_file or VERIFIED_RECORD
    try:
        known = json.loads(record_file.read_text())
        files = known["files"] if known["duckdb"] == duckdb.__version__ else {}
    except (OSError, ValueError, KeyError, TypeError):
        files = {}
    if all(files.get(path) == stamp for path, stamp in stamps.items()):
        _verified_now.update(now)
        return True
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    try:
        for stmt in load_statements(names):
            con.execute(stmt)  # the signature is checked: allow_unsigned_extensions is off here
    except duckdb.Error:
        return False
    finally:
        con.close()
    _verified_now.update(now)
    _write_record(record_file, json.dumps({"duckdb": duckdb.__version__, "files": {**files, **stamps}}, indent=1))
    return True


def _write_record(record_file: Path, text: str) -> None:
    tmp = record_file.with_name(f".{record_file.name}.{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(record_file)  # whole or not at all, also with another process writing it
    except OSError:
        tmp.unlink(missing_ok=True)  # not ours to write (the worker plane's user): this process remembers it


def connect_config(names: tuple[str, ...] = tuple(EXTENSIONS), **config: Any) -> dict[str, Any]:
    """DuckDB's config for a connection that loads these extensions from their wheels: no downloads, and no
    second signature check of files that passed it (`extensions_verified`)."""
    base: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    if extensions_verified(names):
        base["allow_unsigned_extensions"] = True
    return {**base, **config}


UNSIGNED_OFF = "SET allow_unsigned_extensions = false"  # for good: DuckDB refuses to set it on while running


def load_statements(names: tuple[str, ...] = tuple(EXTENSIONS)) -> list[str]:
    """LOAD each extension (all by default) from its wheel; INSTALL from the internet only when a wheel is absent;
    then UNSIGNED_OFF, so a connection opened with `allow_unsigned_extensions` (`connect_config`) loads no other
    unsigned file."""
    out = []
    for name in names:
        path = extension_path(name)
        out.append(f"LOAD {_sql_str(str(path))}" if path else f"INSTALL {name}; LOAD {name}")
    return [*out, UNSIGNED_OFF]


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


def _setting_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, (int, float)) else _sql_str(value)


def attach_statement(ep: Endpoints, alias: str = LAKE, catalog_settings: dict[str, str] | None = None) -> str:
    """`catalog_settings`: PostgreSQL settings for the catalog connections of this process only (libpq
    `options=-c name=value`), e.g. {"synchronous_commit": "off"}; nothing else is changed on the server."""
    path = "ducklake:postgres:dbname=" + ep.pg.dbname
    if catalog_settings:
        for name, value in catalog_settings.items():
            if (
                not name.replace("_", "").replace(".", "").isalnum()
                or not str(value).replace("_", "").replace(".", "").isalnum()
            ):
                raise KitError(
                    f"catalog setting {name}={value} is not a plain name=value", "use e.g. synchronous_commit=off"
                )
        path += " options='" + " ".join(f"-c{name}={value}" for name, value in catalog_settings.items()) + "'"
    return (
        f"ATTACH {_sql_str(path)} AS {alias} "
        f"(DATA_PATH {_sql_str(ep.data_path)}, METADATA_PARAMETERS MAP {{'SECRET': 'lake_catalog'}})"
    )


def setup_statements(
    ep: Endpoints,
    alias: str = LAKE,
    settings: dict[str, Any] | None = None,
    catalog_settings: dict[str, str] | None = None,
) -> list[str]:
    """`settings`: DuckDB settings SET before the ATTACH (so the postgres extension's pg_pool_* settings apply to
    the catalog's connection pool), on top of RETRY_SETTINGS."""
    pre = [f"SET {k} = {_setting_value(v)}" for k, v in {**RETRY_SETTINGS, **(settings or {})}.items()]
    return [
        *load_statements(),
        *secret_statements(ep),
        *pre,
        attach_statement(ep, alias, catalog_settings),
        f"USE {alias}",
    ]


def execute_retrying(
    con: duckdb.DuckDBPyConnection | Lake,
    sql: str,
    params: list | None = None,
    *,
    patience_s: float = 600.0,
    first_wait_s: float = 0.05,
    cap_s: float = 2.0,
) -> int:
    """Run one autocommit statement (a small INSERT, say); when DuckLake gave up retrying its commit (its error
    names the exhausted ducklake_max_retry_count), the transaction was rolled back whole and nothing was committed,
    so run it again: after a jittered wait that doubles from `first_wait_s` up to `cap_s`, for at most `patience_s`.
    Returns how many times it ran the statement again. Any other error, and the last one, propagates: a statement
    that is not safe to repeat (one that may have committed) is never repeated. Given a `Lake`, the statement
    commits through its commit gate (`Lake.write`)."""
    deadline = time.monotonic() + patience_s
    wait, reruns = first_wait_s, 0
    while True:
        try:
            if isinstance(con, Lake):
                con.write(sql, params)
            else:
                con.execute(sql, params or [])
            return reruns
        except duckdb.Error as exc:
            if DUCKLAKE_GAVE_UP not in str(exc) or time.monotonic() + wait > deadline:
                raise
        time.sleep(wait * random.uniform(0.5, 1.0))
        wait, reruns = min(cap_s, wait * 2), reruns + 1


@dataclass
class StatementResult:
    statement_type: str
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    affected_rows: int | None = None  # real counts for INSERT/UPDATE/DELETE, None where it has no meaning
    seconds: float | None = None  # how long the statement took, fetching its rows included
    snapshot_id: int | None = None  # the snapshot this statement committed (with `run(track_snapshots=True)`)
    statement: str = ""  # the statement's text

    def as_dict(self) -> dict[str, Any]:
        return {
            "statement_type": self.statement_type,
            "columns": self.columns,
            "rows": [list(r) for r in self.rows],
            "row_count": len(self.rows),
            "affected_rows": self.affected_rows,
        }


_DML = {"INSERT", "UPDATE", "DELETE", "MERGE_INTO"}


class _Fetched:
    """A statement's result, already fetched (its transaction committed after it ran)."""

    def __init__(self, description: Any, rows: list[tuple]):
        self.description, self._rows = description, rows

    def fetchall(self) -> list[tuple]:
        return self._rows

    def fetchone(self) -> tuple | None:
        return self._rows[0] if self._rows else None


class StatementFailed(KitError):
    """Statement `index` (0-based) of a multi-statement text failed; `results` holds those that ran before it."""

    def __init__(self, index: int, total: int, statement: str, error: str, results: list[StatementResult]):
        self.index, self.total, self.statement, self.error = index, total, statement.strip(), error
        self.results = list(results)
        where = (
            "" if total == 1 else f" at statement {index + 1} of {total} (the {index} before it ran, the rest did not)"
        )
        refused = storage_refused(error)
        if refused:
            super().__init__(
                f"SQL failed{where}: {refused}",
                "check the S3 key and secret the kit uses (the platform's "
                "credentials.json, or DUCKLAKE_S3_KEY_ID / DUCKLAKE_S3_SECRET for external)",
            )
        else:
            super().__init__(
                f"SQL failed{where}: {error}", 'fix the statement; `sql "SHOW ALL TABLES"` lists the tables'
            )


# how DuckDB's httpfs says that S3 refused a request's credentials: an HTTP error with status 403, or S3's own codes
_REFUSED_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")


def storage_refused(error: str) -> str | None:
    """When a statement failed because the S3 server refused the kit's credentials: that, said plainly. Only an
    HTTP error counts (a failed cast of the text 'Forbidden' is no such thing)."""
    if not ("HTTP 403" in error or (error.startswith("HTTP") and any(c in error for c in _REFUSED_CODES))):
        return None
    return (
        f"the S3 server refused the lake's credentials (HTTP 403) while reading or writing a data file ({error[:160]})"
    )


def bound_params(
    stmt, params: dict[str, Any] | None, index: int, total: int, results: list[StatementResult]
) -> dict[str, Any] | None:
    """The parameters statement `stmt` uses, from `params` (DuckDB's parser names them)."""
    names = stmt.named_parameters
    if not names:
        return None
    missing = sorted(names - set(params or {}))
    if missing:
        raise StatementFailed(
            index,
            total,
            stmt.query,
            "it uses the parameter(s) " + ", ".join("$" + m for m in missing) + " but no value was given for them",
            results,
        )
    return {name: params[name] for name in names}  # type: ignore[index]


AUTHOR = "ducklake-kit"  # every commit the kit makes names it as its author

# The writes, by DuckDB's statement type: each autocommits as one transaction, so it takes the commit gate, and a
# token of its own can decide its fate (steps/once.py). Not COPY (an export would hold the gate while it writes its
# file; a COPY into a lake table commits optimistically, still correctly), nor CALLs and SELECTs of DuckLake's
# maintenance functions (maintain's merges would hold it for minutes).
WRITE_KINDS = frozenset(_DML | {"CREATE", "DROP", "ALTER"})


class _Transaction:
    """Whether the connection has an explicit transaction open (BEGIN run through the Lake), shared by the Lake and
    its views (`on`): DuckDB cannot be asked, and a BEGIN inside a transaction aborts it."""

    open = False


class Lake:
    """One DuckDB connection with the lake attached, reused for every statement (`cursor()` per thread).

    Every commit it makes passes its commit gate (lake/gate.py; `commit_gate`: `advisory`, the default, or
    `optimistic`): an explicit COMMIT (`commit`, or a COMMIT statement run through `run`/`execute`), and each
    autocommit write statement (`write`). Reads never take it."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        alias: str = LAKE,
        settings: dict[str, Any] | None = None,
        catalog_settings: dict[str, str] | None = None,
        commit_gate: str | None = None,
    ):
        self.endpoints = endpoints
        self.alias = alias
        self.gate: CommitGate | None = CommitGate.of(endpoints.pg) if gate_mode(commit_gate) == ADVISORY else None
        self._txn = _Transaction()
        # set (e.g. {"run": "sql", "id": ...}): each autocommit write commits as its own transaction whose commit
        # carries a token and this in its commit_extra_info (`write`), so its fate can be asked of the lake
        self.autocommit_tag: dict[str, Any] | None = None
        # no automatic downloads: extensions come from the pinned wheels, their signatures checked once per file
        self.con = duckdb.connect(config=connect_config())
        for stmt in setup_statements(endpoints, alias, settings, catalog_settings):
            try:
                self.con.execute(stmt)
            except duckdb.Error as exc:
                self.con.close()
                raise self._explain_setup(stmt, exc) from None

    def _explain_setup(self, stmt: str, exc: duckdb.Error) -> KitError:
        msg = first_line(exc)
        if stmt.startswith(("LOAD", "INSTALL")):
            return KitError(
                f"could not load a DuckDB extension ({msg})",
                f"run `uv sync`: the wheels duckdb-extension-*=={duckdb.__version__} must match duckdb {duckdb.__version__}",
            )
        if "password authentication failed" in str(exc):
            return KitError(
                f"PostgreSQL at {self.endpoints.pg.host}:{self.endpoints.pg.port} refused the password for user '{self.endpoints.pg.user}'",
                "check the catalog credentials",
            )
        if stmt.startswith("ATTACH"):
            return KitError(f"could not attach the lake ({msg})", "run `up`, then `status` to see what is down")
        return KitError(f"lake setup failed at `{stmt.split('(')[0].strip()}` ({msg})", "run `status`")

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.con.close()

    def on(self, alias: str) -> Lake:
        """The same connection, aimed at another catalog attached to it (`ATTACH ... AS alias`): its `run`,
        snapshots and commit messages are that catalog's. It shares the connection: never close it."""
        other = copy.copy(self)
        other.alias = alias
        return other

    # -- transactions and the commit gate

    @property
    def in_transaction(self) -> bool:
        return self._txn.open

    def begin(self) -> None:
        self.con.execute("BEGIN TRANSACTION")
        self._txn.open = True

    def commit(self) -> None:
        """COMMIT the open transaction, holding the commit gate for just that (released when the COMMIT raises too;
        a failed COMMIT has ended the transaction either way)."""
        if self.gate is None:
            self._commit_now()
            return
        with self.gate.held():  # a gate that could not be had raises here: the transaction is still open
            self._commit_now()

    def _commit_now(self) -> None:
        try:
            self.con.execute("COMMIT")
        finally:
            self._txn.open = False

    def rollback(self) -> bool:
        """ROLLBACK the open transaction; False when there was none (DuckDB's error is the answer)."""
        self._txn.open = False
        try:
            self.con.execute("ROLLBACK")
        except duckdb.Error:
            return False
        return True

    def write(self, sql: Any, params: list | dict | None = None, index: int | None = None) -> duckdb.DuckDBPyConnection:
        """Run one autocommit write statement holding the commit gate (inside an open transaction, just run it: its
        COMMIT takes the gate). The gate covers the statement's work too, not only its commit: DuckLake's first
        commit attempt writes the snapshot after the one the transaction started from, so a transaction that began
        before the gate was had loses to every commit made while it waited, and pays a failed attempt plus a
        conflict check inside the gate (16 writers x 100 one-row inserts, measured on this machine: 15 inserts/s
        with one rollback per insert when BEGIN ... gated COMMIT, 33-41/s and no rollback when the gate covers the
        statement). A large autocommit INSERT ... SELECT therefore holds the gate while it runs: run large writes in
        a transaction (`transactions.commit_with`), whose gate covers only its COMMIT.

        With `autocommit_tag` set, the statement runs as its own transaction whose commit carries a token (`tagged`;
        `index`: its place in the text `run` was given, kept beside the token)."""
        if self._txn.open:
            return self.con.execute(sql, params)
        if self.autocommit_tag is not None:
            return self._tagged(sql, params, index)
        if self.gate is None:
            return self.con.execute(sql, params)
        with self.gate.held():
            rel = self.con.execute(sql, params)
            rows = rel.fetchall() if rel.description else []
        return _Fetched(rel.description, rows)

    def _tagged(self, sql: Any, params: list | dict | None, index: int | None) -> Any:
        """One autocommit write as BEGIN, the statement, its commit message with a token, COMMIT (through the gate,
        which covers the statement too, as `write` says). A COMMIT that raised may still have reached the catalog:
        the token in the lake says whether it did (landed: a success; not there: the error says nothing
        committed); it is never run again here."""
        token = uuid.uuid4().hex
        info = {"commit": token, **(self.autocommit_tag or {})}
        if index is not None:
            info["statement"] = index + 1
        committing = False
        with self.gate.held() if self.gate is not None else nullcontext():
            self.begin()
            try:
                rel = self.con.execute(sql, params)
                description, rows = rel.description, (rel.fetchall() if rel.description else [])
                self.con.execute(
                    "CALL ducklake_set_commit_message(?, ?, NULL, extra_info => ?)",
                    [self.alias, AUTHOR, json.dumps(info)],
                )
                committing = True
                self._commit_now()
            except duckdb.Error as exc:
                self.rollback()  # after a failed COMMIT there is nothing left: that error is ignored
                if not committing:
                    raise  # the statement's own error: nothing of it committed
                self._commit_fate(sql, token, exc)
            except BaseException:
                self.rollback()
                raise
        return _Fetched(description, rows)

    def _commit_fate(self, sql: Any, token: str, exc: duckdb.Error) -> None:
        """After a tagged write's COMMIT raised: return when its token is in the lake (it landed), else raise what
        is known, in one line (it did not land; or the lake cannot say, with the token to look for)."""
        from ducklake_kit.lake.statements import token_decides  # sqlglot: only after a failed commit

        why = first_line(exc)
        try:
            landed = self.snapshot_of_token(token)
        except duckdb.Error as lookup:
            raise duckdb.TransactionException(
                f"its commit failed ({why}) and the lake could not say whether it landed ({first_line(lookup)}): "
                f"look for its token {token} in ducklake_snapshot_changes.commit_extra_info before running it again"
            ) from None
        if landed is not None:
            return
        if not token_decides(self, getattr(sql, "query", sql)):
            raise duckdb.TransactionException(
                f"its commit failed ({why}) and it writes outside catalog {self.alias}, where its token is not, so the "
                "lake cannot say whether it landed: check before running it again"
            ) from None
        raise duckdb.TransactionException(
            f"its commit failed and did not land (its token is not in the lake): nothing of it committed ({why})"
        ) from None

    def snapshot_of_token(self, token: str) -> int | None:
        """The snapshot whose commit carried `token` (as `commit` in its commit_extra_info, whatever else it holds),
        or None: the way to find out whether a commit whose fate is unknown landed."""
        return self.snapshot_carrying("commit", token)

    def snapshot_carrying(self, key: str, value: str) -> int | None:
        """The (last) snapshot whose commit_extra_info has `value` under `key` (`commit`: the kit's token; `load`:
        a load's id), or None: nothing committed carried it."""
        meta = quote_ident(f"__ducklake_metadata_{self.alias}")
        row = self.con.execute(
            f"SELECT max(snapshot_id) FROM {meta}.ducklake_snapshot_changes "
            "WHERE json_extract_string(commit_extra_info, '$.' || ?) = ?",
            [key, value],
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor on the same database instance, for use from another thread."""
        cur = self.con.cursor()
        cur.execute(f"USE {self.alias}")
        return cur

    def last_committed_snapshot(self) -> int | None:
        """The snapshot the last transaction of this DuckDB instance committed (None before any)."""
        row = self.con.execute(f"SELECT * FROM {quote_ident(self.alias)}.last_committed_snapshot()").fetchone()
        return int(row[0]) if row and row[0] is not None else None

    def run(
        self, sql: str, *, track_snapshots: bool = False, params: dict[str, Any] | None = None
    ) -> list[StatementResult]:
        """Run one or more statements; rows for every statement that returns rows (whatever its first keyword),
        real affected counts for DML. When one fails, `StatementFailed` says which (its index and text) and keeps
        the results of those that ran before it; the later ones are not run.

        `track_snapshots`: each result's `snapshot_id` is the snapshot that statement committed (an autocommit
        write, a COMMIT, or a SELECT that calls a committing function such as ducklake_merge_adjacent_files), else
        None. Read from DuckLake's per-instance `last_committed_snapshot()` before and after each statement, so it
        is exact only while no other cursor of this DuckDB instance commits at the same time (a worker runs one task
        at a time).

        `params`: values bound as prepared-statement parameters, by name (`$name`; `$1` or `?` are '1', '2', ...):
        each statement gets those it uses, and one that uses a name `params` lacks fails before it runs."""
        statements = self.statements(sql)
        if not statements:
            raise KitError("no SQL statement given", 'pass one, e.g. `sql "SHOW TABLES"`')
        results: list[StatementResult] = []
        last = self.last_committed_snapshot() if track_snapshots else None
        for index, stmt in enumerate(statements):
            try:
                result = self.execute(stmt, bound_params(stmt, params, index, len(statements), results), index)
            except duckdb.Error as exc:
                raise StatementFailed(index, len(statements), stmt.query, first_line(exc), results) from None
            if track_snapshots:
                now = self.last_committed_snapshot()
                if now != last:
                    result.snapshot_id, last = now, now
            results.append(result)
        return results

    def statements(self, sql: str) -> list:
        """`sql` split into statements by DuckDB's own parser (KitError when it does not parse)."""
        try:
            return self.con.extract_statements(sql)
        except duckdb.Error as exc:
            raise KitError(f"SQL does not parse: {first_line(exc)}", "check the statement's syntax") from None

    def execute(self, stmt, params: dict[str, Any] | None = None, index: int | None = None) -> StatementResult:
        """One parsed statement (from `statements`; `index`: its place among them): its rows, or its real affected
        count for DML; duckdb.Error when it fails."""
        kind = stmt.type.name
        start = time.perf_counter()
        if kind == "TRANSACTION":
            rel = self._transaction_statement(stmt, params)
        elif kind in WRITE_KINDS and not self._txn.open and (self.gate is not None or self.autocommit_tag is not None):
            rel = self.write(stmt, params, index)
        else:
            rel = self.con.execute(stmt, params)
        columns = [d[0] for d in rel.description] if rel.description else []
        rows = rel.fetchall() if rel.description else []
        seconds = round(time.perf_counter() - start, 6)
        if kind in _DML and columns == ["Count"] and len(rows) == 1:
            return StatementResult(kind, [], [], int(rows[0][0]), seconds, statement=stmt.query.strip())
        if kind != "SELECT" and columns == ["Count"] and not rows:  # DDL: DuckDB describes an empty "Count" column
            columns = []
        return StatementResult(kind, columns, rows, None, seconds, statement=stmt.query.strip())

    def _transaction_statement(self, stmt, params: dict[str, Any] | None) -> Any:
        """A user's BEGIN / COMMIT / ROLLBACK: tracked, and the COMMIT gated."""
        word = stmt.query.strip().split(None, 1)[0].upper() if stmt.query.strip() else ""
        if word in ("COMMIT", "END"):
            self.commit()
            return _Fetched(None, [])
        rel = self.con.execute(stmt, params)
        self._txn.open = word in ("BEGIN", "START")
        return rel

    def scalar(self, sql: str, params: list | None = None) -> Any:
        row = self.con.execute(sql, params or []).fetchone()
        return row[0] if row else None

    def current_snapshot(self) -> int:
        """The latest snapshot (in a transaction: the one it reads). DuckLake's `current_snapshot()` asks the catalog
        for one row; `max(snapshot_id)` over `ducklake_snapshots()` would read every snapshot there is."""
        return int(self.scalar(f"SELECT id FROM {quote_ident(self.alias)}.current_snapshot()"))

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
