"""The foundation's end-to-end check (what `all` runs until the taxi load lands):
up -> buckets -> a small table -> two inserts -> counts, snapshots, time travel, files on S3, catalog in PostgreSQL.

Expected figures are computed here in Python, independently of DuckDB.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.platforms import postgres, s3
from ducklake_kit.platforms.base import BUCKETS
from ducklake_kit.platforms.kit import Kit

TABLE = "foundation"  # lake.main.foundation: rebuilt by every run
BATCHES = ((0, 1000), (1000, 1500))  # id ranges of the two inserts; > the inlining limit, so Parquet files are written


def _amount(i: int) -> int:
    return (i * 7) % 1000  # the same formula as the SQL below


@dataclass(kw_only=True)
class FoundationResult(LessonResult):
    table: str
    snapshots: list[int]  # the two inserts' snapshots
    catalog_info: dict[str, Any] = field(default_factory=dict)  # the lake's, after the lesson

    def as_dict(self) -> dict[str, Any]:
        return {"table": self.table, "snapshots": self.snapshots, "catalog_info": self.catalog_info}


@lesson("foundation")
def run(kit: Kit, checks: CheckRun) -> FoundationResult:
    with checks.timed("up"):
        kit.platform.up()
    statuses = kit.platform.status()  # measured after `up`, by a fresh round trip to each service
    checks.true(
        "services answer (PostgreSQL query, S3 ListBuckets)",
        all(s.healthy for s in statuses),
        actual=", ".join(f"{s.name}: {s.detail}" for s in statuses),
    )
    ep = kit.platform.endpoints()
    with checks.timed("buckets"):
        buckets = s3.list_buckets(ep.s3)
    checks.true("buckets exist", set(BUCKETS) <= set(buckets), expected=list(BUCKETS), actual=buckets)

    snapshots: list[int] = []
    with checks.timed("create + 2 inserts"), Lake(ep) as lake:
        # kit_smoke: this table's name before 2026-11 (one name for the foundation everywhere); dropped so it is not left over
        lake.run(
            f"DROP TABLE IF EXISTS kit_smoke; DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (id BIGINT, amount BIGINT)"
        )
        created_at = lake.current_snapshot()
        for lo, hi in BATCHES:
            (res,) = lake.run(f"INSERT INTO {TABLE} SELECT i, (i * 7) % 1000 FROM range({lo}, {hi}) r(i)")
            checks.equal(f"insert {lo}..{hi - 1} reports its affected rows", res.affected_rows, hi - lo)
            snapshots.append(lake.current_snapshot())

    with checks.timed("checks"), Lake(ep) as lake:
        expected_rows, expected_sum = 0, 0
        checks.equal("each insert made one new snapshot", snapshots, [created_at + 1, created_at + 2])
        changes = dict(
            lake.con.execute(
                "SELECT snapshot_id, changes FROM ducklake_snapshots('lake') WHERE snapshot_id IN (?, ?)", snapshots
            ).fetchall()
        )
        checks.true(
            "both snapshots record an insert into the table",
            all("tables_inserted_into" in changes.get(s, {}) for s in snapshots),
            actual=changes,
        )
        checks.equal(
            "AT (VERSION => create snapshot) is empty",
            lake.scalar(f"SELECT count(*) FROM {TABLE} AT (VERSION => {created_at})"),
            0,
        )
        for (lo, hi), version in zip(BATCHES, snapshots, strict=False):
            expected_rows += hi - lo
            expected_sum += sum(_amount(i) for i in range(lo, hi))
            got = lake.con.execute(f"SELECT count(*), sum(amount) FROM {TABLE} AT (VERSION => {version})").fetchone()
            checks.equal(
                f"AT (VERSION => {version}): rows, sum(amount)", [got[0], int(got[1])], [expected_rows, expected_sum]
            )
        now = lake.con.execute(f"SELECT count(*), sum(amount) FROM {TABLE}").fetchone()
        checks.equal("current rows, sum(amount)", [now[0], int(now[1])], [expected_rows, expected_sum])

        files = lake.con.execute(
            f"SELECT data_file, data_file_size_bytes FROM ducklake_list_files('lake', '{TABLE}')"
        ).fetchall()
        client = s3.client(ep.s3)
        on_s3 = {}
        for path, size in files:
            bucket, _, key = path.removeprefix("s3://").partition("/")
            on_s3[path] = client.head_object(Bucket=bucket, Key=key)["ContentLength"] == size
        checks.true(
            "every data file is a Parquet object of the listed size in the lake bucket",
            len(files) == len(BATCHES) and all(on_s3.values()) and all(p.startswith(ep.data_path) for p in on_s3),
            expected=f"{len(BATCHES)} files under {ep.data_path}",
            actual=on_s3,
        )

        duck_snapshots = lake.scalar("SELECT count(*) FROM ducklake_snapshots('lake')")
        with postgres.connect(ep.pg) as pg:
            pg_snapshots = pg.execute("SELECT count(*) FROM ducklake_snapshot").fetchone()[0]
        checks.equal("the catalog in PostgreSQL holds the same snapshots DuckDB sees", pg_snapshots, duck_snapshots)
        info = lake.catalog_info(kit.platform.name)
    return FoundationResult(table=f"lake.main.{TABLE}", snapshots=snapshots, catalog_info=info)
