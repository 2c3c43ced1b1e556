"""What the lake holds: its tables, a fingerprint of each (equal rows give equal fingerprints, whatever the
files look like), its snapshots, the files the current snapshot references, the rows inlined in the catalog,
and the objects on S3 under its data path. Maintenance checks itself with these; so can anything that rewrites
files and promises the same answers."""

from __future__ import annotations

import re
from typing import Any

import duckdb
from botocore.exceptions import BotoCoreError, ClientError

from ducklake_kit.errors import KitError
from ducklake_kit.lake import sql
from ducklake_kit.lake.connection import Lake
from ducklake_kit.platforms import s3
from ducklake_kit.platforms.base import Endpoints


def tables(lake: Lake) -> list[tuple[str, str]]:
    """(schema, table) of every table in the lake."""
    return sql.tables(lake.con, lake.alias)


def fingerprint(lake: Lake, version: int | None = None) -> dict[str, list]:
    """Per table: [rows, sum of row hashes] - equal multisets of rows give equal fingerprints, in any order
    and whatever the files look like (merged, flushed, rewritten)."""
    at = f" AT (VERSION => {int(version)})" if version is not None else ""
    out = {}
    for schema_name, table in tables(lake):
        try:
            n, h = lake.con.execute(
                f"SELECT count(*), sum(hash(t)::HUGEINT) FROM {sql.qualified(schema_name, table)} AS t{at}"
            ).fetchone()
        except duckdb.CatalogException:  # the table did not exist yet at that version
            continue
        out[f"{schema_name}.{table}"] = [int(n), str(h or 0)]
    return out


def snapshot_ids(lake: Lake) -> list[int]:
    return [
        r[0]
        for r in lake.con.execute("SELECT snapshot_id FROM ducklake_snapshots(?) ORDER BY 1", [lake.alias]).fetchall()
    ]


def _bucket_prefix(ep: Endpoints) -> tuple[str, str]:
    m = re.match(r"s3://([^/]+)/?(.*)$", ep.data_path)
    if not m:
        raise KitError(f"the data path {ep.data_path} is not on S3", "maintain lists the lake's files on S3")
    return m.group(1), m.group(2)


def s3_objects(ep: Endpoints) -> dict[str, int]:
    """Every object under the lake's data path: s3 URI -> size in bytes."""
    bucket, prefix = _bucket_prefix(ep)
    client = s3.client(ep.s3)
    out = {}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                out[f"s3://{bucket}/{obj['Key']}"] = int(obj["Size"])
    except (BotoCoreError, ClientError) as exc:
        raise s3.explain(ep.s3, exc) from None
    return out


def delete_s3_objects(ep: Endpoints, uris: list[str]) -> None:
    """Delete these objects (s3://bucket/key) with the kit's credentials."""
    client = s3.client(ep.s3)
    try:
        for uri in uris:
            m = re.match(r"s3://([^/]+)/(.+)$", uri)
            if not m:
                raise KitError(f"{uri} is not an S3 object of the lake", "report it")
            client.delete_object(Bucket=m.group(1), Key=m.group(2))
    except (BotoCoreError, ClientError) as exc:
        raise s3.explain(ep.s3, exc) from None


def referenced_files(lake: Lake) -> set[str]:
    """Data and delete files the current snapshot needs."""
    out: set[str] = set()
    for schema_name, table in tables(lake):
        for data, delete in lake.con.execute(
            "SELECT data_file, delete_file FROM ducklake_list_files(?, ?, schema => ?)",
            [lake.alias, table, schema_name],
        ).fetchall():
            out.add(data)
            if delete:
                out.add(delete)
    return out


def inlined_rows(lake: Lake) -> dict[str, int]:
    """Live rows kept in the catalog (data inlining) per table, from the catalog's inlined-data tables."""
    meta = f"__ducklake_metadata_{lake.alias}"
    names = {
        tid: f"{s}.{t}"
        for tid, s, t in lake.con.execute(
            f"SELECT t.table_id, s.schema_name, t.table_name FROM {meta}.ducklake_table t JOIN {meta}.ducklake_schema s "
            "USING (schema_id) WHERE t.end_snapshot IS NULL AND s.end_snapshot IS NULL"
        ).fetchall()
    }
    out: dict[str, int] = {}
    for tid, inlined in lake.con.execute(
        f"SELECT table_id, table_name FROM {meta}.ducklake_inlined_data_tables"
    ).fetchall():
        if tid in names:
            n = int(lake.scalar(f"SELECT count(*) FROM {meta}.{inlined} WHERE end_snapshot IS NULL"))
            if n:
                out[names[tid]] = out.get(names[tid], 0) + n
    return out


def inventory(lake: Lake, ep: Endpoints) -> dict[str, Any]:
    """File counts and bytes: what the current snapshot references (catalog) and what is on S3."""
    info = lake.con.execute(
        "SELECT sum(file_count), sum(file_size_bytes), sum(delete_file_count), sum(delete_file_size_bytes) "
        "FROM ducklake_table_info(?)",
        [lake.alias],
    ).fetchone()
    objects = s3_objects(ep)
    snaps = snapshot_ids(lake)
    return {
        "snapshots": len(snaps),
        "oldest_snapshot": snaps[0] if snaps else None,
        "current_snapshot": snaps[-1] if snaps else None,
        "catalog_data_files": int(info[0] or 0),
        "catalog_data_bytes": int(info[1] or 0),
        "catalog_delete_files": int(info[2] or 0),
        "catalog_delete_bytes": int(info[3] or 0),
        "inlined_rows": sum(inlined_rows(lake).values()),
        "s3_files": len(objects),
        "s3_bytes": sum(objects.values()),
    }
