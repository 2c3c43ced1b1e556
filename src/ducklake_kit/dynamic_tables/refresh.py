"""One refresh of one dynamic table, in its own transaction.

1. Hold the table's advisory lock (two refreshers of one table would apply a change twice), then open ONE DuckLake
   transaction for everything that follows, reads and writes (outside a transaction every statement asks the catalog
   for the latest snapshot again).
2. Read the lake's current snapshot once: every source is read AT (VERSION => that snapshot), and that is the
   snapshot recorded. Changes committed meanwhile by others are after it, so the next refresh reads them.
3. Where the previous refresh left off: the later of the metadata's record and the lake's (every refresh commit
   carries `{"dynamic_table", "definition", "read"}` in its commit_extra_info), so a commit whose metadata write
   was lost is never applied again; such a commit is written to the history then (`recover`).
4. What changed since then, from the catalog alone (`feed`); an ADAPTIVE table chooses full or incremental from the
   change's size there. Then each changed source's change feed into temporary tables (none for an unchanged one),
   the rows to delete and insert computed from pinned reads (see `plan`), and the DELETE and INSERT committed.
   Counts are the statements' own. The outcome goes to the history afterwards, whatever it was, with the time
   each phase took (PHASES).

A refresh with no source change makes no snapshot (NO_DATA)."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb
import psycopg
import sqlglot
from sqlglot import exp

from ducklake_kit.dynamic_tables import counts as multiplicity
from ducklake_kit.dynamic_tables import feed
from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.ddl import DIALECT
from ducklake_kit.dynamic_tables.metadata import FAILED, NO_DATA, SUCCEEDED, Definition, Metadata, Refresh
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import change_counts, changes_sql
from ducklake_kit.lake.sql import quote_ident, quote_literal, table_exists
from ducklake_kit.lake.transactions import AUTHOR, commit_with, snapshot_of_token
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.report import Reporter

FULL, INCREMENTAL, ADAPTIVE = "FULL", "INCREMENTAL", "ADAPTIVE"
# ADAPTIVE refreshes in full when the change (rows added and removed, as the catalog's file counts give them) is over
# this share of its sources' rows, else incrementally: the crossover `bench --suite dynamic` measures (its stream of
# 1 % appends and one month replaced; docs/benchmarks.md has the figures: 3.7 % and "below 1 %" on a busy machine,
# so this value is provisional, and one share cannot fit every base size, see there)
ADAPTIVE_CROSSOVER = 0.05
# ... except that a change of at most this many rows is always incremental: at that size each kind of refresh costs
# its fixed cost (tens of milliseconds), and the incremental one writes only what changed
ADAPTIVE_SMALL_CHANGE = 1000
# a source unchanged in a refresh's span and of at most this many rows is read from a copy in memory (`_copies_for`)
COPY_ROWS = 100_000
LOCK_NAMESPACE = int.from_bytes(b"D\x00", "big") << 48
LOCK_WAIT_S = 600
PRE, POST = ("delete", "update_preimage"), ("insert", "update_postimage")


def lock_key(name: str) -> int:
    """The advisory lock a refresh of `name` holds: 48 bits of its name's hash in the dynamic tables' namespace."""
    return LOCK_NAMESPACE | int.from_bytes(hashlib.blake2b(name.encode(), digest_size=6).digest(), "big")


def target(lake: Lake, name: str) -> str:
    schema, table = name.split(".")
    return f"{quote_ident(lake.alias)}.{quote_ident(schema)}.{quote_ident(table)}"


def parse_query(d: Definition) -> exp.Expression:
    return sqlglot.parse_one(d.query, read=DIALECT)


def named(query: exp.Expression, names: list[str]) -> exp.Expression:
    """The query with each select item aliased to the column name the table has (as DuckDB first named it), so
    every rewritten form of it gives the same names. A `*` is left alone."""
    out = query.copy()
    if (
        isinstance(out, exp.Select)
        and len(out.selects) == len(names)
        and not any(isinstance(s.unalias(), exp.Star) for s in out.selects)
    ):
        out.set("expressions", [exp.alias_(s.unalias(), n, quoted=True) for s, n in zip(out.selects, names)])
    return out


def sql(e: exp.Expression) -> str:
    return e.sql(DIALECT)


def lake_commits(lake: Lake, d: Definition, after: int | None = None) -> list[tuple[int, dict]]:
    """(snapshot, commit_extra_info) of every committed refresh of this definition that records what it read,
    oldest first; only commits after snapshot `after` are searched (the filter goes to PostgreSQL: the catalog
    keeps every snapshot)."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    rows = lake.con.execute(
        f"SELECT snapshot_id, commit_extra_info FROM {meta}.ducklake_snapshot_changes "
        "WHERE snapshot_id > ? AND commit_extra_info IS NOT NULL ORDER BY snapshot_id",
        [after if after is not None else -1],
    ).fetchall()
    return refresh_commits(rows, d)


def refresh_commits(rows: list[tuple[int, str | None]], d: Definition) -> list[tuple[int, dict]]:
    """Of (snapshot, commit_extra_info) rows in snapshot order, those of a committed refresh of `d` (`lake_commits`)."""
    out = []
    for snapshot, info in rows:
        if info is None:
            continue
        try:
            extra = json.loads(info)
        except ValueError:  # another writer's own extra info
            continue
        if (
            isinstance(extra, dict)
            and extra.get("dynamic_table") == d.name
            and extra.get("definition") == d.definition_id
            and isinstance(extra.get("read"), int)
        ):
            out.append((int(snapshot), extra))
    return out


@dataclass(frozen=True)
class Snapshot:
    """One snapshot as the catalog keeps it: its commit time, the lake's schema version then, what it changed
    (`changes_made`) and its commit_extra_info."""

    id: int
    time: datetime
    version: int
    changes: str | None
    extra: str | None


def snapshots_since(lake: Lake, since: int | None, now: int) -> list[Snapshot]:
    """The snapshots after `since` up to `now` (all up to `now` when `since` is None; `now` always), oldest first,
    in one round trip to PostgreSQL: what a refresh reads of the catalog before it knows what to do (its snapshot's
    time and schema version, the refresh commits to recover, the changes to read), which took three catalog scans."""
    lo = 0 if since is None else min(int(since) + 1, int(now))
    text = (
        "SELECT s.snapshot_id, s.snapshot_time, s.schema_version, c.changes_made, c.commit_extra_info "
        "FROM public.ducklake_snapshot s LEFT JOIN public.ducklake_snapshot_changes c USING (snapshot_id) "
        f"WHERE s.snapshot_id BETWEEN {lo} AND {int(now)} ORDER BY s.snapshot_id"
    )
    rows = lake.con.execute(
        f"SELECT * FROM postgres_query({quote_literal(f'__ducklake_metadata_{lake.alias}')}, {quote_literal(text)})"
    ).fetchall()
    return [Snapshot(int(r[0]), r[1], int(r[2]), r[3], r[4]) for r in rows]


def columns_of(lake: Lake, name: str) -> list[tuple[str, str]]:
    """(column, DuckDB type) of lake table `schema.table` now, in order (names matched case-insensitively)."""
    schema, table = name.split(".")
    return [
        (r[0], r[1])
        for r in lake.con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? AND lower(schema_name) = ? "
            "AND lower(table_name) = ? ORDER BY column_index",
            [lake.alias, schema.lower(), table.lower()],
        ).fetchall()
    ]


