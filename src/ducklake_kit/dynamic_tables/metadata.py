"""What the kit knows about dynamic tables, in the catalog's PostgreSQL database, schema `dynamic_tables`
(psycopg): `definitions` (every property, the plan and its reason, the status), `sources` (the snapshot each
source was last read at), `dependencies` (dynamic tables over dynamic tables) and `refresh_history`.

History is written once a refresh's outcome is known (committed, failed or skipped), never ahead of it. The
snapshots a refresh read are also kept in the lake, in the commit it made (see `refresh`), so a refresh whose
commit reached the lake but whose metadata write did not is never applied twice."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.base import Endpoints

SCHEMA = "dynamic_tables"
DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.definitions (
    name text PRIMARY KEY, definition_id text NOT NULL, query text NOT NULL, ddl text NOT NULL,
    lag_seconds integer, refresh_mode text NOT NULL, initialize text NOT NULL,
    status text NOT NULL DEFAULT 'ACTIVE', plan_kind text NOT NULL, plan text NOT NULL, reason text,
    columns jsonb NOT NULL, consecutive_failures integer NOT NULL DEFAULT 0,
    data_snapshot bigint, data_timestamp timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {SCHEMA}.sources (
    name text NOT NULL REFERENCES {SCHEMA}.definitions ON DELETE CASCADE, source text NOT NULL,
    read_snapshot bigint, PRIMARY KEY (name, source));
CREATE TABLE IF NOT EXISTS {SCHEMA}.dependencies (
    name text NOT NULL REFERENCES {SCHEMA}.definitions ON DELETE CASCADE, depends_on text NOT NULL,
    PRIMARY KEY (name, depends_on));
CREATE TABLE IF NOT EXISTS {SCHEMA}.refresh_history (
    id bigserial PRIMARY KEY, name text NOT NULL, definition_id text NOT NULL, trigger text NOT NULL,
    status text NOT NULL, mode text, reason text, rows_inserted bigint, rows_deleted bigint,
    snapshots_read jsonb, read_snapshot bigint, commit_snapshot bigint, data_timestamp timestamptz,
    started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL, duration_ms double precision, error text);
CREATE INDEX IF NOT EXISTS refresh_history_name ON {SCHEMA}.refresh_history (name, id);
ALTER TABLE {SCHEMA}.refresh_history ADD COLUMN IF NOT EXISTS phases jsonb;
ALTER TABLE {SCHEMA}.definitions ADD COLUMN IF NOT EXISTS immutable_where text;
"""
DDL_LOCK = int.from_bytes(b"dyn-ddl", "big")  # held while the schema is created (if missing)
ACTIVE, SUSPENDED = "ACTIVE", "SUSPENDED"
# refresh modes (REFRESH_MODE; AUTO is stored as ADAPTIVE)
FULL, INCREMENTAL, ADAPTIVE = "FULL", "INCREMENTAL", "ADAPTIVE"
# refresh outcomes
SUCCEEDED, FAILED, SKIPPED, NO_DATA = "SUCCEEDED", "FAILED", "SKIPPED", "NO_DATA"


@dataclass
class Definition:
    name: str
    definition_id: str
    query: str
    ddl: str
    lag_seconds: int | None  # None: DOWNSTREAM
    refresh_mode: str
    initialize: str
    status: str
    plan_kind: str
    plan: str
    reason: str | None
    columns: list[str]
    consecutive_failures: int
    data_snapshot: int | None  # the snapshot of the sources the table reflects (None: never refreshed)
    data_timestamp: datetime | None  # that snapshot's commit time
    created_at: datetime
    updated_at: datetime
    sources: dict[str, int | None] = field(default_factory=dict)  # source -> the snapshot it was last read at
    depends_on: list[str] = field(default_factory=list)  # the dynamic tables it reads
    immutable_where: str | None = None  # IMMUTABLE WHERE's condition: the rows matching it are never recomputed

    @property
    def lag(self) -> str:
        from ducklake_kit.dynamic_tables.ddl import Lag

        return str(Lag(self.lag_seconds))


