"""What changed in which table between two snapshots, from the catalog alone (one query), before any change feed is
read: DuckLake's `ducklake_table_changes` costs a dozen catalog round trips per table (~25 ms here even for one
inlined row), `ducklake_table_insertions` a few (~5 ms). So a refresh reads no feed for a source the catalog shows
unchanged, only the insertions of one that only gained rows, and the whole change feed otherwise.

Each snapshot's `changes_made` lists its changes, e.g. `inlined_insert:7,deleted_from_table:8,created_table:"s"."t"`.
Only two kinds say "rows were added to table N and nothing else happened to it": `inserted_into_table` and
`inlined_insert`. Any other kind that names a table (deletes, compaction, a flush of inlined data, ALTER, ...) sends
that table to the whole change feed; a snapshot without `changes_made`, or a kind naming no table id, sends every
table there (nothing is skipped on a guess)."""

from __future__ import annotations

from dataclasses import dataclass

from ducklake_kit.lake import Lake
from ducklake_kit.lake.changes import split_changes
from ducklake_kit.lake.sql import quote_ident

INSERT_KINDS = frozenset({"inserted_into_table", "inlined_insert"})
# kinds whose value is not a table id and that change no table's rows (a new schema or table: a source created in
# the range has a new table id, which the refresh sees and answers with a full refresh)
NO_ROWS = frozenset({"created_schema", "created_table", "created_view", "dropped_schema", "dropped_view"})
NONE, INSERTS, ANY = "none", "inserts", "any"
# kinds that only add or remove rows: every table keeps its id and its columns
ROWS_ONLY = INSERT_KINDS | {"deleted_from_table", "inlined_delete"}
# kinds after which every table still has the columns it had: rows came and went, or another table was created
SAME_SCHEMA = ROWS_ONLY | {"created_table", "created_schema"}


@dataclass(frozen=True)
class Changed:
    """How each table id changed in a range of snapshots: `kinds[id]` the change kinds naming it; `unknown` when some
    change could not be tied to a table (then every table counts as changed in any way)."""

    kinds: dict[int, frozenset[str]]
    unknown: bool
    inlined: dict[int, int]  # table id -> how many of its changes were inlined ones
    every: frozenset[str] = frozenset()  # every kind of change in the range

    @property
    def same_schema(self) -> bool:
        """Whether every table has the columns it had: the range only added and removed rows (or created tables)."""
        return not self.unknown and self.every <= SAME_SCHEMA

    @property
    def rows_only(self) -> bool:
        """Whether the range only added and removed rows: no table was created, dropped, renamed or altered, so every
        table has the id and columns it had (and the lake's schema version is the same at both ends)."""
        return not self.unknown and self.every <= ROWS_ONLY

    def inlined_changes(self, table_ids: list[int | None]) -> int:
        return sum(self.inlined.get(i, 0) for i in table_ids if i is not None)

    def inlined_only(self, table_ids: list[int]) -> bool:
        """Whether every change naming these tables is an inlined one (no data file written or deleted)."""
        return not self.unknown and all(k.startswith("inlined_") for i in table_ids for k in self.kinds.get(i, ()))

    def of(self, table_id: int | None) -> str:
        """NONE (no change at all), INSERTS (rows added, nothing else) or ANY."""
        if self.unknown or table_id is None:
            return ANY
        kinds = self.kinds.get(table_id)
        if not kinds:
            return NONE
        return INSERTS if kinds <= INSERT_KINDS else ANY


def changed(lake: Lake, start: int, end: int) -> Changed:
    """The changes of snapshots start..end (both included), by table id."""
    meta = quote_ident(f"__ducklake_metadata_{lake.alias}")
    rows = lake.con.execute(
        f"SELECT changes_made FROM {meta}.ducklake_snapshot_changes WHERE snapshot_id BETWEEN ? AND ?", [start, end]
    ).fetchall()
    return from_rows([r[0] for r in rows], start, end)


def from_rows(made_list: list[str | None], start: int, end: int) -> Changed:
    """`changed` from the `changes_made` of each snapshot of start..end, already read (one per snapshot)."""
    kinds: dict[int, set[str]] = {}
    every: set[str] = set()
    inlined: dict[int, int] = {}
    unknown = len(made_list) != end - start + 1  # snapshot ids are consecutive: one missing is a range not understood
    for made in made_list:
        if made is None:
            unknown = True
            continue
        for change in split_changes(made):
            kind, _, value = change.partition(":")
            every.add(kind)
            if kind in NO_ROWS:
                continue
            try:
                table = int(value)
            except ValueError:
                unknown = True
                continue
            kinds.setdefault(table, set()).add(kind)
            if kind.startswith("inlined_"):
                inlined[table] = inlined.get(table, 0) + 1
    return Changed({k: frozenset(v) for k, v in kinds.items()}, unknown, inlined, frozenset(every))


@dataclass(frozen=True)
class Size:
    """The catalog's estimate of a change against its sources, from file counts (no data read): `changed` rows
    added or removed in the range (files written, files and rows deleted; every inlined change counted at its
    table's inlining limit), `rows` the sources' live rows in files now."""

    changed: int
    rows: int

    @property
    def share(self) -> float:
        return self.changed / max(self.rows, 1)


INLINED_ROWS = 10  # DuckLake's default data-inlining limit: an inlined change holds at most this many rows
# (a dynamic table's own limit is refresh.INLINE_ROWS)


def size_sql(meta: str, table_ids: list[int], start: int, end: int) -> str:
    """The query of `size` (rows changed, live rows) over the catalog's tables in schema `meta` (quoted): the same
    text runs in DuckDB over the attached catalog and in PostgreSQL itself (`catalog.snapshots_since`)."""
    ids = ", ".join(str(int(i)) for i in table_ids)
    a, b = int(start), int(end)
    return f"""
        SELECT coalesce(sum(changed), 0) AS changed, coalesce(sum(live), 0) AS live FROM (
            SELECT record_count * ((begin_snapshot BETWEEN {a} AND {b})::INT
                                   + coalesce(end_snapshot BETWEEN {a} AND {b}, false)::INT) AS changed,
                   CASE WHEN end_snapshot IS NULL THEN record_count ELSE 0 END AS live
            FROM {meta}.ducklake_data_file WHERE table_id IN ({ids})
            UNION ALL
            SELECT CASE WHEN begin_snapshot BETWEEN {a} AND {b} THEN delete_count ELSE 0 END,
                   CASE WHEN end_snapshot IS NULL THEN -delete_count ELSE 0 END
            FROM {meta}.ducklake_delete_file WHERE table_id IN ({ids})) AS __size"""


def size(lake: Lake, table_ids: list[int], start: int, end: int, inlined: int = 0) -> Size:
    """How big the change of snapshots start..end to tables `table_ids` is against them (one catalog query);
    `inlined`: the rows its inlined changes may hold (`Changed.inlined_changes` x each table's inlining limit)."""
    if not table_ids:
        return Size(0, 0)
    row = lake.con.execute(size_sql(quote_ident(f"__ducklake_metadata_{lake.alias}"), table_ids, start, end)).fetchone()
    return sized(row, inlined)


def sized(row: tuple, inlined: int = 0) -> Size:
    """A Size from `size_sql`'s row (rows changed, live rows) and the rows the inlined changes may hold."""
    return Size(int(row[0]) + inlined, max(int(row[1]), 0))