def analyze(lake: Lake, query: exp.Expression, name: str, columns: list[str]) -> planner.Plan:
    """The plan of a dynamic table's query, with the types of its result (as table `name` has them, when it
    exists) and its sources' columns (a GROUP BY name that is a column means the column; a WITH clause is inlined
    with them)."""
    return planner.analyze(
        query, columns, lake.alias, types=dict(columns_of(lake, name)), schema=source_schema(lake, query)
    )


def source_schema(lake: Lake, query: exp.Expression) -> dict[str, dict[str, str]]:
    """Each lake table the query reads (`schema.table`) -> its columns and their DuckDB types, as they are now."""
    return {s: dict(columns_of(lake, s)) for s in planner.all_sources(query, lake.alias)}


def table_ids_at(lake: Lake, source: str, snapshots: tuple[int, int]) -> tuple[int | None, int | None]:
    """The catalog's id of table `source` at each of two snapshots (None: no such table then), in one query. A table
    dropped and created again under the same name has a new id, and its change feed knows nothing of the old one's
    rows."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    schema, table = source.split(".")
    at = f"""
        (SELECT t.table_id FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id)
         WHERE lower(s.schema_name) = $1 AND lower(t.table_name) = $2
           AND t.begin_snapshot <= {{n}} AND (t.end_snapshot IS NULL OR t.end_snapshot > {{n}})
           AND s.begin_snapshot <= {{n}} AND (s.end_snapshot IS NULL OR s.end_snapshot > {{n}}))"""
    a, b = (int(n) for n in snapshots)
    row = lake.con.execute(f"SELECT {at.format(n=a)}, {at.format(n=b)}", [schema.lower(), table.lower()]).fetchone()
    return (int(row[0]) if row[0] is not None else None, int(row[1]) if row[1] is not None else None)


def reflected(lake: Lake, d: Definition, commits: list[tuple[int, dict]] | None = None) -> int | None:
    """The snapshot of the sources the table reflects now: the later of the metadata's record and the lake's
    (`commits`: `lake_commits(lake, d, d.data_snapshot)` when the caller has read them already)."""
    if commits is None:
        commits = lake_commits(lake, d, d.data_snapshot)
    recorded = [s for s in (d.data_snapshot, commits[-1][1]["read"] if commits else None) if s is not None]
    return max(recorded) if recorded else None


def snapshot_time(lake: Lake, snapshot: int) -> datetime:
    return snapshot_at(lake, snapshot)[0]


def snapshot_at(lake: Lake, snapshot: int) -> tuple[datetime, int]:
    """The snapshot's commit time and the lake's schema version then (it changes with every CREATE, ALTER, DROP)."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    row = lake.con.execute(
        f"SELECT snapshot_time, schema_version FROM {meta}.ducklake_snapshot WHERE snapshot_id = ?", [snapshot]
    ).fetchone()
    return row[0], int(row[1])


def _positional(query: exp.Expression, names: list[str], alias: str = "__b") -> exp.Select:
    """The query's rows under the table's column names, by position (a union's branches name theirs as they like)."""
    columns = [exp.to_identifier(n, quoted=True) for n in names]
    return exp.select("*").from_(
        exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier(alias), columns=columns))
    )


@dataclass
class Delta:
    """The sources' net changes one refresh reads: per source the temporary tables of the rows it lost (`pre`) and
    gained (`post`) and how many of each, between snapshots `prev` and `now`."""

    pre: dict[str, str]
    post: dict[str, str]
    counts: dict[str, tuple[int, int]]
    prev: int
    now: int

    def terms(self, branch: planner.Plan, lake_alias: str, gained: bool, at: int | None = None) -> list[exp.Select]:
        """The branch's query once per occurrence of a changed source, that occurrence read from the lost
        (`gained` False) or gained rows; the other occurrences at `at`, or by the delta rule (earlier ones at
        `prev`, later ones at `now`) when `at` is None."""
        images = self.post if gained else self.pre
        out = []
        for o in branch.occurrences:
            if self.counts[o.source][1 if gained else 0]:
                bound = {o.index: planner.temp_table(images[o.source], o.ref)}
                before, after = (at, at) if at is not None else (self.prev, self.now)
                out.append(planner.term(branch.query, lake_alias, bound, before, after))
        return out


@dataclass
class Copy:
    """A small source's rows in temporary table `name`, right for every snapshot from the one it was made at up
    to `through`."""

    name: str
    through: int


@dataclass
class Work:
    """What one refresh decided and did."""

    mode: str
    reason: str
    inserted: int = 0
    deleted: int = 0


# the phases of one refresh, in the order they run (`Refresh.phases`, milliseconds each)
PHASES = ("lock", "bind", "catalog", "change_feed", "delta", "write", "commit", "history")


@dataclass
class Clock:
    """Where one refresh spent its time: milliseconds per phase (PHASES), summed when a phase runs twice."""

    ms: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - t0) * 1000

    def rounded(self) -> dict[str, float]:
        return {p: round(self.ms[p], 1) for p in PHASES if p in self.ms}


def adaptive(mode: str) -> bool:
    """Whether a table of this REFRESH_MODE chooses per refresh (ADAPTIVE; AUTO as tables made before it stored it)."""
    return mode not in (FULL, INCREMENTAL)