@dataclass
class Refresh:
    """One row of refresh_history."""

    name: str
    definition_id: str
    trigger: str  # create | manual | schedule | downstream
    status: str
    started_at: datetime
    finished_at: datetime
    mode: str | None = None  # FULL | INCREMENTAL
    reason: str | None = None  # why that mode (or why skipped)
    rows_inserted: int | None = None
    rows_deleted: int | None = None
    snapshots_read: dict[str, int] | None = None  # source -> snapshot read
    read_snapshot: int | None = None
    commit_snapshot: int | None = None  # the snapshot the refresh made (None: it changed nothing)
    data_timestamp: datetime | None = None
    duration_ms: float | None = None
    error: str | None = None
    id: int | None = None
    phases: dict[str, float] | None = None  # milliseconds per phase of the refresh (refresh.PHASES)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__.items())
        for k in ("started_at", "finished_at", "data_timestamp"):
            out[k] = out[k].isoformat() if out[k] else None
        return out


class Metadata:
    """The `dynamic_tables` schema, through one autocommit psycopg connection."""

    def __init__(self, ep: Endpoints):
        self.conn = postgres.connect(ep.pg, timeout=10)
        self.conn.row_factory = dict_row
        with self.conn.transaction():  # two processes creating the schema at once would collide in pg_namespace
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", [DDL_LOCK])
            self.conn.execute(DDL)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Metadata:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, name: str) -> Definition | None:
        row = self.conn.execute(f"SELECT * FROM {SCHEMA}.definitions WHERE name = %s", [name]).fetchone()
        return self._definition(row) if row else None

    def all(self) -> list[Definition]:
        rows = self.conn.execute(f"SELECT * FROM {SCHEMA}.definitions ORDER BY name").fetchall()
        return [self._definition(r) for r in rows]

    def _definition(self, row: dict[str, Any]) -> Definition:
        d = Definition(**row)
        d.sources = {
            r["source"]: r["read_snapshot"]
            for r in self.conn.execute(
                f"SELECT source, read_snapshot FROM {SCHEMA}.sources WHERE name = %s ORDER BY source", [d.name]
            )
        }
        d.depends_on = [
            r["depends_on"]
            for r in self.conn.execute(
                f"SELECT depends_on FROM {SCHEMA}.dependencies WHERE name = %s ORDER BY depends_on", [d.name]
            )
        ]
        return d

    def create(self, d: Definition, *, replace: bool) -> None:
        """Insert the definition, its sources and dependencies in one transaction (replacing an older one)."""
        with self.conn.transaction():
            if replace:
                self.conn.execute(f"DELETE FROM {SCHEMA}.definitions WHERE name = %s", [d.name])
            self.conn.execute(
                f"INSERT INTO {SCHEMA}.definitions (name, definition_id, query, ddl, lag_seconds, refresh_mode, "
                "initialize, status, plan_kind, plan, reason, columns, immutable_where) VALUES (%s, %s, %s, %s, %s, "
                "%s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    d.name,
                    d.definition_id,
                    d.query,
                    d.ddl,
                    d.lag_seconds,
                    d.refresh_mode,
                    d.initialize,
                    d.status,
                    d.plan_kind,
                    d.plan,
                    d.reason,
                    json.dumps(d.columns),
                    d.immutable_where,
                ],
            )
            for source in d.sources:
                self.conn.execute(f"INSERT INTO {SCHEMA}.sources (name, source) VALUES (%s, %s)", [d.name, source])
            for dep in d.depends_on:
                self.conn.execute(f"INSERT INTO {SCHEMA}.dependencies VALUES (%s, %s)", [d.name, dep])

    def drop(self, name: str) -> None:
        """The definition, its sources, dependencies and history."""
        with self.conn.transaction():
            self.conn.execute(f"DELETE FROM {SCHEMA}.refresh_history WHERE name = %s", [name])
            self.conn.execute(f"DELETE FROM {SCHEMA}.definitions WHERE name = %s", [name])

    def set(self, name: str, **values: Any) -> None:
        cols = ", ".join(f"{k} = %s" for k in values)
        self.conn.execute(
            f"UPDATE {SCHEMA}.definitions SET {cols}, updated_at = now() WHERE name = %s", [*values.values(), name]
        )

    def dependents(self, name: str) -> list[str]:
        return [
            r["name"]
            for r in self.conn.execute(
                f"SELECT name FROM {SCHEMA}.dependencies WHERE depends_on = %s ORDER BY name", [name]
            )
        ]

    def record(self, r: Refresh) -> Refresh:
        """Write a refresh's outcome; a successful one also moves the table's data snapshot and its sources'. One
        statement (one round trip, atomic as any statement is): the history row, and the definition's and sources'
        updates as data-modifying CTEs."""
        current = "name = %(name)s AND definition_id = %(definition_id)s"
        if r.status in (SUCCEEDED, NO_DATA):
            updates = (
                f", d AS (UPDATE {SCHEMA}.definitions SET data_snapshot = %(read_snapshot)s, "
                f"data_timestamp = %(data_timestamp)s, consecutive_failures = 0, updated_at = now() WHERE {current}), "
                f"s AS (UPDATE {SCHEMA}.sources AS s SET read_snapshot = v.snap::bigint "
                "FROM jsonb_each_text(%(snapshots_read)s::jsonb) AS v(source, snap) "
                "WHERE s.name = %(name)s AND s.source = v.source)"
            )
        elif r.status == FAILED:
            updates = (
                f", d AS (UPDATE {SCHEMA}.definitions SET consecutive_failures = consecutive_failures + 1, "
                f"updated_at = now() WHERE {current})"
            )
        else:
            updates = ""
        values = {
            "name": r.name,
            "definition_id": r.definition_id,
            "trigger": r.trigger,
            "status": r.status,
            "mode": r.mode,
            "reason": r.reason,
            "rows_inserted": r.rows_inserted,
            "rows_deleted": r.rows_deleted,
            "snapshots_read": json.dumps(r.snapshots_read) if r.snapshots_read is not None else None,
            "read_snapshot": r.read_snapshot,
            "commit_snapshot": r.commit_snapshot,
            "data_timestamp": r.data_timestamp,
            "started_at": r.started_at,
            "finished_at": r.finished_at,
            "duration_ms": r.duration_ms,
            "error": r.error,
            "phases": json.dumps(r.phases) if r.phases is not None else None,
        }
        columns = [k for k in values if k != "name"]
        row = self.conn.execute(
            f"WITH h AS (INSERT INTO {SCHEMA}.refresh_history (name, {', '.join(columns)}) VALUES (%(name)s, "
            + ", ".join(f"%({c})s" for c in columns)
            + f") RETURNING id){updates} SELECT id FROM h",
            values,
        ).fetchone()
        r.id = row["id"]
        return r

    def commit_snapshots(self, name: str, definition_id: str, since: int) -> set[int]:
        """The lake snapshots (from `since` on) that recorded refreshes of this definition made."""
        return {
            r["commit_snapshot"]
            for r in self.conn.execute(
                f"SELECT commit_snapshot FROM {SCHEMA}.refresh_history WHERE name = %s AND definition_id = %s "
                "AND commit_snapshot >= %s",
                [name, definition_id, since],
            )
        }

    def note(self, r: Refresh, reason: str) -> None:
        """Replace the reason a recorded refresh gives (what happened after it, e.g. the table suspended)."""
        self.conn.execute(f"UPDATE {SCHEMA}.refresh_history SET reason = %s WHERE id = %s", [reason, r.id])

    def history(self, name: str, limit: int = 20) -> list[Refresh]:
        """The refreshes of the table's current definition (a CREATE OR REPLACE starts a new one), newest first."""
        rows = self.conn.execute(
            f"SELECT h.* FROM {SCHEMA}.refresh_history h JOIN {SCHEMA}.definitions d USING (name, definition_id) "
            "WHERE h.name = %s ORDER BY h.id DESC LIMIT %s",
            [name, limit],
        ).fetchall()
        return [Refresh(**r) for r in rows]
