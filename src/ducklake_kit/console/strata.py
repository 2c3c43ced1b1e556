"""A table's data files as strata (the Lake page): each Parquet file the catalog lists for the table
(`ducklake_data_file`: its rows, its size, the snapshot that added it and the one that removed it), drawn as a stacked
bar per snapshot at which the table's files changed, one layer per snapshot that added files. A compaction ends
lower layers and lays a new one; a file a snapshot removed is gone from the bars after it. Read from PostgreSQL in a
read-only transaction, as the raw catalog tables are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ducklake_kit.errors import KitError
from ducklake_kit.lake.connection import Lake
from ducklake_kit.platforms import postgres

FILES_SQL = """
SELECT f.data_file_id, f.path, f.record_count, f.file_size_bytes, f.begin_snapshot, f.end_snapshot
FROM ducklake_data_file f
JOIN ducklake_table t ON t.table_id = f.table_id AND t.end_snapshot IS NULL
JOIN ducklake_schema s ON s.schema_id = t.schema_id AND s.end_snapshot IS NULL
WHERE s.schema_name = %s AND t.table_name = %s
ORDER BY f.begin_snapshot, f.data_file_id
"""


@dataclass
class DataFile:
    file_id: int
    path: str
    rows: int
    size_bytes: int
    begin_snapshot: int
    end_snapshot: int | None  # None: still part of the table

    def alive_at(self, snapshot: int) -> bool:
        return self.begin_snapshot <= snapshot and (self.end_snapshot is None or snapshot < self.end_snapshot)


@dataclass
class Strata:
    table: str
    files: list[DataFile]
    snapshots: list[int]  # the x axis: each snapshot at which a file was added or removed, and the latest
    layers: dict[int, list[int]]  # the snapshot that added a layer's files -> its rows alive at each x snapshot


def data_files(lake: Lake, table: str) -> Strata:
    """The data files of `table` ('schema.table'; a bare name is in main) and their strata."""
    schema, _, name = table.rpartition(".")
    schema = schema or "main"
    conn = postgres.connect(lake.endpoints.pg)
    conn.autocommit = False
    conn.read_only = True  # PostgreSQL refuses any write on this connection
    with conn:
        rows = conn.execute(FILES_SQL, [schema, name]).fetchall()
        known = conn.execute(
            "SELECT count(*) FROM ducklake_table t JOIN ducklake_schema s ON s.schema_id = t.schema_id "
            "WHERE s.schema_name = %s AND t.table_name = %s AND t.end_snapshot IS NULL AND s.end_snapshot IS NULL",
            [schema, name],
        ).fetchone()[0]
        latest = conn.execute("SELECT max(snapshot_id) FROM ducklake_snapshot").fetchone()[0]
    if not known:
        raise KitError(f"the lake has no table {schema}.{name}", "choose one of the Tables list")
    files = [
        DataFile(int(r[0]), r[1], int(r[2]), int(r[3]), int(r[4]), None if r[5] is None else int(r[5])) for r in rows
    ]
    return strata_of(f"{schema}.{name}", files, int(latest or 0))


def strata_of(table: str, files: list[DataFile], latest: int) -> Strata:
    points = {f.begin_snapshot for f in files} | {f.end_snapshot for f in files if f.end_snapshot is not None}
    snapshots = sorted(points | ({latest} if files else set()))
    layers: dict[int, list[int]] = {}
    for begin in sorted({f.begin_snapshot for f in files}):
        own = [f for f in files if f.begin_snapshot == begin]
        layers[begin] = [sum(f.rows for f in own if f.alive_at(s)) for s in snapshots]
    return Strata(table, files, snapshots, layers)


def chart_options(strata: Strata) -> dict[str, Any]:
    """ECharts options: a stacked bar per snapshot, a layer (series) per snapshot that added files."""
    return {
        "animation": False,
        "tooltip": {"trigger": "axis"},
        "legend": {"type": "scroll", "data": [f"added at {b}" for b in strata.layers]},
        "xAxis": {"type": "category", "name": "snapshot", "data": [str(s) for s in strata.snapshots]},
        "yAxis": {"type": "value", "name": "rows in files"},
        "series": [
            {"name": f"added at {b}", "type": "bar", "stack": "files", "data": rows}
            for b, rows in strata.layers.items()
        ],
    }
