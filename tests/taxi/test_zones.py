"""A load writes the `zones` lookup without touching what is already right (taxi.load.write_zones): the same file
again changes no row (the snapshot's change feed has nothing for `zones`), a file with rows the table lacks adds
only those, and a table holding a row the file does not (a zone renamed) ends equal to the file. Each case compares
the table with the file itself (EXCEPT ALL both ways) and reads the change feed of the commit."""

from __future__ import annotations

import csv

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.taxi.load import ddl_statements, write_zones
from ducklake_kit.taxi.synthetic import write_zone_lookup

pytestmark = [pytest.mark.integration]
S = "zones_test"


def _commit(lake: Lake, path) -> int:
    """write_zones in a transaction of its own, as the load runs it; the snapshot it made (or the current one)."""
    lake.con.execute("BEGIN TRANSACTION")
    write_zones(lake.con, S, path)
    lake.con.execute("COMMIT")
    return lake.current_snapshot()


def _changes(lake: Lake, before: int, after: int) -> list[tuple[str, int]]:
    if after == before:  # the commit wrote nothing, so DuckLake made no snapshot
        return []
    return lake.con.execute(
        f"SELECT change_type, count(*) FROM ducklake_table_changes('{lake.alias}', '{S}', 'zones', ?, ?) "
        "GROUP BY ALL ORDER BY 1",
        [before + 1, after],
    ).fetchall()


def _equal_to_file(lake: Lake, path) -> bool:
    source = f"SELECT LocationID, Borough, Zone, service_zone FROM read_csv('{path}', header = true)"
    table = f"SELECT * FROM {S}.zones"
    return (
        lake.con.execute(
            f"SELECT (SELECT count(*) FROM ({table} EXCEPT ALL {source})) + (SELECT count(*) FROM ({source} EXCEPT ALL "
            f"{table}))"
        ).fetchone()[0]
        == 0
        and lake.con.execute(f"SELECT count(*) FROM {S}.zones").fetchone()[0] > 0
    )


def _rewrite(path, out, change) -> None:
    """A copy of the lookup file with `change(rows)` applied to its data rows."""
    with open(path, newline="", encoding="utf-8") as f:
        header, *rows = list(csv.reader(f))
    with open(out, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([header, *change(rows)])


def test_zones_change_only_where_the_file_does(stack, tmp_path):
    path = write_zone_lookup(tmp_path)
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}")
        for stmt in ddl_statements(S, frozenset()):
            lake.con.execute(stmt)
        start = lake.current_snapshot()
        first = _commit(lake, path)
        assert _equal_to_file(lake, path)
        inserted = _changes(lake, start, first)
        assert inserted == [("insert", lake.con.execute(f"SELECT count(*) FROM {S}.zones").fetchone()[0])]

        # the same file again: nothing of zones changes (the old DELETE + INSERT listed every row twice)
        again = _commit(lake, path)
        assert _equal_to_file(lake, path) and _changes(lake, first, again) == []

        # a file with one more zone: only that row is inserted
        more = tmp_path / "more.csv"
        _rewrite(path, more, lambda rows: [*rows, ["999", "Nowhere", "New Zone", "Boro Zone"]])
        added = _commit(lake, more)
        assert _equal_to_file(lake, more) and _changes(lake, again, added) == [("insert", 1)]

        # a zone renamed (the table holds a row the file does not): the table ends equal to the file
        renamed = tmp_path / "renamed.csv"
        _rewrite(more, renamed, lambda rows: [[r[0], r[1], "Renamed", r[3]] if r[0] == "999" else r for r in rows])
        _commit(lake, renamed)
        assert _equal_to_file(lake, renamed)
        assert lake.con.execute(f"SELECT zone FROM {S}.zones WHERE location_id = 999").fetchall() == [("Renamed",)]
        lake.run(f"DROP SCHEMA {S} CASCADE")
