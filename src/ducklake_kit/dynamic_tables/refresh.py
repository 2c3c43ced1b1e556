"""One refresh of one dynamic table, in its own transaction.

1. Hold the table's advisory lock (two refreshers of one table would apply a change twice).
2. Read the lake's current snapshot once: every source is read AT (VERSION => that snapshot), and that is the
   snapshot recorded. Changes committed meanwhile by others are after it, so the next refresh reads them.
3. Where the previous refresh left off: the later of the metadata's record and the lake's (every refresh commit
   carries `{"dynamic_table", "definition", "read"}` in its commit_extra_info), so a commit whose metadata write
   was lost is never applied again; such a commit is written to the history then (`recover`).
4. Read each source's change feed since then into temporary tables, decide the mode (see `plan`), compute the
   rows to delete and insert from pinned reads, then DELETE and INSERT in ONE lake transaction. Counts are the
   statements' own. The outcome goes to the history afterwards, whatever it was.

A refresh with no source change makes no snapshot (NO_DATA)."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import duckdb
import psycopg
import sqlglot
from sqlglot import exp

from ducklake_kit.dynamic_tables import plan as planner
from ducklake_kit.dynamic_tables.ddl import DIALECT
from ducklake_kit.dynamic_tables.metadata import FAILED, NO_DATA, SUCCEEDED, Definition, Metadata, Refresh
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import change_counts, changes_sql
from ducklake_kit.lake.locks import advisory_lock
from ducklake_kit.lake.sql import quote_ident, quote_literal
from ducklake_kit.lake.transactions import commit_with
from ducklake_kit.platforms.report import Reporter

FULL, INCREMENTAL = "FULL", "INCREMENTAL"
# AUTO refreshes in full when the affected groups (or rows) to recompute exceed this share of the table's rows:
# recomputing most groups through the change feed costs more than recomputing all of them at once
FULL_REFRESH_SHARE = 0.5
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
    out = []
    for snapshot, info in rows:
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


def table_id_at(lake: Lake, source: str, snapshot: int) -> int | None:
    """The catalog's id of table `source` at `snapshot` (None: no such table then). A table dropped and created
    again under the same name has a new id, and its change feed knows nothing of the old one's rows."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    schema, table = source.split(".")
    row = lake.con.execute(
        f"""
        SELECT t.table_id FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s USING (schema_id)
        WHERE lower(s.schema_name) = ? AND lower(t.table_name) = ?
          AND t.begin_snapshot <= ? AND (t.end_snapshot IS NULL OR t.end_snapshot > ?)
          AND s.begin_snapshot <= ? AND (s.end_snapshot IS NULL OR s.end_snapshot > ?)""",
        [schema.lower(), table.lower(), snapshot, snapshot, snapshot, snapshot],
    ).fetchone()
    return int(row[0]) if row else None


def reflected(lake: Lake, d: Definition, commits: list[tuple[int, dict]] | None = None) -> int | None:
    """The snapshot of the sources the table reflects now: the later of the metadata's record and the lake's
    (`commits`: `lake_commits(lake, d, d.data_snapshot)` when the caller has read them already)."""
    if commits is None:
        commits = lake_commits(lake, d, d.data_snapshot)
    recorded = [s for s in (d.data_snapshot, commits[-1][1]["read"] if commits else None) if s is not None]
    return max(recorded) if recorded else None


def snapshot_time(lake: Lake, snapshot: int) -> datetime:
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    return lake.scalar(f"SELECT snapshot_time FROM {meta}.ducklake_snapshot WHERE snapshot_id = ?", [snapshot])


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
class Work:
    """What one refresh decided and did."""

    mode: str
    reason: str
    inserted: int = 0
    deleted: int = 0


