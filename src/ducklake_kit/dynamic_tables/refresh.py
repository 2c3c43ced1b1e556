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
from ducklake_kit.dynamic_tables import feed, rewrite, rules
from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.catalog import (
    columns_of,
    reflected,
    refresh_commits,
    snapshot_time,
    snapshots_since,
    table_ids_at,
)
from ducklake_kit.dynamic_tables.cost import DEFAULT as DEFAULT_COST
from ducklake_kit.dynamic_tables.cost import Cost
from ducklake_kit.dynamic_tables.ddl import DIALECT
from ducklake_kit.dynamic_tables.metadata import (
    FAILED,
    FULL,
    INCREMENTAL,
    NO_DATA,
    SUCCEEDED,
    Definition,
    Metadata,
    Refresh,
)
from ducklake_kit.dynamic_tables.rewrite import sql, target
from ducklake_kit.dynamic_tables.rules import Delta, Work
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import change_counts, changes_sql
from ducklake_kit.lake.sql import quote_ident, quote_literal
from ducklake_kit.lake.transactions import AUTHOR, commit_with, snapshot_of_token
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.report import Reporter

# ADAPTIVE chooses from a cost estimate (`cost`: full against incremental, per row, with constants `bench --suite
# dynamic` measured); the share of the sources' rows where the default estimates meet, for one delta term:
ADAPTIVE_CROSSOVER = DEFAULT_COST.crossover
# ... except that a change of at most this many rows is always incremental (and one of inlined rows only, at most
# this many, without asking the catalog for file counts): at that size each kind of refresh costs its fixed cost
# (tens of milliseconds), and the incremental one writes only what changed
ADAPTIVE_SMALL_CHANGE = 1000
# a source unchanged in a refresh's span and of at most this many rows is read from a copy in memory (`_copies_for`)
COPY_ROWS = 100_000
# a refresh that deletes and inserts the rows it recomputes (a merge of groups, affected keys) leaves one more data
# file in its table each time, and deletes in the older ones; it reads the table's files again (the old groups, the
# DELETE), so each refresh grew slower than the last (bench --suite dynamic: 0.19 s to 0.56 s over 12 appends of the
# same size, the table at 13 files). Past this many live data files, the refresh compacts the table alone, in a commit
# of its own after the refresh's (DuckLake refuses compaction and changes in one transaction): the files with deletes
# rewritten without the deleted rows (`ducklake_rewrite_data_files`; `ducklake_merge_adjacent_files` leaves a file
# with deletes as it is), then the small files merged. Its rows do not change; its change feed shows the rewritten
# rows as updates to themselves, which a reader's netting cancels (`_changes`). 9, not 5: an aggregate's merge is one
# MERGE (rules.merge), which writes two files when it both updates groups and inserts new ones; at 5 the bench's
# tables (bench --suite dynamic --rows 1000000 --months 12,48) were compacted in most refreshes (0.25-0.4 s each),
# and uncompacted the same merge grew slowly with the files (0.17, 0.15, 0.20, 0.26, 0.37 s, ~4 files more each)
COMPACT_FILES = 9
# a dynamic table is made with this data-inlining limit (DuckLake's `data_inlining_row_limit`, set on the table
# alone; the lake's default is 10): a refresh that deletes and inserts at most this many rows writes them into the
# catalog (inlined rows and inlined deletes: PostgreSQL rows at commit, no Parquet file or delete file on S3), so a
# merge of a few hundred groups leaves no file behind and the next one reads only the table's file and those rows.
# Measured (a merge of 250 groups into a table of 3,869 rows, load 4-5): DELETE + INSERT 30 ms all told where the
# MERGE that writes a Parquet file for its updates took 136-239 ms (and one more file each time). Not more: inlined
# inserts grow faster than their rows here (250 rows 12 ms, 1,000 rows 37 ms, 4,000 rows 184 ms, 16,000 rows
# 1.5 s; a Parquet file of any of them ~20 ms)
INLINE_ROWS = 1000
# ... and its rows in the catalog (live or not) are flushed into a file and the table compacted past this many
COMPACT_INLINED = 10 * INLINE_ROWS
# a refresh that wrote only inlined rows counts the table's files and inlined rows (in its commit's catalog query:
# `counts_sql`; three catalog queries, ~5 ms, before)
# only once the rows this Refresher wrote into it since it last counted reach this many (a refresh that may have
# written a file always counts)
COMPACT_CHECK = INLINE_ROWS
LOCK_NAMESPACE = int.from_bytes(b"D\x00", "big") << 48
LOCK_WAIT_S = 600
PRE, POST = ("delete", "update_preimage"), ("insert", "update_postimage")


