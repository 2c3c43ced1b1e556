"""One transaction with a commit message: the statements, `ducklake_set_commit_message`, COMMIT, and the id of
the snapshot this connection committed (`last_committed_snapshot()`, not the lake's latest: another writer may
commit in between, and its snapshot is not ours).

A failed statement or a failed COMMIT rolls back and raises; nothing here is ever re-run, since a COMMIT that
failed may still have reached the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from ducklake_kit.lake.connection import Lake, StatementResult
from ducklake_kit.lake.sql import quote_ident

AUTHOR = "ducklake-kit"


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
    """The snapshot the last transaction of this connection committed (None before any)."""
    row = lake.con.execute(f"SELECT * FROM {quote_ident(lake.alias)}.last_committed_snapshot()").fetchone()
    return int(row[0]) if row and row[0] is not None else None


def commit(lake: Lake, sql: str | list[str], message: str, *, author: str = AUTHOR) -> Commit:
    """Run `sql` (one text of one or more statements, or a list of texts) in ONE transaction with `message`
    as its commit message: one snapshot, or nothing when anything fails."""
    before = last_committed_snapshot(lake)
    con = lake.con
    con.execute("BEGIN TRANSACTION")
    try:
        results: list[StatementResult] = []
        for text in [sql] if isinstance(sql, str) else sql:
            results.extend(lake.run(text))
        con.execute("CALL ducklake_set_commit_message(?, ?, ?)", [lake.alias, author, message])
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # a failed COMMIT has already ended the transaction; the original error is the one to report
        raise
    after = last_committed_snapshot(lake)
    return Commit(after if after != before else None, message, results)
