"""A step's write whose DuckLake commit failed, tried again only when the lake says it committed nothing.

DuckLake commits optimistically: two workers that create the same table at once (NoETL's ducklake_test runs
`CREATE TABLE IF NOT EXISTS user_events ...; INSERT ...` in a parallel loop) both write the next snapshot, and the
one that loses gets DuckLake's generic "Failed to commit DuckLake transaction". Its transaction was rolled back
whole, so running it again is safe, and a `CREATE TABLE IF NOT EXISTS` that lost then finds the table and
succeeds. But a COMMIT that raised may still have reached the catalog, so nothing is run again on the error's word:

- each autocommit write statement runs as its own transaction whose commit carries a token (commit_extra_info);
- when its COMMIT fails, the token is looked up in the lake: found, it committed (a success, never run again); not
  found, it committed nothing, and it is tried again, up to ATTEMPTS times with a short jittered wait; the lake
  cannot be asked, or the statement names a table of another catalog (where the token is not): its fate is unknown,
  said so, and it is not run again;
- a failure of the statement itself (not of its commit) is never tried again: it is the statement's error.

Each retry is recorded with its reason (`StatementRun.retries`), and a failure names the conflict when the catalog
can tell it: the commits made meanwhile say which table another worker created or wrote.

The ATTACH of a fresh catalog races too (both workers create its tables, and one fails with "Failed to initialize
DuckLake"): it changes no data, so it is tried again the same way (`attach_retrying`).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from ducklake_kit.errors import first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import split_changes
from ducklake_kit.lake.connection import StatementResult
from ducklake_kit.lake.sql import quote_ident
from ducklake_kit.lake.statements import token_decides
from ducklake_kit.lake.transactions import AUTHOR, snapshot_of_token

ATTEMPTS = 5  # tries of an ATTACH, or of a write whose commit did not land, before its failure is final
BACKOFF_S = 0.05  # the first wait between tries; it doubles, jittered (0.5-1.5x), up to BACKOFF_CAP_S
BACKOFF_CAP_S = 1.0
# DuckLake's error when it could not create a new catalog's tables: on a fresh catalog, the same ATTACH on two
# workers at once both try (PostgreSQL: duplicate key ... pg_type_typname_nsp_index); the one that lost made nothing
CATALOG_INIT_FAILED = "Failed to initialize DuckLake"
DISABLED = False  # tests only (`set_test_hooks`): True turns the retries off, to show a test fails without them
_CONFLICTS = [0]  # tests only (`set_test_hooks`): how many of this worker's next commits a competing commit breaks


def pause(attempt: int) -> None:
    time.sleep(min(BACKOFF_CAP_S, BACKOFF_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5))


class StepError(Exception):
    """A failure, said in one line (`what`)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def attach_retrying(con: duckdb.DuckDBPyConnection, attach: str, catalog: str, retries: list[str]) -> None:
    """ATTACH ... (CREATE_IF_NOT_EXISTS true) of `catalog`, tried again when DuckLake failed to create it because
    another worker was creating it at the same time: an ATTACH changes no data, and the next one finds the catalog
    the other worker made. Each retry's reason goes to `retries`."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            con.execute(attach)
            return
        except duckdb.Error as exc:
            if CATALOG_INIT_FAILED not in str(exc) or DISABLED:
                raise
            why = f"another worker was creating catalog {catalog} at the same time ({first_line(exc)})"
            if attempt == ATTEMPTS:
                raise StepError(f"{why}; it still failed after {ATTEMPTS} tries") from None
            retries.append(f"ATTACH, try {attempt}: {why}; it created nothing, so it was tried again")
            pause(attempt)


@dataclass
class Written:
    """A write statement's outcome: its result, and why earlier tries were run again."""

    result: StatementResult
    retries: list[str] = field(default_factory=list)
    landed: int | None = None  # the snapshot its token was found in, when its COMMIT reported a failure but landed


class WriteFailed(Exception):
    """The write failed for good: `error` (the statement's own, or its commit's, with the conflict named when the
    catalog tells it), after `retries`."""

    def __init__(self, error: str, retries: list[str]):
        super().__init__(error)
        self.error, self.retries = error, retries