class Refresher:
    """Refreshes dynamic tables of one lake; `crossover`, `small_change`: see ADAPTIVE_CROSSOVER and
    ADAPTIVE_SMALL_CHANGE; `report`: where a batch of refreshes shows its progress (a bar of tables in a terminal)."""

    def __init__(
        self,
        lake: Lake,
        meta: Metadata,
        *,
        crossover: float = ADAPTIVE_CROSSOVER,
        small_change: int = ADAPTIVE_SMALL_CHANGE,
        report: Reporter | None = None,
    ):
        self.lake, self.meta, self.crossover, self.small_change = lake, meta, crossover, small_change
        self.report = report or Reporter()
        self.con = lake.con
        # where tests step in: right after the refresh read the lake's snapshot, and just before its COMMIT
        self.after_read: Callable[[int], None] | None = None
        self.before_commit: Callable[[], None] | None = None
        self.clock = Clock()  # the current refresh's phases
        self.terms = 0  # the delta terms the current refresh's inserts were read with (one per changed occurrence)
        self.copied = 0  # the unchanged sources its terms read from copies in memory (`_copies_for`)
        self._lock_conn: psycopg.Connection | None = None  # the session of the refreshes' advisory locks
        # columns_of and the parsed plans, by the lake's schema version: read again only after a schema change
        self._version = -1
        self._columns: dict[tuple[str, int], list[tuple[str, str]]] = {}
        self._ids: dict[tuple[str, int], int | None] = {}
        self._made: set[str] = set()  # the temporary tables made and not dropped yet
        # copies of small sources, by table id: kept after the refresh that made them commits (`_copies_for`)
        self._tag = uuid.uuid4().hex[:8]  # two Refreshers on one connection keep copies under different names
        self._copies: dict[int, Copy] = {}
        self._pending: dict[int, Copy] = {}  # made in the current refresh's transaction: gone if it rolls back
        self._too_big: set[int] = set()
        self._plans: dict[tuple[str, int], tuple[exp.Expression, planner.Plan]] = {}

    # ---- the lake side ---------------------------------------------------------------------------------------

    def _temp(self, name: str, query: str) -> int:
        """Temporary table `name` made from `query`; its rows (CREATE TABLE AS says how many it wrote)."""
        self._made.add(name)
        return int(self.con.execute(f"CREATE OR REPLACE TEMP TABLE {quote_ident(name)} AS {query}").fetchone()[0])

    def columns(self, name: str) -> list[tuple[str, str]]:
        """`columns_of(lake, name)`, read once per schema version of the lake (the refresh's transaction sees one)."""
        key = (name, self._version)
        if key not in self._columns:
            self._columns[key] = columns_of(self.lake, name)
        return self._columns[key]

    def _table_id(self, name: str, now: int) -> int | None:
        """The catalog's id of lake table `name` at snapshot `now`, read once per schema version of the lake (a table
        made or dropped changes the version)."""
        key = (name, self._version)
        if key not in self._ids:
            self._ids[key] = table_ids_at(self.lake, name, (now, now))[1]
        return self._ids[key]

    def _plan(self, d: Definition) -> tuple[exp.Expression, planner.Plan]:
        """The definition's query (its columns named as the table's) and plan, made once per schema version."""
        key = (d.definition_id, self._version)
        if key not in self._plans:
            query = parse_query(d)
            schema = {s: dict(self.columns(s)) for s in planner.all_sources(query, self.lake.alias)}
            types = dict(self.columns(d.name))
            plan = planner.analyze(query, d.columns, self.lake.alias, types=types, schema=schema)
            self._plans[key] = (named(query, d.columns), plan)
        return self._plans[key]

    # ---- small unchanged sources kept in memory ---------------------------------------------------------------

    def _copies_seen(self, changed: feed.Changed, prev: int, now: int) -> None:
        """What snapshots prev+1..now did to the kept copies: one whose table changed goes; one known right up to
        `prev` or later is right up to `now` too (its table did not change in between); one whose validity ends
        before `prev` goes too (what happened in between is not known here)."""
        for table_id, copy in list(self._copies.items()):
            if changed.of(table_id) != feed.NONE or copy.through < prev:
                self._drop_copy(table_id)
            else:
                copy.through = max(copy.through, now)

    def _drop_copy(self, table_id: int) -> None:
        copy = self._copies.pop(table_id)
        self._drop_temps([copy.name])

    def _copies_for(
        self, plan: planner.Plan, select: exp.Select, counts: dict[str, tuple[int, int]], ids: dict, now: int
    ) -> dict[int, exp.Table]:
        """The occurrences of sources that did not change in this refresh's span, each read from a copy of its table
        in memory (made now, or kept from an earlier refresh and still right at `now`) instead of from the lake: a
        small dimension joined in every delta term costs its catalog reads and its files otherwise. Only tables of
        at most COPY_ROWS rows, and only when the query names none of its columns the copy would not have."""
        out: dict[int, exp.Table] = {}
        for o in plan.occurrences:
            table_id = ids.get(o.source)
            if any(counts[o.source]) or table_id is None or table_id in self._too_big:
                continue
            copy = self._copies.get(table_id) or self._pending.get(table_id)
            if copy is None or copy.through < now:
                if not self._copyable(o.source, select, plan):
                    continue
                copy = self._make_copy(o.source, table_id, now)
                if copy is None:
                    continue
            out[o.index] = planner.temp_table(copy.name, o.ref)
        self.copied = len(out)
        return out

    def _copyable(self, source: str, select: exp.Select, plan: planner.Plan) -> bool:
        """Whether every column the query names through this source's names is one of its columns (a virtual
        column such as rowid would mean something else in a copy)."""
        refs = {o.ref for o in plan.occurrences if o.source == source}
        every = {c.lower() for c, _ in self.columns(source)}
        return all(c.name.lower() in every for c in select.find_all(exp.Column) if c.table.lower() in refs)

    def _make_copy(self, source: str, table_id: int, now: int) -> Copy | None:
        name = f"__dt_copy_{self._tag}_{table_id}"
        schema, table = source.split(".")
        pinned = f"{quote_ident(self.lake.alias)}.{quote_ident(schema)}.{quote_ident(table)} AT (VERSION => {now})"
        rows = self._temp(name, f"SELECT * FROM {pinned} LIMIT {COPY_ROWS + 1}")
        if rows > COPY_ROWS:
            self._drop_temps([name])
            self._too_big.add(table_id)
            return None
        copy = self._pending[table_id] = Copy(name, now)
        return copy

    def _drop_temps(self, names: list[str]) -> None:
        """Drop those of temporary tables `names` this Refresher made (a name never made costs no statement)."""
        for n in names:
            if n in self._made:
                self.con.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(n)}")
                self._made.discard(n)

    def _changes(
        self, source: str, start: int, end: int, pre: str, post: str, columns: list[str], how: str = feed.ANY
    ) -> tuple[int, int]:
        """The source's net change in snapshots start..end, as its `columns`: the rows it lost into temporary table
        `pre`, the rows it gained into `post`; how many of each. A row deleted and inserted again unchanged (a
        dimension table rewritten whole, an UPDATE that set a column to its own value or changed only columns the
        query does not read) is in neither: as a multiset, the table's change is post minus pre, and equal rows
        cancel. The feed is read once; when it holds only inserts (or only deletes) it becomes that table as it is.
        `how` (`feed.changed`): NONE reads nothing, INSERTS reads the insertions alone (a fraction of the feed's cost)."""
        if how == feed.NONE:
            return 0, 0
        cols = ", ".join(quote_ident(c) for c in columns)
        if how == feed.INSERTS:
            schema, table = source.split(".")
            args = f"{quote_literal(self.lake.alias)}, {quote_literal(schema)}, {quote_literal(table)}, {start}, {end}"
            return 0, self._temp(post, f"SELECT {cols} FROM ducklake_table_insertions({args})")
        feed_table = f"{pre}_feed"
        self._temp(
            feed_table, f"SELECT {cols}, change_type AS __change FROM {changes_sql(self.lake, source, start, end)}"
        )
        qfeed = f"temp.main.{quote_ident(feed_table)}"
        kinds = dict(
            self.con.execute(
                f"SELECT __change IN ({', '.join(map(quote_literal, PRE))}), count(*) FROM {qfeed} GROUP BY ALL"
            ).fetchall()
        )
        lost, gained = int(kinds.get(True, 0)), int(kinds.get(False, 0))
        if not lost or not gained:  # one side only: nothing to net, and no copy (dropping a column is ~1 ms)
            self.con.execute(f"ALTER TABLE {qfeed} DROP COLUMN __change")
            kept = post if gained else pre  # the other side is empty: no table (every reader asks the counts)
            self._made.add(kept)
            self._drop_temps([kept])  # a name a refresh that died in this process may have left
            self.con.execute(f"ALTER TABLE {qfeed} RENAME TO {quote_ident(kept)}")
            self._made.discard(feed_table)
            self._made.add(kept)
            return lost, gained
        try:
            lost_sql = f"SELECT {cols} FROM {qfeed} WHERE __change IN ({', '.join(map(quote_literal, PRE))})"
            gained_sql = f"SELECT {cols} FROM {qfeed} WHERE __change IN ({', '.join(map(quote_literal, POST))})"
            return (
                self._temp(pre, f"{lost_sql} EXCEPT ALL {gained_sql}"),
                self._temp(post, f"{gained_sql} EXCEPT ALL {lost_sql}"),
            )
        finally:
            self._drop_temps([feed_table])

    def _read_columns(self, source: str, select: exp.Select, plan: planner.Plan) -> list[str]:
        """The source's columns the query reads: those it names (unqualified, or qualified by one of the source's
        names in the query). All of them whenever that cannot be told for sure: a `*` or COLUMNS(...) (COUNT(*)
        aside), a USING join, a table's name used as a value (the whole row as a struct), a dotted name whose
        qualifier is no table of the query (a struct's field). The change feed is asked for these only."""
        every = [c for c, _ in self.columns(source)]
        refs = {o.ref for o in plan.occurrences if o.source == source}
        all_refs = {o.ref for o in plan.occurrences}
        for node in select.walk():
            if (isinstance(node, exp.Star) and not isinstance(node.parent, exp.Count)) or isinstance(node, exp.Columns):
                return every
            if isinstance(node, exp.Join) and node.args.get("using"):
                return every
            if isinstance(node, exp.Column) and (
                (node.table and node.table.lower() not in all_refs)
                or (not node.table and node.name.lower() in all_refs)
            ):
                return every
        named = {c.name.lower() for c in select.find_all(exp.Column) if not c.table or c.table.lower() in refs}
        return [c for c in every if c.lower() in named] or every

    def sources_changed(self, sources: list[str], start: int, end: int) -> bool:
        """Whether any source has a change in snapshots start..end (a feed that cannot be read counts as one)."""
        for s in sources:
            try:
                if self.con.execute(f"SELECT 1 FROM {changes_sql(self.lake, s, start, end)} LIMIT 1").fetchone():
                    return True
            except duckdb.Error:
                self._restart()
                return True
        return False

    @contextmanager
    def _locked(self, key: int, busy: KitError) -> Iterator[None]:
        """Advisory lock `key` for the block, on a session this Refresher keeps (a new connection per refresh costs
        a few milliseconds): released at the end, or with the session when the release fails (the connection is
        dropped and made again next time). Two Refreshers have two sessions, so they exclude each other."""
        if self._lock_conn is None or self._lock_conn.closed:
            self._lock_conn = postgres.connect(self.lake.endpoints.pg, timeout=10)
            self._lock_conn.execute(f"SET lock_timeout = '{int(LOCK_WAIT_S)}s'")
        conn = self._lock_conn
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [key])
        except psycopg.errors.LockNotAvailable:
            raise busy from None
        except psycopg.Error:
            self.close()
            raise
        try:
            yield
        finally:
            try:
                conn.execute("SELECT pg_advisory_unlock(%s)", [key])
            except psycopg.Error:
                self.close()  # the session ends: its locks go with it

    def close(self) -> None:
        """Ends the session that holds the refreshes' locks (none is held between refreshes) and drops the copies."""
        for table_id in list(self._copies):
            try:
                self._drop_copy(table_id)
            except duckdb.Error:  # the lake's connection is closed already: the copies went with it
                self._copies.clear()
                break
        if self._lock_conn is not None:
            self._lock_conn.close()
            self._lock_conn = None

    def __enter__(self) -> Refresher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _restart(self) -> None:
        """After a failed statement inside the refresh's transaction (which DuckDB then aborts), a new one: whatever
        comes next reads AT (VERSION => n) the snapshot the refresh chose, so the new transaction's own does not
        matter. Outside a transaction, nothing to do."""
        if self.lake.in_transaction:
            self.lake.rollback()
            self._forget_pending()
            self.lake.begin()

    def _forget_pending(self) -> None:
        """The copies made in a transaction that rolled back went with it."""
        for copy in self._pending.values():
            self._made.discard(copy.name)
        self._pending.clear()

    def _full(self, query: exp.Expression, snapshot: int, reason: str) -> tuple[Work, list]:
        new = sql(planner.pinned(query, self.lake.alias, snapshot))
        return Work(FULL, reason), [("delete_all", None), ("insert", new)]

    def decide(
        self,
        d: Definition,
        query: exp.Expression,
        plan: planner.Plan,
        span: tuple[int | None, int],
        temps: list[str],
        changed: feed.Changed | None = None,
    ) -> tuple[Work, list] | None:
        """The refresh's mode and the statements it needs (None: nothing to do) for snapshots `span` (prev, now];
        `changed`: `feed.changed` of them, when the caller has read it."""
        prev, now = span
        if prev is None:
            return self._full(query, now, "INITIAL: the first refresh")
        if changed is not None and changed.rows_only:  # no table made, dropped or altered since: same ids at both
            ids, replaced = {s: self._table_id(s, now) for s in plan.sources}, []
        else:
            both = {s: table_ids_at(self.lake, s, (prev, now)) for s in plan.sources}
            ids = {s: at_now for s, (_, at_now) in both.items()}
            replaced = [s for s, (at_prev, at_now) in both.items() if at_prev != at_now]
        if replaced:  # dropped and created again: its change feed knows nothing of the old table's rows
            return self._full(
                query, now, f"SOURCE_REPLACED: {', '.join(replaced)} is not the table it was at snapshot {prev}"
            )
        if changed is None:
            with self.clock.phase("change_feed"):
                changed = feed.changed(self.lake, prev + 1, now)
        if d.refresh_mode == FULL or not plan.incremental:
            untouched = all(changed.of(ids[s]) == feed.NONE for s in plan.sources)
            if untouched or not self.sources_changed(plan.sources, prev + 1, now):
                return None
            why = "REFRESH_MODE = FULL" if d.refresh_mode == FULL else plan.explain()
            return self._full(query, now, why)
        note = None
        if adaptive(d.refresh_mode):  # the choice, made from the catalog before any change feed is read
            tables = [i for i in ids.values() if i is not None]
            inlined = changed.inlined_changes(tables) * feed.INLINED_ROWS
            if changed.inlined_only(tables) and inlined <= self.small_change:  # no file changed: no need to count
                note = f"ADAPTIVE chose incremental: the change (~{inlined:,} rows, inlined) is at most "
                note += f"{self.small_change:,} rows"
            else:
                with self.clock.phase("change_feed"):
                    est = feed.size(self.lake, tables, prev + 1, now, changed.inlined_changes(tables))
                how = f"the change (~{est.changed:,} rows) is {est.share:.2%} of the sources' {est.rows:,} rows" + (
                    " in data files" if est.rows < est.changed else ""
                )
                if est.share > self.crossover and est.changed > self.small_change:
                    return self._full(query, now, f"ADAPTIVE chose full: {how}, over {self.crossover:.0%}")
                small = f" or at most {self.small_change:,} rows" if est.share > self.crossover else ""
                note = f"ADAPTIVE chose incremental: {how}, at most {self.crossover:.0%}{small}"
        decided = self._incremental(d, query, plan, (prev, now), changed, ids, temps)
        if decided is not None and note is not None:
            decided[0].reason = f"{decided[0].reason} ({note})"
        return decided

    def _incremental(
        self,
        d: Definition,
        query: exp.Expression,
        plan: planner.Plan,
        span: tuple[int, int],
        changed: feed.Changed,
        ids: dict[str, int | None],
        temps: list[str],
    ) -> tuple[Work, list] | None:
        """The incremental refresh of snapshots `span` (prev, now]: the sources' net changes read (only those of
        sources `changed` shows changed), then the shape's own way to the rows to delete and insert."""
        prev, now = span
        select = named(plan.query, d.columns) if plan.query is not None else query  # CTEs inlined
        if d.immutable_where and isinstance(select, exp.Select):  # the immutable region is neither read nor written
            select = planner.mutable_only(select, d.immutable_where, plan)
        pre: dict[str, str] = {}
        post: dict[str, str] = {}
        counts: dict[str, tuple[int, int]] = {}
        try:
            for j, source in enumerate(plan.sources):
                pre[source], post[source] = f"__dt_pre_{j}", f"__dt_post_{j}"
                temps += [pre[source], post[source]]
                with self.clock.phase("change_feed"):
                    counts[source] = self._changes(
                        source,
                        prev + 1,
                        now,
                        pre[source],
                        post[source],
                        self._read_columns(source, select, plan),
                        changed.of(ids[source]),
                    )
        except duckdb.Error as exc:
            self._restart()
            if d.refresh_mode == INCREMENTAL:
                raise KitError(
                    f"the change feed of {d.name}'s sources cannot be read ({first_line(exc)})",
                    "re-create it with REFRESH_MODE = ADAPTIVE or FULL (CREATE OR REPLACE DYNAMIC TABLE ...)",
                ) from None
            return self._full(query, now, f"CHANGE_FEED_UNREADABLE: {first_line(exc)}")
        if not any(a or b for a, b in counts.values()):
            return None
        if multiplicity.counted(plan, d):
            return self._counted(d, query, plan, Delta(pre, post, counts, prev, now), temps)
        if plan.kind == planner.UNION:
            return self._union(d, query, plan, Delta(pre, post, counts, prev, now), temps)
        insert_only = not any(a for a, _ in counts.values())

        same = self._copies_for(plan, select, counts, ids, now)

        def terms(images: dict[str, str], before: int, after: int) -> list[exp.Select]:
            out = []
            for o in plan.occurrences:
                if counts[o.source][0 if images is pre else 1]:
                    bound = {o.index: planner.temp_table(images[o.source], o.ref)}
                    out.append(planner.term(select, self.lake.alias, bound, before, after, same))
            return out

        if plan.kind == planner.ROWS and insert_only and not plan.outer and not plan.derived:
            gained = terms(post, prev, now)
            self.terms = len(gained)
            new = " UNION ALL ".join(sql(t) for t in gained)
            return Work(INCREMENTAL, "inserts appended"), [("insert", new)]
        if plan.kind == planner.AGGREGATE and insert_only and plan.merge is not None and not d.immutable_where:
            gained = terms(post, prev, now)
            self.terms = len(gained)
            return self._merge(d, plan, gained, temps)
        # affected keys: pre-images against the old snapshot, post-images against the new one
        keys = plan.keys if plan.keyed else [planner.Key(c, exp.column(c, "__q", quoted=True)) for c in plan.columns]
        if plan.derived:  # the query over the derived rows a change touches, as they were and are
            touched = self._derived_rows(select, plan, Delta(pre, post, counts, prev, now), temps)
        elif plan.outer:  # the result rows of the kept tables' rows a change reaches, as they were and are
            touched = self._outer_rows(select, plan, Delta(pre, post, counts, prev, now), temps)
            if not touched:
                return None
        else:
            touched = terms(pre, prev, prev) + terms(post, now, now)
        if plan.keyed:
            affected_sql = " UNION ".join(sql(planner.key_select(t, keys)) for t in touched)
        else:  # the affected rows, compared whole: their columns become the keys __k0, __k1, ...
            union = " UNION ".join(sql(p) for p in touched)
            renamed = ", ".join(f"{quote_ident(k.column)} AS {planner.key_column(i)}" for i, k in enumerate(keys))
            affected_sql = f"SELECT DISTINCT {renamed} FROM ({union}) AS __a"
        affected = self._temp("__dt_keys", affected_sql)
        temps.append("__dt_keys")
        what = {planner.AGGREGATE: "groups", planner.WINDOW: "partitions"}.get(plan.kind, "distinct rows")
        if plan.keyed:
            new = sql(planner.restricted(planner.pinned(select, self.lake.alias, now), keys, "__dt_keys"))
        else:
            inner = planner.pinned(select, self.lake.alias, now).subquery("__q")
            new = sql(planner.restricted(exp.select("*").from_(inner), keys, "__dt_keys"))
        statements = [
            ("delete_keys", ("__dt_keys", [(k.column, planner.key_column(i)) for i, k in enumerate(keys)])),
            ("insert", new),
        ]
        return Work(INCREMENTAL, f"{affected} affected {what} recomputed"), statements

    def _outer_rows(self, select: exp.Select, plan: planner.Plan, delta: Delta, temps: list[str]) -> list:
        """Over LEFT JOINs and semi/anti joins every result row belongs to one row of the first table (never
        padded): the rows of that table a change reaches (its own lost and gained rows; the rows joined to another
        table's changed rows, or correlated with a subquery's changed rows, read as they were for lost rows and as
        they are for gained ones) go to temporary table `__dt_outer0` (as the columns the query reads); the query
        with its first table read from there, at both snapshots, gives every result row that went or came,
        NULL-padded ones included. A FULL JOIN of two tables does the same from both sides: the second table's
        reached rows go to `__dt_outer1`, read through the query made a RIGHT JOIN (the first side's through a
        LEFT one), so the rows padded on either side are found from the row that is kept."""
        sides = [0, 1] if plan.two_sided else [0]
        out = []
        for side in sides:
            occ = plan.occurrences[side]
            columns = self._read_columns(occ.source, select, plan)
            projected = [exp.column(c, occ.ref, quoted=True) for c in columns]
            parts = []
            parts += [
                f"SELECT {', '.join(quote_ident(c) for c in columns)} FROM temp.main.{quote_ident(t[occ.source])}"
                for t, n in zip((delta.pre, delta.post), delta.counts[occ.source])
                if n
            ]
            for o in plan.occurrences:
                if o.index == side:
                    continue
                for images, kind, at in ((delta.pre, 0, delta.prev), (delta.post, 1, delta.now)):
                    if delta.counts[o.source][kind]:
                        bound = (o.index, planner.temp_table(images[o.source], o.ref))
                        parts.append(sql(planner.preserved_rows(select, self.lake.alias, bound, at, projected)))
            for j, c in enumerate(plan.semi):
                sub = planner.semi_subquery(c)
                [t] = planner._from_tables(sub)
                source = planner.source_name(t, self.lake.alias)
                for images, kind, at in ((delta.pre, 0, delta.prev), (delta.post, 1, delta.now)):
                    if delta.counts[source][kind]:
                        bound = planner.temp_table(images[source], t.alias_or_name)
                        parts.append(sql(planner.reached_by_subquery(select, self.lake.alias, j, bound, at, projected)))
            name = f"__dt_outer{side}"
            temps.append(name)
            if not parts:
                continue
            self._temp(name, " UNION ".join(parts))
            query = planner.one_sided(select, "RIGHT" if side else "LEFT") if plan.two_sided else select
            reached = {side: planner.temp_table(name, occ.ref)}
            out += [planner.term(query, self.lake.alias, reached, at, at) for at in (delta.prev, delta.now)]
        return out

    def _derived_rows(self, select: exp.Select, plan: planner.Plan, delta: Delta, temps: list[str]) -> list:
        """A query over one derived table: that table's rows a change touches, as they were (at the old snapshot, from
        the rows lost) and as they are (at the new one, from the rows gained), each branch of its UNION ALL on its
        own: a rows branch's changed rows (its delta terms), an aggregate branch's affected groups (read whole at
        that snapshot), nothing from an unchanged branch. The query read over each gives the result rows (or
        groups) that may have changed."""
        alias, out = self.lake.alias, []
        keys: dict[int, str] = {}
        for j, b in enumerate(plan.branches):
            if b.kind == planner.AGGREGATE and any(any(delta.counts[o.source]) for o in b.occurrences):
                keys[j] = f"__dt_dkeys{j}"
                temps.append(keys[j])
                lost_and_gained = delta.terms(b, alias, False, at=delta.prev) + delta.terms(
                    b, alias, True, at=delta.now
                )
                self._temp(keys[j], " UNION ".join(sql(planner.key_select(t, b.keys)) for t in lost_and_gained))
        for at, gained in ((delta.prev, False), (delta.now, True)):
            q = select.copy()
            for j, (node, b) in enumerate(zip(planner.derived_branches(q), plan.branches)):
                if j in keys:
                    new = planner.restricted(planner.pinned(b.query, alias, at), b.keys, keys[j])
                elif b.kind == planner.ROWS and (terms := delta.terms(b, alias, gained, at=at)):
                    union = " UNION ALL ".join(sql(t) for t in terms)
                    new = sqlglot.parse_one(f"SELECT * FROM ({union}) AS __t{j}", read=DIALECT)
                else:  # no change in this branch (on this side)
                    new = planner.pinned(b.query, alias, at).where("FALSE")
                node.replace(new)
            out.append(q)
        return out

    def _union(
        self, d: Definition, query: exp.Expression, plan: planner.Plan, delta: Delta, temps: list[str]
    ) -> tuple[Work, list]:
        """A UNION [ALL] (or SELECT DISTINCT), branch by branch: only branches whose sources changed give terms.
        Inserts into rows branches are appended (or, for a distinct result, added where not there yet); otherwise
        the affected rows, compared whole, are deleted and read again from the whole query, so every copy of such a
        row is counted afresh over all branches."""
        alias, names, tgt = self.lake.alias, plan.columns, target(self.lake, d.name)
        changed = [b for b in plan.branches if any(any(delta.counts[o.source]) for o in b.occurrences)]
        of = f"{len(changed)} of {len(plan.branches)} branch{'es' if len(plan.branches) > 1 else ''} changed"
        insert_only = not any(a for a, _ in delta.counts.values())
        if insert_only and all(b.kind == planner.ROWS and (plan.distinct or not b.distinct) for b in changed):
            new = " UNION ALL ".join(sql(_positional(t, names)) for b in changed for t in delta.terms(b, alias, True))
            if plan.distinct:  # EXCEPT is a set difference: each new row once, and none the table has already
                new = f"SELECT * FROM ({new}) AS __n EXCEPT SELECT * FROM {tgt}"
                return Work(INCREMENTAL, f"inserts added where new ({of})"), [("insert", new)]
            return Work(INCREMENTAL, f"inserts appended ({of})"), [("insert", new)]
        parts: list[exp.Select] = []
        for j, b in enumerate(changed):
            before = delta.terms(b, alias, False, at=delta.prev) + delta.terms(b, alias, True, at=delta.now)
            if b.kind == planner.ROWS:  # its rows that went and came, as they were and are
                parts += [_positional(t, names) for t in before]
                continue
            keys_table = f"__dt_keys_b{j}"  # its affected groups' rows, as they were and are
            temps.append(keys_table)
            self._temp(keys_table, " UNION ".join(sql(planner.key_select(t, b.keys)) for t in before))
            for snapshot in (delta.prev, delta.now):
                grouped = planner.restricted(planner.pinned(b.query, alias, snapshot), b.keys, keys_table)
                parts.append(_positional(grouped, names))
        renamed = ", ".join(f"{quote_ident(c)} AS {planner.key_column(i)}" for i, c in enumerate(names))
        union = " UNION ".join(sql(p) for p in parts)
        affected = self._temp("__dt_keys", f"SELECT DISTINCT {renamed} FROM ({union}) AS __a")
        temps.append("__dt_keys")
        keys = [planner.Key(c, exp.column(c, "__q", quoted=True)) for c in names]
        whole = _positional(planner.pinned(plan.query, alias, delta.now), names, "__q").args["from_"].this
        new = sql(planner.restricted(exp.select("*").from_(whole), keys, "__dt_keys"))
        statements = [("delete_keys", ("__dt_keys", [(c, planner.key_column(i)) for i, c in enumerate(names)]))]
        return Work(INCREMENTAL, f"{affected} affected distinct rows recomputed ({of})"), [*statements, ("insert", new)]

    def _counted(
        self, d: Definition, query: exp.Expression, plan: planner.Plan, delta: Delta, temps: list[str]
    ) -> tuple[Work, list] | None:
        """A UNION or SELECT DISTINCT through its multiplicity counts (see `counts`): the change of each row's count
        from the changed branches' delta terms, added to the side table's counts; rows whose count left 0 are
        added, rows whose count went back to 0 deleted. The side table is built first when missing, at the
        snapshot the table reflects."""
        alias, names = self.lake.alias, plan.columns
        side = multiplicity.side_table(alias, d)
        branches = multiplicity.branches_all(plan)
        changed = [b for b in branches if any(any(delta.counts[o.source]) for o in b.occurrences)]
        of = f"{len(changed)} of {len(branches)} branch{'es' if len(branches) > 1 else ''} changed"
        cols = ", ".join(quote_ident(c) for c in names)
        built = ""
        if not table_exists(self.con, alias, multiplicity.SCHEMA, multiplicity.side_name(d)):
            self.con.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(alias)}.{quote_ident(multiplicity.SCHEMA)}")
            every = " UNION ALL ".join(
                sql(_positional(planner.pinned(b.query, alias, delta.prev), names)) for b in branches
            )
            self.con.execute(
                f"CREATE TABLE {side} AS SELECT {cols}, count(*) AS {multiplicity.COUNT} FROM ({every}) AS __a GROUP BY ALL"
            )
            built = f"; the counts built at snapshot {delta.prev}"
        signed = [
            f"SELECT *, {sign} AS __dt_d FROM ({sql(_positional(t, names))}) AS __s"
            for gained, sign in ((True, 1), (False, -1))
            for b in changed
            for t in delta.terms(b, alias, gained)
        ]
        rows = self._temp(
            "__dt_mult",
            f"SELECT {cols}, sum(__dt_d) AS __dt_d FROM ({' UNION ALL '.join(signed)}) AS __x GROUP BY ALL "
            "HAVING sum(__dt_d) <> 0",
        )
        temps.append("__dt_mult")
        if not rows:  # the copies that came and went cancel out
            return None
        dcols = ", ".join(f"__d.{quote_ident(c)}" for c in names)
        old = f"coalesce(__o.{multiplicity.COUNT}, 0)"
        self._temp(
            "__dt_counts",
            f"SELECT {dcols}, {old} AS __dt_old, {old} + __d.__dt_d AS __dt_new FROM temp.main.__dt_mult AS __d "
            f"LEFT JOIN {side} AS __o ON {multiplicity.matched('__d', '__o', names)}",
        )
        temps.append("__dt_counts")
        below, added, gone = self.con.execute(
            "SELECT count(*) FILTER (__dt_new < 0), count(*) FILTER (__dt_old = 0 AND __dt_new > 0), "
            "count(*) FILTER (__dt_old > 0 AND __dt_new = 0) FROM temp.main.__dt_counts"
        ).fetchone()
        if below:  # more copies lost than the counts had: they are wrong, so the table is made again in full
            return self._full(query, delta.now, f"MULTIPLICITY_BELOW_ZERO: {below} rows' counts went below 0")
        statements: list = [
            (
                "side",
                f"DELETE FROM {side} USING temp.main.__dt_counts AS __k WHERE {multiplicity.matched(side, '__k', names)}",
            ),
            ("side", f"INSERT INTO {side} SELECT {cols}, __dt_new FROM temp.main.__dt_counts WHERE __dt_new > 0"),
        ]
        if gone:
            self._temp("__dt_gone", f"SELECT {cols} FROM temp.main.__dt_counts WHERE __dt_old > 0 AND __dt_new = 0")
            temps.append("__dt_gone")
            statements.append(("delete_keys", ("__dt_gone", [(c, c) for c in names])))
        if added:
            statements.append(
                ("insert", f"SELECT {cols} FROM temp.main.__dt_counts WHERE __dt_old = 0 AND __dt_new > 0")
            )
        reason = f"multiplicity counts: {rows} rows' counts changed, {added} rows added, {gone} removed ({of}{built})"
        return Work(INCREMENTAL, reason), statements

    def _merge(self, d: Definition, plan: planner.Plan, terms: list[exp.Select], temps: list[str]) -> tuple[Work, list]:
        """Insert-only changes to a SUM/COUNT/MIN/MAX aggregate: each touched group's new value from its old row
        and the aggregates of the new rows alone."""
        keys = [quote_ident(k.column) for k in plan.keys]
        combine = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
        cols = ", ".join(
            keys + [f"{combine[m.function]}({quote_ident(m.column)}) AS {quote_ident(m.column)}" for m in plan.merge]
        )
        union = " UNION ALL ".join(sql(t) for t in terms)
        on = " AND ".join(f"__d.{k} IS NOT DISTINCT FROM __o.{k}" for k in keys) or "TRUE"
        merged = {
            "sum": "CASE WHEN __o.{c} IS NULL THEN __d.{c} WHEN __d.{c} IS NULL THEN __o.{c} "
            "ELSE __o.{c} + __d.{c} END",
            "count": "coalesce(__o.{c}, 0) + __d.{c}",
            "min": "least(__o.{c}, __d.{c})",
            "max": "greatest(__o.{c}, __d.{c})",
        }
        how = {m.column: merged[m.function] for m in plan.merge}
        select = ", ".join(
            f"{how[c].format(c=quote_ident(c)) if c in how else f'__d.{quote_ident(c)}'} AS {quote_ident(c)}"
            for c in plan.columns
        )
        # the new rows' aggregates and each touched group's old row, in one statement (one temporary table)
        new = (
            f"SELECT {select} FROM (SELECT {cols} FROM ({union}) AS __n GROUP BY ALL) AS __d "
            f"LEFT JOIN {target(self.lake, d.name)} AS __o ON {on}"
        )
        groups = self._temp("__dt_merged", new)
        temps.append("__dt_merged")
        return (
            Work(INCREMENTAL, f"inserts merged into {groups} groups"),
            [
                ("delete_keys", ("__dt_merged", [(k.column, k.column) for k in plan.keys])),
                ("insert", "SELECT * FROM temp.main.__dt_merged"),
            ],
        )

    def apply(self, d: Definition, work: Work, statements: list, read: int, trigger: str = "manual") -> int | None:
        """The deletes and inserts in one lake transaction; the snapshot it made."""
        tgt = target(self.lake, d.name)
        # IMMUTABLE WHERE: the rows matching it are neither deleted nor added (the first refresh fills them all)
        frozen = d.immutable_where if d.immutable_where and not work.reason.startswith("INITIAL") else None
        mutable = f" AND ({_qualified(frozen, self.lake.alias, d.name)}) IS NOT TRUE" if frozen else ""

        def run(con: duckdb.DuckDBPyConnection) -> None:
            with self.clock.phase("write"):
                write(con)

        def write(con: duckdb.DuckDBPyConnection) -> None:
            for kind, arg in statements:
                if kind == "side":  # the side table of multiplicity counts: not the table's rows
                    con.execute(arg)
                    continue
                if kind == "delete_all":
                    text = f"DELETE FROM {tgt} WHERE TRUE{mutable}"
                elif kind == "delete_keys":  # (temporary table, [(table column, its key column)])
                    table, cols = arg
                    on = (
                        " AND ".join(
                            f"{tgt}.{quote_ident(c)} IS NOT DISTINCT FROM __k.{quote_ident(k)}" for c, k in cols
                        )
                        or "TRUE"
                    )
                    text = f"DELETE FROM {tgt} USING temp.main.{quote_ident(table)} AS __k WHERE {on}{mutable}"
                elif frozen:
                    text = f"INSERT INTO {tgt} SELECT * FROM ({arg}) AS __i WHERE ({frozen}) IS NOT TRUE"
                else:
                    text = f"INSERT INTO {tgt} {arg}"
                count = int(con.execute(text).fetchone()[0])
                if kind == "insert":
                    work.inserted += count
                else:
                    work.deleted += count

        extra = {"dynamic_table": d.name, "definition": d.definition_id, "read": read, "mode": work.mode}
        message = f"dynamic table {d.name}: {work.mode.lower()} refresh"
        if not self.lake.in_transaction:  # a caller's own use, outside `refresh`
            return commit_with(
                self.lake, run, message, before_commit=self.before_commit, extra={**extra, "trigger": trigger}
            ).snapshot_id
        # inside the refresh's transaction (`refresh`): what commit_with does, without its BEGIN
        run(self.con)
        if self.before_commit is not None:
            self.before_commit()
        token = uuid.uuid4().hex
        info = json.dumps({"commit": token, **extra, "trigger": trigger})
        self.con.execute(
            "CALL ducklake_set_commit_message(?, ?, ?, extra_info => ?)", [self.lake.alias, AUTHOR, message, info]
        )
        self.lake.commit()  # through the lake's commit gate
        # the snapshot that carries this commit's extra info: one catalog query (after the snapshot it read)
        meta = quote_ident(f"__ducklake_metadata_{self.lake.alias}")
        row = self.con.execute(
            f"SELECT max(snapshot_id) FROM {meta}.ducklake_snapshot_changes WHERE snapshot_id > ? "
            "AND commit_extra_info = ?",
            [read, info],
        ).fetchone()
        return int(row[0]) if row and row[0] is not None else snapshot_of_token(self.lake, token)

    def recover(self, d: Definition, sources: list[str], commits: list[tuple[int, dict]]) -> list[Refresh]:
        """Record the refreshes that landed in the lake but not in the history (the process died, or PostgreSQL
        failed, between the commit and its record): SUCCEEDED, with what their commit says (what they read, their
        mode and trigger when the commit names them) and the rows the target's change feed shows at that snapshot.
        Run under the table's lock, before the next refresh; `commits`: `lake_commits(lake, d, d.data_snapshot)`."""
        if not commits:
            return []
        known = self.meta.commit_snapshots(d.name, d.definition_id, commits[0][0])
        out = []
        for commit, extra in commits:
            if commit in known:
                continue
            at = snapshot_time(self.lake, commit)
            r = Refresh(
                d.name,
                d.definition_id,
                extra.get("trigger") or "unknown",
                SUCCEEDED,
                at,
                at,
                mode=extra.get("mode"),
                snapshots_read=dict.fromkeys(sources, extra["read"]),
                read_snapshot=extra["read"],
                commit_snapshot=commit,
                data_timestamp=snapshot_time(self.lake, extra["read"]),
                reason=f"RECOVERED: landed in the lake at snapshot {commit}, its history row was lost; "
                "recorded by the next refresh",
            )
            try:
                counts = change_counts(self.lake, d.name, commit, commit)
                r.rows_inserted, r.rows_deleted = counts.get("insert", 0), counts.get("delete", 0)
            except duckdb.Error:  # the snapshot expired: the counts are unknown, not zero
                self._restart()
            out.append(self.meta.record(r))
        return out

    def _bind(self, d: Definition, query: exp.Expression, now: int) -> None:
        """The query still binds at `now`, with the table's columns: a source's schema may have changed without any
        row changing (a renamed or dropped column), and the change feed alone would not say so."""
        try:
            described = self.con.execute(f"DESCRIBE {sql(planner.pinned(query, self.lake.alias, now))}").fetchall()
        except duckdb.Error as exc:
            raise KitError(
                f"the query of {d.name} fails at snapshot {now}: {first_line(exc)}",
                "fix the sources, or re-create it (CREATE OR REPLACE DYNAMIC TABLE ...)",
            ) from None
        columns = [r[0] for r in described]
        if columns != d.columns:
            raise KitError(
                f"the query of {d.name} now gives the columns {', '.join(columns)}, not {', '.join(d.columns)}",
                "re-create it (CREATE OR REPLACE DYNAMIC TABLE ...)",
            )

    # ---- one refresh, recorded ------------------------------------------------------------------------------

    def refresh(self, d: Definition, trigger: str = "manual") -> Refresh:
        """Refresh `d` once and record the outcome (FAILED ones too: the error is in the returned Refresh)."""
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        out = Refresh(d.name, d.definition_id, trigger, FAILED, started, started)
        temps: list[str] = []
        clock = self.clock = Clock()
        self.terms = self.copied = 0
        try:
            busy = KitError(
                f"dynamic table {d.name} is being refreshed by another process for over {LOCK_WAIT_S} s",
                "wait for it, or stop the other `dynamic run`",
            )
            with ExitStack() as held:
                with clock.phase("lock"):
                    held.enter_context(self._locked(lock_key(d.name), busy))
                # one DuckLake transaction for the whole refresh, reads and writes: the lake's snapshot and catalog
                # are read once (each statement outside a transaction asks PostgreSQL for the latest snapshot again)
                self.lake.begin()
                try:
                    self._refresh(d, trigger, out, temps)
                finally:
                    if self.lake.in_transaction:  # nothing to commit (NO_DATA), or a failure: nothing is written
                        self.lake.rollback()
                        self._forget_pending()
        except (KitError, duckdb.Error, psycopg.Error) as exc:  # the table fails, the batch goes on
            out.error = exc.line() if isinstance(exc, KitError) else first_line(exc)
            out.status = FAILED
        finally:
            with clock.phase("delta"):
                self._drop_temps(temps)
            out.finished_at = datetime.now(UTC)
            with clock.phase("history"):
                out.phases = clock.rounded()  # the history row's own write is timed by the next line, not in it
                out.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
                recorded = self.meta.record(out)
        recorded.phases = clock.rounded()
        return recorded

    def _refresh(self, d: Definition, trigger: str, out: Refresh, temps: list[str]) -> None:
        """The refresh under the table's lock: bind, read where it left off, decide, write and commit."""
        clock = self.clock
        with clock.phase("catalog"):
            now = self.lake.current_snapshot()
        if self.after_read is not None:
            self.after_read(now)
        with clock.phase("catalog"):  # one round trip: now's time and schema version, commits and changes since
            seen = snapshots_since(self.lake, d.data_snapshot, now)
            out.data_timestamp, self._version = seen[-1].time, seen[-1].version
        with clock.phase("bind"):
            query, plan = self._plan(d)
        with clock.phase("catalog"):
            commits = refresh_commits([(s.id, s.extra) for s in seen], d)
            self.recover(d, plan.sources, commits)
            prev = reflected(self.lake, d, commits)
            out.read_snapshot = now
            out.snapshots_read = dict.fromkeys(plan.sources, now)
            changed = None
            if prev is not None and prev < now:
                changed = feed.from_rows([s.changes for s in seen if s.id > prev], prev + 1, now)
                self._copies_seen(changed, prev, now)
        if changed is None or not changed.same_schema:  # a column renamed or dropped: the query may not bind
            with clock.phase("bind"):
                self._bind(d, query, now)
        fed = clock.ms.get("change_feed", 0.0)
        with clock.phase("delta"):
            decided = None if prev == now else self.decide(d, query, plan, (prev, now), temps, changed)
        clock.ms["delta"] -= clock.ms.get("change_feed", 0.0) - fed
        if decided is None:
            out.status, out.mode, out.reason = NO_DATA, None, "no net change in the sources since the last refresh"
            return
        work, statements = decided
        if work.mode == FULL and multiplicity.counted(plan, d):  # the counts would be stale: built again when needed
            statements = [*statements, ("side", multiplicity.drop_sql(self.lake.alias, d))]
        write = clock.ms.get("write", 0.0)
        with clock.phase("commit"):  # the statements (`write`, timed inside) and the COMMIT
            out.commit_snapshot = self.apply(d, work, statements, now, trigger)
        self._copies.update(self._pending)  # committed: the copies made in its transaction are there to stay
        self._pending.clear()
        clock.ms["commit"] -= clock.ms.get("write", 0.0) - write
        out.status, out.mode, out.reason = SUCCEEDED, work.mode, work.reason
        out.rows_inserted, out.rows_deleted = work.inserted, work.deleted


def _qualified(condition: str, lake_alias: str, name: str) -> str:
    """IMMUTABLE WHERE's condition with each column named through the dynamic table (`lake.schema.table.column`), so
    that inside a DELETE ... USING it never means a column of the other table."""
    schema, table = name.split(".")

    def qualify(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and not node.table:
            return exp.column(node.name, table, schema, lake_alias, quoted=True)
        return node

    return sql(sqlglot.parse_one(condition, read=DIALECT).transform(qualify))


def new_definition_id() -> str:
    return uuid.uuid4().hex[:12]