def lock_key(name: str) -> int:
    """The advisory lock a refresh of `name` holds: 48 bits of its name's hash in the dynamic tables' namespace."""
    return LOCK_NAMESPACE | int.from_bytes(hashlib.blake2b(name.encode(), digest_size=6).digest(), "big")


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


@dataclass
class Copy:
    """A small source's rows in temporary table `name`, right for every snapshot from the one it was made at up
    to `through`."""

    name: str
    through: int


@dataclass
class Kept:
    """A small dynamic table's own rows in temporary table `name` (`Refresher.kept`): right at snapshot `through`
    and, with the refresh's changes applied to it too, at `commit`, that refresh's commit (None before it commits).
    Right at a later snapshot when no snapshot after `through` but `commit` touched the table."""

    name: str
    through: int
    commit: int | None = None


# the phases of one refresh, in the order they run (`Refresh.phases`, milliseconds each)
PHASES = ("lock", "bind", "catalog", "change_feed", "delta", "write", "commit", "compact", "history")
# every refresh runs these phases (the others only when there is something for them to do)
ALWAYS = ("lock", "bind", "catalog", "change_feed", "delta", "write", "commit", "history")


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
    """Refreshes dynamic tables of one lake; `cost`: ADAPTIVE's estimate (`cost.Cost`, default `cost.DEFAULT`);
    `small_change`: see ADAPTIVE_SMALL_CHANGE; `report`: where a batch of refreshes shows its progress (a bar of tables in a terminal)."""

    def __init__(
        self,
        lake: Lake,
        meta: Metadata,
        *,
        cost: Cost = DEFAULT_COST,
        small_change: int = ADAPTIVE_SMALL_CHANGE,
        report: Reporter | None = None,
    ):
        self.lake, self.meta, self.cost, self.small_change = lake, meta, cost, small_change
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
        # small dynamic tables' own rows, by table id (`kept`): a merge reads them there, not from the lake
        self._kept: dict[int, Kept] = {}
        self._kept_pending: tuple[int, Kept] | None = None  # the one the current refresh reads and changes
        self._span: tuple[int, list] | None = None  # the current refresh's snapshot and the snapshots it saw
        self._written: dict[int, int] = {}  # table id -> inlined rows written into it since its files were counted
        # ADAPTIVE's size query, made in the refresh's first catalog query: (table ids, start, now, the size)
        self._size: tuple[list[int], int, int, feed.Size] | None = None
        # the compaction's counts, made in the refresh commit's own catalog query (`apply`): (full, the counts)
        self._counted: tuple[bool, tuple[int, int, int] | None] | None = None
        self._inlined_tables: dict[int, list[str]] = {}  # table id -> the names of its inlined-data tables last seen
        self._plans: dict[tuple[str, int], tuple[exp.Expression, planner.Plan]] = {}

    # ---- the lake side ---------------------------------------------------------------------------------------

    def temp(self, name: str, query: str) -> int:
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
            out[o.index] = rewrite.temp_table(copy.name, o.ref)
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
        if not self._small_temp(name, pinned, table_id):
            return None
        copy = self._pending[table_id] = Copy(name, now)
        return copy

    def _small_temp(self, name: str, relation: str, table_id: int) -> bool:
        """Temporary table `name` with `relation`'s rows when it has at most COPY_ROWS of them; else none, and table
        `table_id` is remembered as too big to copy."""
        if self.temp(name, f"SELECT * FROM {relation} LIMIT {COPY_ROWS + 1}") <= COPY_ROWS:
            return True
        self._drop_temps([name])
        self._too_big.add(table_id)
        return False

    # ---- small dynamic tables' own rows kept in memory ----------------------------------------------------------

    def kept(self, d: Definition, rows: int) -> str | None:
        """A temporary table holding dynamic table `d`'s rows at the current refresh's snapshot, for a rule that would
        read them from the lake and then change them (`rules.merge`): kept from this Refresher's last refresh of it
        while no other commit touched the table since (its own refresh commit is known by its snapshot; a compaction
        is another commit, after which the rows are read again), else read now (one read of the table, as the rule
        would have done). None for a table of more than COPY_ROWS rows. The rule changes the copy as it changes the
        table, in the same transaction; `_refresh` marks it right at the commit, `_forget_pending` drops it when the
        transaction rolls back."""
        if self._span is None or rows > INLINE_ROWS:  # more rows than inlined: a file either way, one MERGE is cheaper
            return None
        now, seen = self._span
        table_id = self._table_id(d.name, now)
        if table_id is None or table_id in self._too_big:
            return None
        copy = self._kept.pop(table_id, None)
        if copy is not None and not _still_right(copy, table_id, now, seen):
            self._drop_temps([copy.name])
            copy = None
        if copy is None:
            name = f"__dt_kept_{self._tag}_{table_id}"
            if not self._small_temp(name, target(self.lake, d.name), table_id):
                return None
            copy = Kept(name, now)
        copy.through, copy.commit = now, None
        self._kept_pending = (table_id, copy)
        return copy.name

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
            return 0, self.temp(post, f"SELECT {cols} FROM ducklake_table_insertions({args})")
        feed_table = f"{pre}_feed"
        self.temp(
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
                self.temp(pre, f"{lost_sql} EXCEPT ALL {gained_sql}"),
                self.temp(post, f"{gained_sql} EXCEPT ALL {lost_sql}"),
            )
        finally:
            self._drop_temps([feed_table])

    def _folded(self, d: Definition, plan: planner.Plan, changed: feed.Changed, ids: dict[str, int | None]) -> set[str]:
        """The sources whose inserts this refresh reads already aggregated as `rewrite.eager` groups them (one
        statement over the insertions, `_inserted_partial`, instead of a temporary table of every new row and then
        its aggregate): when the catalog shows only inserts into every changed source (so the refresh is the insert
        merge), and for a source read by one occurrence only, whose rows the plan aggregates before the joins."""
        if plan.kind != planner.AGGREGATE or plan.merge is None or d.immutable_where or not plan.eager:
            return set()
        how = {s: changed.of(ids[s]) for s in plan.sources}
        if any(h not in (feed.NONE, feed.INSERTS) for h in how.values()):
            return set()
        once = [o for o in plan.occurrences if sum(p.source == o.source for p in plan.occurrences) == 1]
        return {o.source for o in once if how[o.source] == feed.INSERTS and o.index in plan.eager}

    def _inserted_partial(
        self, source: str, span: tuple[int, int], name: str, select: exp.Select, plan: planner.Plan
    ) -> int:
        """Temporary table `name`: the source's insertions in snapshots `span` aggregated as `rewrite.partial` does
        for its one occurrence; its rows (groups)."""
        [o] = [o for o in plan.occurrences if o.source == source]
        schema, table = source.split(".")
        args = ", ".join([*map(quote_literal, (self.lake.alias, schema, table)), *(str(int(x)) for x in span)])
        query = sqlglot.parse_one(
            f"SELECT * FROM ducklake_table_insertions({args}) AS {quote_ident(o.ref)}", read=DIALECT
        )
        insertions = (query.args.get("from_") or query.args.get("from")).this
        return self.temp(name, sql(rewrite.partial(select, plan, o.index, insertions)))

    def read_columns(self, source: str, select: exp.Select, plan: planner.Plan) -> list[str]:
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
        for copy in list(self._kept.values()):
            try:
                self._drop_temps([copy.name])
            except duckdb.Error:  # the lake's connection is closed already: the copies went with it
                break
        self._kept.clear()
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
        if self._kept_pending is not None:  # made in the transaction (gone) or changed in it (back as it was): dropped
            name = self._kept_pending[1].name
            self._kept_pending = None
            self._drop_temps([name])

    def full(self, query: exp.Expression, snapshot: int, reason: str) -> tuple[Work, list]:
        new = sql(rewrite.pinned(query, self.lake.alias, snapshot))
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
            return self.full(query, now, "INITIAL: the first refresh")
        if changed is not None and changed.rows_only:  # no table made, dropped or altered since: same ids at both
            ids, replaced = {s: self._table_id(s, now) for s in plan.sources}, []
        else:
            both = {s: table_ids_at(self.lake, s, (prev, now)) for s in plan.sources}
            ids = {s: at_now for s, (_, at_now) in both.items()}
            self._ids.update({(s, self._version): i for s, i in ids.items()})  # `_table_id`'s, read anyway
            replaced = [s for s, (at_prev, at_now) in both.items() if at_prev != at_now]
        if replaced:  # dropped and created again: its change feed knows nothing of the old table's rows
            return self.full(
                query, now, f"SOURCE_REPLACED: {', '.join(replaced)} is not the table it was at snapshot {prev}"
            )
        if changed is None:
            with self.clock.phase("change_feed"):
                changed = feed.changed(self.lake, prev + 1, now)
        if d.refresh_mode == FULL or not plan.incremental:
            how = [changed.of(ids[s]) for s in plan.sources]
            # rows added (a data file or inlined rows written, nothing deleted) are a change for sure: the change
            # feed is read (~25 ms a source, more once the source has deletes) only to tell a net nothing apart
            if all(h == feed.NONE for h in how) or (
                feed.INSERTS not in how and not self.sources_changed(plan.sources, prev + 1, now)
            ):
                return None
            why = "REFRESH_MODE = FULL" if d.refresh_mode == FULL else plan.explain()
            return self.full(query, now, why)
        note = None
        if adaptive(d.refresh_mode):  # the choice, made from the catalog before any change feed is read
            tables = [i for i in ids.values() if i is not None]
            # an inlined change holds at most the table's inlining limit: the lake's default, INLINE_ROWS for a
            # dynamic table (made with it)
            limit = {ids[s]: INLINE_ROWS if s in d.depends_on else feed.INLINED_ROWS for s in plan.sources}
            inlined = sum(changed.inlined_changes([t]) * limit[t] for t in tables)
            if changed.inlined_only(tables) and inlined <= self.small_change:  # no file changed: no need to count
                note = f"ADAPTIVE chose incremental: the change (~{inlined:,} rows, inlined) is at most "
                note += f"{self.small_change:,} rows"
            else:
                if self._size is not None and self._size[:3] == (tables, prev + 1, now):  # read with the snapshots
                    size = feed.Size(self._size[3].changed + inlined, self._size[3].rows)
                else:
                    with self.clock.phase("change_feed"):
                        size = feed.size(self.lake, tables, prev + 1, now, inlined)
                # one delta term per changed source (each term joins one source's change with the others)
                terms = sum(1 for t in tables if changed.of(t) != feed.NONE)
                est = self.cost.estimate(size.changed, size.rows, terms)
                if est.mode == FULL and size.changed > self.small_change:
                    return self.full(query, now, est.why())
                note = (
                    est.why()
                    if est.mode == INCREMENTAL
                    else f"{est.why(INCREMENTAL)}: at most {self.small_change:,} rows"
                )
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
            select = rewrite.mutable_only(select, d.immutable_where, plan)
        pre: dict[str, str] = {}
        post: dict[str, str] = {}
        counts: dict[str, tuple[int, int]] = {}
        folded = self._folded(d, plan, changed, ids)
        try:
            for j, source in enumerate(plan.sources):
                pre[source], post[source] = f"__dt_pre_{j}", f"__dt_post_{j}"
                temps += [pre[source], post[source]]
                with self.clock.phase("change_feed"):
                    if source in folded:
                        span = (prev + 1, now)
                        counts[source] = 0, self._inserted_partial(source, span, post[source], select, plan)
                        continue
                    counts[source] = self._changes(
                        source,
                        prev + 1,
                        now,
                        pre[source],
                        post[source],
                        self.read_columns(source, select, plan),
                        changed.of(ids[source]),
                    )
        except duckdb.Error as exc:
            self._restart()
            if d.refresh_mode == INCREMENTAL:
                raise KitError(
                    f"the change feed of {d.name}'s sources cannot be read ({first_line(exc)})",
                    "re-create it with REFRESH_MODE = ADAPTIVE or FULL (CREATE OR REPLACE DYNAMIC TABLE ...)",
                ) from None
            return self.full(query, now, f"CHANGE_FEED_UNREADABLE: {first_line(exc)}")
        if not any(a or b for a, b in counts.values()):
            return None
        if multiplicity.counted(plan, d):
            return rules.counted(self, d, query, plan, Delta(pre, post, counts, prev, now), temps)
        if plan.kind == planner.UNION:
            return rules.union(self, d, query, plan, Delta(pre, post, counts, prev, now), temps)
        insert_only = not any(a for a, _ in counts.values())

        same: dict[int, exp.Table] = {}  # the unchanged sources read from copies, made when a term first needs them

        eager: list[str] = []  # the occurrences whose inserted rows were aggregated before the joins

        def terms(images: dict[str, str], before: int, after: int, merged: bool = False) -> list[exp.Select]:
            if not same:
                same.update(self._copies_for(plan, select, counts, ids, now))
            out = []
            for o in plan.occurrences:
                if counts[o.source][0 if images is pre else 1]:
                    bound = {o.index: rewrite.temp_table(images[o.source], o.ref)}
                    t = rewrite.term(select, self.lake.alias, bound, before, after, same)
                    # a folded source's temporary table holds its inserts aggregated already (`_folded`)
                    grouped = rewrite.eager(t, plan, o.index, o.source in folded) if merged or folded else None
                    if grouped is not None:
                        eager.append(o.ref)
                    out.append(grouped or t)
            return out

        if plan.kind == planner.ROWS and insert_only and not plan.outer and not plan.derived:
            gained = terms(post, prev, now)
            self.terms = len(gained)
            new = " UNION ALL ".join(sql(t) for t in gained)
            return Work(INCREMENTAL, "inserts appended"), [("insert", new)]
        if plan.kind == planner.AGGREGATE and insert_only and plan.merge is not None and not d.immutable_where:
            gained = terms(post, prev, now, merged=True)
            self.terms = len(gained)
            work, statements = rules.merge(self, d, plan, gained, temps)
            if eager:
                work.reason += f" (inserts into {', '.join(eager)} aggregated before the joins)"
            return work, statements
        # affected keys: pre-images against the old snapshot, post-images against the new one
        keys = plan.keys if plan.keyed else [planner.Key(c, exp.column(c, "__q", quoted=True)) for c in plan.columns]
        if plan.derived:  # the query over the derived rows a change touches, as they were and are
            touched = rules.derived_rows(self, select, plan, Delta(pre, post, counts, prev, now), temps)
        elif plan.outer:  # the result rows of the kept tables' rows a change reaches, as they were and are
            touched = rules.outer_rows(self, select, plan, Delta(pre, post, counts, prev, now), temps)
            if not touched:
                return None
        else:
            touched = terms(pre, prev, prev) + terms(post, now, now)
        if plan.keyed:
            affected_sql = " UNION ".join(sql(rewrite.key_select(t, keys)) for t in touched)
        else:  # the affected rows, compared whole: their columns become the keys __k0, __k1, ...
            union = " UNION ".join(sql(p) for p in touched)
            renamed = ", ".join(f"{quote_ident(k.column)} AS {rewrite.key_column(i)}" for i, k in enumerate(keys))
            affected_sql = f"SELECT DISTINCT {renamed} FROM ({union}) AS __a"
        affected = self.temp("__dt_keys", affected_sql)
        temps.append("__dt_keys")
        what = {planner.AGGREGATE: "groups", planner.WINDOW: "partitions"}.get(plan.kind, "distinct rows")
        if plan.keyed:
            new = sql(rewrite.restricted(rewrite.pinned(select, self.lake.alias, now), keys, "__dt_keys"))
        else:
            inner = rewrite.pinned(select, self.lake.alias, now).subquery("__q")
            new = sql(rewrite.restricted(exp.select("*").from_(inner), keys, "__dt_keys"))
        statements = [
            ("delete_keys", ("__dt_keys", [(k.column, rewrite.key_column(i)) for i, k in enumerate(keys)])),
            ("insert", new),
        ]
        return Work(INCREMENTAL, f"{affected} affected {what} recomputed"), statements

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
                if kind in ("side", "kept"):  # the side table of multiplicity counts, the copy: not the table's rows
                    con.execute(arg)
                    continue
                if kind == "merge":  # rules.merge's MERGE: its count is the rows written, the counter's those updated
                    con.execute(f"CREATE OR REPLACE TEMP SEQUENCE {rules.MATCHED_COUNTER} START 1")
                    work.inserted += int(con.execute(arg).fetchone()[0])
                    work.deleted += int(
                        con.execute(
                            "SELECT coalesce(max(last_value), 0) FROM duckdb_sequences() "
                            "WHERE temporary AND sequence_name = ?",
                            [rules.MATCHED_COUNTER],
                        ).fetchone()[0]
                    )
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
        # the snapshot that carries this commit's extra info: one catalog query (after the snapshot it read), which
        # also counts the table's files and inlined rows when the compaction asks (`_compact_due`; ~5 ms alone)
        full = self._compact_due(d, read, work, statements)
        table_id = self._table_id(d.name, read) if full is not None else None
        lookup = (
            "SELECT (SELECT max(snapshot_id) FROM public.ducklake_snapshot_changes "
            f"WHERE snapshot_id > {int(read)} AND commit_extra_info = {quote_literal(info)}) AS commit"
        )
        row = None
        if table_id is not None:
            try:
                names = self._inlined_tables.get(table_id, [])
                row = self._catalog(f"{lookup}, {counts_sql(table_id, read, names)}")
                self._counted = (full, self._counts(table_id, read, row[1:]))
            except duckdb.Error:  # an inlined-data table gone since: `compact` counts them itself
                self._inlined_tables.pop(table_id, None)
                self._counted, row = (full, None), None
        if row is None:
            row = self._catalog(lookup)
        return int(row[0]) if row[0] is not None else snapshot_of_token(self.lake, token)

    def _catalog(self, text: str) -> tuple:
        """The one row of PostgreSQL query `text` on the lake's catalog (one round trip)."""
        alias = quote_literal(f"__ducklake_metadata_{self.lake.alias}")
        return self.con.execute(f"SELECT * FROM postgres_query({alias}, {quote_literal(text)})").fetchone()

    def _counts(self, table_id: int, now: int, row: tuple) -> tuple[int, int, int]:
        """(live files, those from `now` or before, inlined rows) from `counts_sql`'s items: its inlined rows counted
        again, by a query of their own, when the catalog names inlined-data tables it did not count."""
        files, stale, listed, inlined = row
        names = listed.split(",") if listed else []
        if names != self._inlined_tables.get(table_id, []):
            inlined = self._catalog(f"SELECT {_rows_of(names)}")[0]
            self._inlined_tables[table_id] = names
        return int(files), int(stale), int(inlined)

    def recover(self, d: Definition, sources: list[str], commits: list[tuple[int, dict]]) -> list[Refresh]:
        """Record the refreshes that landed in the lake but not in the history (the process died, or PostgreSQL
        failed, between the commit and its record): SUCCEEDED, with what their commit says (what they read, their
        mode and trigger when the commit names them) and the rows the target's change feed shows at that snapshot.
        Run under the table's lock, before the next refresh; `commits`: `lake_commits(lake, d, d.data_snapshot)`."""
        # a commit that read no later than the recorded snapshot is recorded: that snapshot moves only when a refresh
        # is recorded, after this ran for every commit before it (so the usual case asks PostgreSQL nothing)
        commits = [c for c in commits if d.data_snapshot is None or c[1]["read"] > d.data_snapshot]
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
                # a MERGE's updates show as update images (rules.merge): each a row deleted and one inserted
                r.rows_inserted = sum(counts.get(k, 0) for k in POST)
                r.rows_deleted = sum(counts.get(k, 0) for k in PRE)
            except duckdb.Error:  # the snapshot expired: the counts are unknown, not zero
                self._restart()
            out.append(self.meta.record(r))
        return out

    def _bind(self, d: Definition, query: exp.Expression, now: int) -> None:
        """The query still binds at `now`, with the table's columns: a source's schema may have changed without any
        row changing (a renamed or dropped column), and the change feed alone would not say so."""
        try:
            described = self.con.execute(f"DESCRIBE {sql(rewrite.pinned(query, self.lake.alias, now))}").fetchall()
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
        self._span = self._size = self._counted = None
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
            version, tables = self._version, self._sources_known(d)
            seen, size = snapshots_since(self.lake, d.data_snapshot, now, tables)
            out.data_timestamp, self._version = seen[-1].time, seen[-1].version
            # the sources' ids were those of the last schema version: right when it is still the lake's
            if size is not None and self._version == version and d.data_snapshot is not None:
                self._size = (tables, d.data_snapshot + 1, now, size)
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
        self._span = (now, seen)
        fed = clock.ms.setdefault("change_feed", 0.0)  # an ALWAYS phase: 0 when no feed or size query is read
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
        if self._kept_pending is not None:  # the table's own rows, right at the commit too
            table_id, kept = self._kept_pending
            kept.commit, self._kept[table_id], self._kept_pending = out.commit_snapshot, kept, None
        clock.ms["commit"] -= clock.ms.get("write", 0.0) - write
        out.status, out.mode, out.reason = SUCCEEDED, work.mode, work.reason
        out.rows_inserted, out.rows_deleted = work.inserted, work.deleted
        if self._counted is not None:  # counted with the commit's snapshot (`apply`)
            full, counts = self._counted
            with clock.phase("compact"):
                merged = self.compact(d, now, full, counts)
            if merged:
                out.reason += f"; then its {merged}"

    def _sources_known(self, d: Definition) -> list[int] | None:
        """The table ids of an ADAPTIVE table's sources at the lake's last schema version this Refresher read (its
        plan and their ids known then, the table refreshed before), for its size query to ride on the refresh's
        first catalog query; None when not all are known."""
        if not adaptive(d.refresh_mode) or d.data_snapshot is None:
            return None
        planned = self._plans.get((d.definition_id, self._version))
        if planned is None or any((s, self._version) not in self._ids for s in planned[1].sources):
            return None
        ids = [self._ids[(s, self._version)] for s in planned[1].sources]
        return [i for i in ids if i is not None] or None

    def _compact_due(self, d: Definition, now: int, work: Work, statements: list) -> bool | None:
        """After a committed refresh: None when the table's files and inlined rows are not counted (nothing to
        compact for sure), else whether the refresh was a full one (it deleted every row: its files from before are
        stale). Counted after a full refresh, and after one that deleted and inserted rows when `_count_due`."""
        kinds = {kind for kind, _ in statements}
        full = "delete_all" in kinds and work.deleted > 0
        if full or (kinds & {"delete_keys", "merge"} and work.inserted and self._count_due(d, now, work, statements)):
            return full
        return None

    def _count_due(self, d: Definition, now: int, work: Work, statements: list) -> bool:
        """Whether a refresh that deleted and inserted rows counts the table's files and inlined rows now: after a
        write that may have made a file (a MERGE, more than INLINE_ROWS rows inserted or deleted), the first time
        this Refresher writes into the table, and once COMPACT_CHECK rows were written since it last counted."""
        table_id = self._table_id(d.name, now)
        written = self._written.get(table_id, COMPACT_CHECK) + work.inserted + work.deleted
        files = any(kind == "merge" for kind, _ in statements) or max(work.inserted, work.deleted) > INLINE_ROWS
        due = files or written >= COMPACT_CHECK
        self._written[table_id] = 0 if due else written
        return due

    def compact(self, d: Definition, now: int, full: bool = False, counts: tuple[int, int, int] | None = None) -> str:
        """Merge the table's data files when it has more than COMPACT_FILES live ones, or more than COMPACT_INLINED
        rows in the catalog (inlined rows, live or not, flushed into a file first), after the refresh's commit, under
        its lock: what was compacted ('' when nothing was). After a `full` refresh, when a file from before it is
        still live: a full refresh deletes every row, and DuckLake drops a file whole only when it had no deletes
        before; one that had (a merge's) stays, its rows deleted by a delete file or inlined deletes, and every later
        read reads it too (the bench's stream: ~30 ms more per refresh after ADAPTIVE refreshed in full). A failure
        leaves the table as it was (and is no failure of the refresh, which has committed). `counts`: (live files,
        those from snapshot `now` or before, inlined rows), when the caller has read them (`apply`: `counts_sql`)."""
        table_id = self._table_id(d.name, now)
        if table_id is None:
            return ""
        if counts is None:
            names = self._inlined_tables.get(table_id, [])
            counts = self._counts(table_id, now, self._catalog(f"SELECT {counts_sql(table_id, now, names)}"))
        files, stale, inlined = counts
        stale = stale if full else 0  # after a full refresh, the files from before it hold no live row
        if files <= COMPACT_FILES and inlined <= COMPACT_INLINED and not stale:
            return ""
        schema, table = d.name.split(".")

        args = [self.lake.alias, table, schema]

        def flush(con: duckdb.DuckDBPyConnection) -> None:
            con.execute("CALL ducklake_flush_inlined_data(?, table_name => ?, schema_name => ?)", args)

        def merge(con: duckdb.DuckDBPyConnection) -> None:
            con.execute("CALL ducklake_rewrite_data_files(?, ?, schema => ?, delete_threshold => 0)", args)
            con.execute("CALL ducklake_merge_adjacent_files(?, ?, schema => ?)", args)

        what = (f"{inlined} inlined rows and " if inlined > COMPACT_INLINED else "") + f"{files} data files"
        extra = {"dynamic_table": d.name, "definition": d.definition_id, "compacted": int(files)}
        try:
            if inlined > COMPACT_INLINED:  # its own commit: the files it writes are compacted by the next one
                commit_with(self.lake, flush, f"dynamic table {d.name}: its inlined rows flushed", extra=extra)
            commit_with(self.lake, merge, f"dynamic table {d.name}: its data files compacted", extra=extra)
        except (duckdb.Error, KitError):
            self._restart()
            return ""
        return f"{what} compacted"