def write_once(view: Lake, stmt: Any, params: dict[str, Any] | None, extra: dict[str, Any]) -> Written:
    """One autocommit write statement as its own transaction whose commit carries a token (and `extra`) in its
    commit_extra_info, holding the lake's commit gate through it as `Lake.write` does. Tried again when its COMMIT
    failed and the token is not in the lake (see the module's docstring); WriteFailed when it fails for good."""
    token = uuid.uuid4().hex  # the same for every try: whichever landed, the lake finds it
    info = json.dumps({"commit": token, **extra})
    retries: list[str] = []
    for attempt in range(1, ATTEMPTS + 1):
        started = time.time()
        committing = False
        try:
            with view.gate.held() if view.gate is not None else nullcontext():
                view.begin()
                try:
                    result = view.execute(stmt, params)
                    committing = True
                    view.con.execute(
                        "CALL ducklake_set_commit_message(?, ?, ?, extra_info => ?)", [view.alias, AUTHOR, None, info]
                    )
                    with fault_at_commit(view) as fault:  # test hook: a competing commit fails it (else no-op)
                        fault()
                        view.commit()
                except BaseException:
                    view.rollback()  # after a failed COMMIT there is nothing left: that error is ignored
                    raise
            return Written(result, retries)
        except duckdb.Error as exc:
            error = first_line(exc)
            if not committing:  # the statement itself failed: its own error, never run again
                raise WriteFailed(_after(error, retries), retries) from None
        try:
            landed = snapshot_of_token(view, token)
        except Exception as exc:  # noqa: BLE001 - the lake cannot say: the fate stays unknown, and is said so
            raise WriteFailed(
                f"its commit failed ({error}) and the lake could not say whether it landed ({first_line(exc)}): "
                "check the lake before running it again",
                retries,
            ) from None
        if landed is None and not token_decides(view, stmt.query):
            raise WriteFailed(
                f"its commit failed ({error}) and it names a table outside catalog {view.alias}, where its token is "
                "not, so the lake cannot say whether it landed: check before running it again",
                retries,
            )
        if landed is not None:  # it landed: a success, whatever the error on the way back said
            retries.append(
                f"try {attempt}: its commit reported {error!r} but landed (snapshot {landed}, found by its token)"
            )
            return Written(StatementResult(stmt.type.name, statement=stmt.query.strip()), retries, landed)
        why = f"{conflict(view, stmt.query, started) or 'its commit failed'} ({error})"
        if attempt == ATTEMPTS or DISABLED:
            raise WriteFailed(
                f"{why}; it did not land (its token is not in the lake) after {attempt} tries: nothing of it committed",
                retries,
            )
        retries.append(f"try {attempt}: {why}; it did not land (its token is not in the lake), so it ran again")
        pause(attempt)
    raise AssertionError("unreachable")


def set_test_hooks(conflicts: int = 0, disabled: bool = False) -> None:
    """Tests, on every worker (`client.run`): the next `conflicts` commits of a step's writes on the worker fail
    (`fault_at_commit`); `disabled` turns the retries off."""
    global DISABLED
    _CONFLICTS[0], DISABLED = conflicts, disabled


@contextmanager
def fault_at_commit(view: Lake) -> Iterator[Callable[[], None]]:
    """Test hook around a step's transaction: yields what to call just before its COMMIT, a no-op unless
    `set_test_hooks(conflicts=n)` asked for a fault, a real transient commit failure: another cursor of the worker
    commits a snapshot (a schema, dropped again on the way out) after this transaction began, and DuckLake's own
    retries are off for the COMMIT, so it fails on the snapshot id the other one took, having committed nothing."""
    if _CONFLICTS[0] <= 0:
        yield lambda: None
        return
    _CONFLICTS[0] -= 1
    con, schema = view.con, quote_ident(view.alias) + "." + quote_ident(f"fault_{uuid.uuid4().hex[:8]}")
    old = con.execute("SELECT current_setting('ducklake_max_retry_count')").fetchone()[0]
    other = con.cursor()

    def arm() -> None:
        other.execute(f"CREATE SCHEMA {schema}")
        con.execute("SET ducklake_max_retry_count = 0")

    try:
        yield arm
    finally:
        con.execute(f"SET ducklake_max_retry_count = {int(old)}")
        other.execute(f"DROP SCHEMA IF EXISTS {schema}")
        other.close()


def _after(error: str, retries: list[str]) -> str:
    return error if not retries else f"{error} (on try {len(retries) + 1}, after: {retries[-1]})"


def conflict(view: Lake, sql: str, since: float) -> str | None:
    """What another writer committed to the statement's tables since `since` (epoch seconds, less a margin for the
    clocks), as the catalog records it: "another worker (w2) created user_events at the same time"; None when the
    catalog shows no such commit (or cannot be read)."""
    names = _tables(sql)
    meta = quote_ident(f"__ducklake_metadata_{view.alias}")
    try:
        rows = view.con.execute(
            f"SELECT c.snapshot_id, c.changes_made, c.commit_extra_info FROM {meta}.ducklake_snapshot_changes c "
            f"JOIN {meta}.ducklake_snapshot s USING (snapshot_id) WHERE s.snapshot_time >= to_timestamp(?) "
            "ORDER BY c.snapshot_id",
            [since - 2.0],
        ).fetchall()
    except duckdb.Error:
        return None
    for snapshot, changes, extra in rows:
        who = _who(extra)
        for change in split_changes(changes):
            kind, _, target = change.partition(":")
            table = target.replace('"', "").rsplit(".", 1)[-1].lower()
            if table in names or (not names and kind.startswith("created")):
                verb = {"created_table": "created", "created_schema": "created schema", "dropped_table": "dropped"}
                return f"{who} {verb.get(kind, 'wrote to')} {target.replace(chr(34), '')} at the same time (snapshot {snapshot})"
    if rows:
        return f"another writer committed at the same time (snapshot {rows[-1][0]})"
    return None


def _who(extra: str | None) -> str:
    try:
        worker = (json.loads(extra) or {}).get("worker") if extra else None
    except (ValueError, AttributeError):
        worker = None
    return f"another worker ({worker})" if worker else "another writer"


def _tables(sql: str) -> set[str]:
    """The names of the tables (and schemas) a statement creates or writes, lower-cased, read by sqlglot."""
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
    except (ParseError, TokenError):
        return set()
    names = {t.name.lower() for tree in trees for t in tree.find_all(exp.Table)}
    for tree in trees:
        if isinstance(tree, exp.Create) and tree.kind == "SCHEMA" and isinstance(tree.this, exp.Table):
            names.add((tree.this.db or tree.this.name).lower())
    return names
