"""One transaction with a commit message: the statements, `ducklake_set_commit_message`, COMMIT, and the id of
the snapshot THIS transaction made.

That id is not the lake's latest snapshot (another writer may commit right after us), nor simply DuckLake's
`last_committed_snapshot()`: that is kept per DuckDB instance, so a cursor of the same `Lake` committing on
another thread can move it. Each commit therefore carries a token of its own in the snapshot's
`commit_extra_info`, and the snapshot is the one that holds it.

A failed statement or a failed COMMIT rolls back and raises; nothing here is ever re-run, since a COMMIT that
failed may still have reached the catalog. The COMMIT passes the lake's commit gate (lake/gate.py)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from ducklake_kit.lake.connection import AUTHOR, Lake, StatementFailed, StatementResult
from ducklake_kit.lake.sql import quote_ident


@dataclass(frozen=True)
class CommitTag:
    """What one commit carries: its `message`, and in its commit_extra_info the `token` that finds it in the lake
    later (when its fate is unknown) and any `extra` (a pipeline's run and node, a playbook's step, ...)."""

    message: str
    token: str | None = None
    extra: dict[str, Any] | None = None


@dataclass
class Commit:
    snapshot_id: int | None  # the snapshot this transaction made; None when it changed nothing
    message: str
    results: list[StatementResult] = field(default_factory=list)

    @property
    def affected_rows(self) -> int:
        """Rows inserted, updated or deleted by the transaction's DML statements."""
        return sum(r.affected_rows or 0 for r in self.results)


def last_committed_snapshot(lake: Lake) -> int | None:
    """The snapshot the last transaction of this DuckDB instance committed (None before any)."""
    return lake.last_committed_snapshot()


def snapshot_with_token(lake: Lake, token: str, hint: int | None = None, extra: str | None = None) -> int | None:
    """The snapshot whose commit_extra_info carries `token` (`extra`: the whole extra info, when the commit added
    more to it than the token): `hint` first (one catalog row), else a search by the token (`snapshot_of_token`)."""
    extra = extra if extra is not None else json.dumps({"commit": token})
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    if hint is not None:
        row = lake.con.execute(
            f"SELECT commit_extra_info FROM {meta}.ducklake_snapshot_changes WHERE snapshot_id = ?", [hint]
        ).fetchone()
        if row and row[0] == extra:
            return hint
    return snapshot_of_token(lake, token)


def snapshot_of_token(lake: Lake, token: str) -> int | None:
    """The snapshot whose commit carried `token`, or None (`Lake.snapshot_of_token`)."""
    return lake.snapshot_of_token(token)


def rollback_quietly(con: duckdb.DuckDBPyConnection) -> None:
    """ROLLBACK after a failure; a failed COMMIT has already ended the transaction, and the original error is the
    one to report, so a ROLLBACK that fails too is ignored."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


def commit(
    lake: Lake,
    sql: str | list[str],
    message: str,
    *,
    before_commit: Callable[[], None] | None = None,
    token: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Commit:
    """Run `sql` (one text of one or more statements, or a list of texts) in ONE transaction with `message`
    as its commit message: one snapshot, or nothing when anything fails. `before_commit`: called once the
    statements ran, before the COMMIT. `token`, `extra`: see `commit_with`."""
    results: list[StatementResult] = []
    texts = [sql] if isinstance(sql, str) else sql

    def run_texts(_con: duckdb.DuckDBPyConnection) -> None:
        for i, text in enumerate(texts):
            try:
                results.extend(lake.run(text))
            except StatementFailed as exc:  # index, total and results over all the texts, not just the failing one
                try:
                    later = sum(len(lake.con.extract_statements(t)) for t in texts[i + 1 :])
                except duckdb.Error:  # a later text that does not parse: the first failure is the one to report
                    later = 0
                raise StatementFailed(
                    len(results) + exc.index,
                    len(results) + exc.total + later,
                    exc.statement,
                    exc.error,
                    results + exc.results,
                ) from None

    made = commit_with(lake, run_texts, message, before_commit=before_commit, token=token, extra=extra)
    made.results = results
    return made


def commit_with(
    lake: Lake,
    work: Callable[[duckdb.DuckDBPyConnection], None],
    message: str,
    *,
    before_commit: Callable[[], None] | None = None,
    extra: dict[str, Any] | None = None,
    token: str | None = None,
) -> Commit:
    """`work(con)` in ONE transaction with `message` as its commit message (for statements with parameters,
    `executemany`): one snapshot, or nothing when it raises. `extra`: more to keep in the snapshot's
    commit_extra_info (JSON), beside the commit's token. `token`: the caller's (see `commit_once`)."""
    token = token or uuid.uuid4().hex
    extra_info = json.dumps({"commit": token, **(extra or {})})
    con = lake.con
    lake.begin()
    try:
        work(con)
        if before_commit is not None:
            before_commit()
        con.execute(
            "CALL ducklake_set_commit_message(?, ?, ?, extra_info => ?)", [lake.alias, AUTHOR, message, extra_info]
        )
        # through the lake's commit gate (lake/gate.py), held for the COMMIT only: `work` may be long (a pipeline
        # node's CREATE TABLE AS), and other writers must not wait for it
        lake.commit()
    except BaseException:
        lake.rollback()  # after a failed COMMIT there is nothing left to roll back: that error is ignored
        raise
    return Commit(snapshot_with_token(lake, token, last_committed_snapshot(lake), extra_info), message)


def commit_once(
    lake: Lake,
    work: Callable[[duckdb.DuckDBPyConnection], None],
    message: str,
    *,
    extra: dict[str, Any] | None = None,
    attempts: int = 5,
    backoff_s: float = 0.2,
) -> Commit:
    """`commit_with`, tried again when the commit failed and did not land: every attempt carries the same token,
    and after a failure the lake is asked for it. Found: an attempt landed (its snapshot is returned, never written
    twice). Not found: nothing landed, so another attempt is safe (e.g. after losing a commit race to a concurrent
    writer). The last failure is raised when every attempt failed."""
    token = uuid.uuid4().hex
    for attempt in range(1, attempts + 1):
        try:
            return commit_with(lake, work, message, extra=extra, token=token)
        except duckdb.Error:
            landed = snapshot_of_token(lake, token)
            if landed is not None:
                return Commit(landed, message)
            if attempt == attempts:
                raise
            time.sleep(backoff_s * attempt)
    raise AssertionError("unreachable")