def counts_sql(table_id: int, now: int, names: list[str]) -> str:
    """PostgreSQL select items for `Refresher.compact`: table `table_id`'s live data files, those of them from
    snapshot `now` or before, the names of its inlined-data tables in the catalog (one per schema version of the
    table, comma-separated, sorted), and the rows (live or not) of those of them named in `names` (the ones the
    caller knows: a name is found only in the catalog, and PostgreSQL has no query of a name computed in SQL here)."""
    t, n = int(table_id), int(now)
    files = f"FROM public.ducklake_data_file WHERE table_id = {t} AND end_snapshot IS NULL"
    return (
        f"(SELECT count(*) {files}) AS files, (SELECT count(*) {files} AND begin_snapshot <= {n}) AS stale, "
        "(SELECT coalesce(string_agg(table_name, ',' ORDER BY table_name), '') FROM public.ducklake_inlined_data_tables "
        f"WHERE table_id = {t}) AS names, {_rows_of(names)} AS inlined"
    )


def _rows_of(names: list[str]) -> str:
    """A PostgreSQL expression: the rows of the catalog's tables `names` (inlined-data tables), 0 for none."""
    return " + ".join(f"(SELECT count(*) FROM public.{quote_ident(x)})" for x in names) or "0"


def _still_right(copy: Kept, table_id: int, now: int, seen: list) -> bool:
    """Whether `copy` of table `table_id` is right at snapshot `now`: every snapshot after `copy.through` up to `now`
    is in `seen` (`snapshots_since`, oldest first) and none but `copy.commit` touched the table."""
    if copy.commit is None or copy.through > now:
        return False
    later = [s for s in seen if s.id > copy.through]
    if [s.id for s in later] != list(range(copy.through + 1, now + 1)):
        return False
    made = ["" if s.id == copy.commit else s.changes for s in later]
    return feed.from_rows(made, copy.through + 1, now).of(table_id) == feed.NONE


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