class Refresher:
    """Refreshes dynamic tables of one lake; `full_share`: see FULL_REFRESH_SHARE; `report`: where a batch of
    refreshes shows its progress (a bar of tables in a terminal)."""

    def __init__(
        self, lake: Lake, meta: Metadata, *, full_share: float = FULL_REFRESH_SHARE, report: Reporter | None = None
    ):
        self.lake, self.meta, self.full_share = lake, meta, full_share
        self.report = report or Reporter()
        self.con = lake.con
        # where tests step in: right after the refresh read the lake's snapshot, and just before its COMMIT
        self.after_read: Callable[[int], None] | None = None
        self.before_commit: Callable[[], None] | None = None

    # ---- the lake side ---------------------------------------------------------------------------------------

    def _temp(self, name: str, query: str) -> int:
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {quote_ident(name)} AS {query}")
        return int(self.con.execute(f"SELECT count(*) FROM temp.main.{quote_ident(name)}").fetchone()[0])

    def _drop_temps(self, names: list[str]) -> None:
        for n in names:
            self.con.execute(f"DROP TABLE IF EXISTS temp.main.{quote_ident(n)}")

    def _changes(self, source: str, start: int, end: int, pre: str, post: str, columns: list[str]) -> tuple[int, int]:
        """The source's net change in snapshots start..end, as its `columns`: the rows it lost into temporary table
        `pre`, the rows it gained into `post`; how many of each. A row deleted and inserted again unchanged (a
        dimension table rewritten whole, an UPDATE that set a column to its own value or changed only columns the
        query does not read) is in neither: as a multiset, the table's change is post minus pre, and equal rows
        cancel. The feed is read once; when it holds only inserts (or only deletes) it becomes that table as it is."""
        feed = f"{pre}_feed"
        self._drop_temps([pre, post])  # names a refresh that died in this process may have left
        cols = ", ".join(quote_ident(c) for c in columns)
        self._temp(feed, f"SELECT {cols}, change_type AS __change FROM {changes_sql(self.lake, source, start, end)}")
        qfeed = f"temp.main.{quote_ident(feed)}"
        kinds = dict(
            self.con.execute(
                f"SELECT __change IN ({', '.join(map(quote_literal, PRE))}), count(*) FROM {qfeed} GROUP BY ALL"
            ).fetchall()
        )
        lost, gained = int(kinds.get(True, 0)), int(kinds.get(False, 0))
        if not lost or not gained:  # one side only: nothing to net, and no copy (dropping a column is ~1 ms)
            self.con.execute(f"ALTER TABLE {qfeed} DROP COLUMN __change")
            kept, empty = (post, pre) if gained else (pre, post)
            self.con.execute(f"ALTER TABLE {qfeed} RENAME TO {quote_ident(kept)}")
            self._temp(empty, f"SELECT * FROM temp.main.{quote_ident(kept)} LIMIT 0")
            return lost, gained
        try:
            lost_sql = f"SELECT {cols} FROM {qfeed} WHERE __change IN ({', '.join(map(quote_literal, PRE))})"
            gained_sql = f"SELECT {cols} FROM {qfeed} WHERE __change IN ({', '.join(map(quote_literal, POST))})"
            return (
                self._temp(pre, f"{lost_sql} EXCEPT ALL {gained_sql}"),
                self._temp(post, f"{gained_sql} EXCEPT ALL {lost_sql}"),
            )
        finally:
            self._drop_temps([feed])

    def _read_columns(self, source: str, select: exp.Select, plan: planner.Plan) -> list[str]:
        """The source's columns the query reads: those it names (unqualified, or qualified by one of the source's
        names in the query). All of them whenever that cannot be told for sure: a `*` or COLUMNS(...) (COUNT(*)
        aside), a USING join, a table's name used as a value (the whole row as a struct), a dotted name whose
        qualifier is no table of the query (a struct's field). The change feed is asked for these only."""
        every = [c for c, _ in columns_of(self.lake, source)]
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
                return True
        return False

    def _full(self, query: exp.Expression, snapshot: int, reason: str) -> tuple[Work, list]:
        new = sql(planner.pinned(query, self.lake.alias, snapshot))
        return Work(FULL, reason), [("delete_all", None), ("insert", new)]

    def decide(
        self, d: Definition, query: exp.Expression, plan: planner.Plan, prev: int | None, now: int, temps: list[str]
    ) -> tuple[Work, list] | None:
        """The refresh's mode and the statements it needs (None: nothing to do)."""
        if prev is None:
            return self._full(query, now, "INITIAL: the first refresh")
        replaced = [s for s in plan.sources if table_id_at(self.lake, s, prev) != table_id_at(self.lake, s, now)]
        if replaced:  # dropped and created again: its change feed knows nothing of the old table's rows
            return self._full(
                query, now, f"SOURCE_REPLACED: {', '.join(replaced)} is not the table it was at snapshot {prev}"
            )
        if d.refresh_mode == FULL or not plan.incremental:
            if not self.sources_changed(plan.sources, prev + 1, now):
                return None
            why = "REFRESH_MODE = FULL" if d.refresh_mode == FULL else plan.explain()
            return self._full(query, now, why)
        select = named(plan.query, d.columns) if plan.query is not None else query  # CTEs inlined
        pre: dict[str, str] = {}
        post: dict[str, str] = {}
        counts: dict[str, tuple[int, int]] = {}
        try:
            for j, source in enumerate(plan.sources):
                pre[source], post[source] = f"__dt_pre_{j}", f"__dt_post_{j}"
                temps += [pre[source], post[source]]
                counts[source] = self._changes(
                    source, prev + 1, now, pre[source], post[source], self._read_columns(source, select, plan)
                )
        except duckdb.Error as exc:
            if d.refresh_mode == INCREMENTAL:
                raise KitError(
                    f"the change feed of {d.name}'s sources cannot be read ({first_line(exc)})",
                    "re-create it with REFRESH_MODE = AUTO or FULL (CREATE OR REPLACE DYNAMIC TABLE ...)",
                ) from None
            return self._full(query, now, f"CHANGE_FEED_UNREADABLE: {first_line(exc)}")
        if not any(a or b for a, b in counts.values()):
            return None
        if plan.kind == planner.UNION:
            return self._union(d, query, plan, Delta(pre, post, counts, prev, now), temps)
        insert_only = not any(a for a, _ in counts.values())

        def terms(images: dict[str, str], before: int, after: int) -> list[exp.Select]:
            out = []
            for o in plan.occurrences:
                if counts[o.source][0 if images is pre else 1]:
                    bound = {o.index: planner.temp_table(images[o.source], o.ref)}
                    out.append(planner.term(select, self.lake.alias, bound, before, after))
            return out

        if plan.kind == planner.ROWS and insert_only and not plan.outer:
            new = " UNION ALL ".join(sql(t) for t in terms(post, prev, now))
            return Work(INCREMENTAL, "inserts appended"), [("insert", new)]
        if plan.kind == planner.AGGREGATE and insert_only and plan.merge is not None:
            return self._merge(d, plan, terms(post, prev, now), temps)
        # affected keys: pre-images against the old snapshot, post-images against the new one
        keys = plan.keys if plan.keyed else [planner.Key(c, exp.column(c, "__q", quoted=True)) for c in plan.columns]
        if plan.outer:  # the result rows of the first table's rows a change reaches, as they were and are
            delta = Delta(pre, post, counts, prev, now)
            touched = self._outer_rows(
                select, plan, delta, self._read_columns(plan.occurrences[0].source, select, plan)
            )
            temps.append("__dt_outer")
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
        size = int(self.con.execute(f"SELECT count(*) FROM {target(self.lake, d.name)}").fetchone()[0])
        what = {planner.AGGREGATE: "groups", planner.WINDOW: "partitions"}.get(plan.kind, "distinct rows")
        if d.refresh_mode != INCREMENTAL and affected > self.full_share * max(size, 1) and size > 0:
            return self._full(
                query, now, f"AFFECTED_KEYS_SHARE: {affected} affected {what} of {size} rows (> {self.full_share:.0%})"
            )
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

    def _outer_rows(self, select: exp.Select, plan: planner.Plan, delta: Delta, columns: list[str]) -> list:
        """Over LEFT JOINs every result row belongs to one row of the first table (never padded): the rows of that
        table a change reaches (its own lost and gained rows; the rows joined to another table's changed rows, read
        as they were for lost rows and as they are for gained ones) go to temporary table `__dt_outer` (as
        `columns`, the ones the query reads); the query with its first table read from there, at both snapshots,
        gives every result row that went or came, NULL-padded ones included."""
        first = plan.occurrences[0]
        parts = []
        if any(delta.counts[first.source]):
            parts += [f"SELECT * FROM temp.main.{quote_ident(t[first.source])}" for t in (delta.pre, delta.post)]
        projected = [exp.column(c, first.ref, quoted=True) for c in columns]
        for o in plan.occurrences[1:]:
            for images, side, at in ((delta.pre, 0, delta.prev), (delta.post, 1, delta.now)):
                if delta.counts[o.source][side]:
                    bound = (o.index, planner.temp_table(images[o.source], o.ref))
                    parts.append(sql(planner.preserved_rows(select, self.lake.alias, bound, at, projected)))
        self._temp("__dt_outer", " UNION ".join(parts))
        reached = {0: planner.temp_table("__dt_outer", first.ref)}
        return [planner.term(select, self.lake.alias, reached, at, at) for at in (delta.prev, delta.now)]

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
        size = int(self.con.execute(f"SELECT count(*) FROM {tgt}").fetchone()[0])
        if d.refresh_mode != INCREMENTAL and affected > self.full_share * max(size, 1) and size > 0:
            return self._full(
                query,
                delta.now,
                f"AFFECTED_KEYS_SHARE: {affected} affected distinct rows of {size} rows (> {self.full_share:.0%})",
            )
        keys = [planner.Key(c, exp.column(c, "__q", quoted=True)) for c in names]
        whole = _positional(planner.pinned(plan.query, alias, delta.now), names, "__q").args["from_"].this
        new = sql(planner.restricted(exp.select("*").from_(whole), keys, "__dt_keys"))
        statements = [("delete_keys", ("__dt_keys", [(c, planner.key_column(i)) for i, c in enumerate(names)]))]
        return Work(INCREMENTAL, f"{affected} affected distinct rows recomputed ({of})"), [*statements, ("insert", new)]

    def _merge(self, d: Definition, plan: planner.Plan, terms: list[exp.Select], temps: list[str]) -> tuple[Work, list]:
        """Insert-only changes to a SUM/COUNT/MIN/MAX aggregate: each touched group's new value from its old row
        and the aggregates of the new rows alone."""
        keys = [quote_ident(k.column) for k in plan.keys]
        combine = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
        cols = ", ".join(
            keys + [f"{combine[m.function]}({quote_ident(m.column)}) AS {quote_ident(m.column)}" for m in plan.merge]
        )
        union = " UNION ALL ".join(sql(t) for t in terms)
        groups = self._temp("__dt_delta", f"SELECT {cols} FROM ({union}) AS __d GROUP BY ALL")
        temps.append("__dt_delta")
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
            how[c].format(c=quote_ident(c)) if c in how else f"__d.{quote_ident(c)}" for c in plan.columns
        )
        new = f"SELECT {select} FROM temp.main.__dt_delta AS __d LEFT JOIN {target(self.lake, d.name)} AS __o ON {on}"
        self._temp("__dt_merged", new)
        temps.append("__dt_merged")
        return (
            Work(INCREMENTAL, f"inserts merged into {groups} groups"),
            [
                ("delete_keys", ("__dt_delta", [(k.column, k.column) for k in plan.keys])),
                ("insert", "SELECT * FROM temp.main.__dt_merged"),
            ],
        )

    def apply(self, d: Definition, work: Work, statements: list, read: int, trigger: str = "manual") -> int | None:
        """The deletes and inserts in one lake transaction; the snapshot it made."""
        tgt = target(self.lake, d.name)

        def run(con: duckdb.DuckDBPyConnection) -> None:
            for kind, arg in statements:
                if kind == "delete_all":
                    text = f"DELETE FROM {tgt}"
                elif kind == "delete_keys":  # (temporary table, [(table column, its key column)])
                    table, cols = arg
                    on = (
                        " AND ".join(
                            f"{tgt}.{quote_ident(c)} IS NOT DISTINCT FROM __k.{quote_ident(k)}" for c, k in cols
                        )
                        or "TRUE"
                    )
                    text = f"DELETE FROM {tgt} USING temp.main.{quote_ident(table)} AS __k WHERE {on}"
                else:
                    text = f"INSERT INTO {tgt} {arg}"
                count = int(con.execute(text).fetchone()[0])
                if kind == "insert":
                    work.inserted += count
                else:
                    work.deleted += count

        made = commit_with(
            self.lake,
            run,
            f"dynamic table {d.name}: {work.mode.lower()} refresh",
            before_commit=self.before_commit,
            extra={
                "dynamic_table": d.name,
                "definition": d.definition_id,
                "read": read,
                "mode": work.mode,
                "trigger": trigger,
            },
        )
        return made.snapshot_id

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
                pass
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
        try:
            busy = KitError(
                f"dynamic table {d.name} is being refreshed by another process for over {LOCK_WAIT_S} s",
                "wait for it, or stop the other `dynamic run`",
            )
            with advisory_lock(self.lake.endpoints, lock_key(d.name), timeout_s=LOCK_WAIT_S, busy=busy):
                query = parse_query(d)
                plan = analyze(self.lake, query, d.name, d.columns)
                query = named(query, d.columns)
                now = self.lake.current_snapshot()
                if self.after_read is not None:
                    self.after_read(now)
                self._bind(d, query, now)
                commits = lake_commits(self.lake, d, d.data_snapshot)
                self.recover(d, plan.sources, commits)
                prev = reflected(self.lake, d, commits)
                out.read_snapshot = now
                out.snapshots_read = dict.fromkeys(plan.sources, now)
                out.data_timestamp = snapshot_time(self.lake, now)
                decided = None if prev == now else self.decide(d, query, plan, prev, now, temps)
                if decided is None:
                    out.status, out.mode, out.reason = (
                        NO_DATA,
                        None,
                        "no net change in the sources since the last refresh",
                    )
                else:
                    work, statements = decided
                    out.commit_snapshot = self.apply(d, work, statements, now, trigger)
                    out.status, out.mode, out.reason = SUCCEEDED, work.mode, work.reason
                    out.rows_inserted, out.rows_deleted = work.inserted, work.deleted
        except (KitError, duckdb.Error, psycopg.Error) as exc:  # the table fails, the batch goes on
            out.error = exc.line() if isinstance(exc, KitError) else first_line(exc)
            out.status = FAILED
        finally:
            self._drop_temps(temps)
            out.finished_at = datetime.now(UTC)
            out.duration_ms = round((time.perf_counter() - t0) * 1000, 1)
        return self.meta.record(out)


def new_definition_id() -> str:
    return uuid.uuid4().hex[:12]
