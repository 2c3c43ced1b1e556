"""The reference reader: one raw object read by DuckDB and conformed to the lake's columns, with the quality
rules re-implemented in SQL, independently of the Spark code under test. The load's checks (`taxi.verify`) and
the query lessons' reference (`lessons.queries`) both read the raw files through it, so they cannot drift apart.

A row's reject_reason is the first rule it breaks, as in `transforms.QUALITY_RULES` (a NULL comparison breaks
none); `{start}`/`{end}` bound the load's period, and a load without one (period 'any') has no period rule.
"""

from __future__ import annotations

import re

import duckdb

from ducklake_kit.errors import KitError, first_line
from ducklake_kit.lake import connect_config, load_statements, secret_statements
from ducklake_kit.lake.sql import quote_literal as _sql_str
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.taxi import schema

# The quality rules of `transforms.QUALITY_RULES`, written again in DuckDB SQL over conformed source rows.
# Same codes, same order: a row's reject_reason is the first rule it breaks (a NULL comparison breaks none).
# `{start}`/`{end}` bound the load's period; a load without one (period 'any') has no period rule.
MAX_DISTANCE_MILES = 500
MAX_DURATION_US = 24 * 3600 * 1_000_000
REFERENCE_RULES: list[tuple[str, str]] = [
    ("missing_timestamp", "pickup_at IS NULL OR dropoff_at IS NULL"),
    ("pickup_outside_period", "pickup_at < {start} OR pickup_at >= {end}"),
    ("dropoff_before_pickup", "dropoff_at < pickup_at"),
    ("duration_over_24h", f"epoch_us(dropoff_at) - epoch_us(pickup_at) > {MAX_DURATION_US}"),
    ("negative_amount", "fare_amount < 0 OR total_amount < 0"),
    ("bad_distance", f"trip_distance IS NULL OR trip_distance < 0 OR trip_distance > {MAX_DISTANCE_MILES}"),
    (
        "bad_location",
        "pu_location_id IS NULL OR pu_location_id NOT BETWEEN 1 AND 265 "
        "OR do_location_id IS NULL OR do_location_id NOT BETWEEN 1 AND 265",
    ),
]

# The canonical columns the queries and the rules need, with the type the lake stores them as.
NEEDED_COLUMNS = {
    "vendor_id": "INTEGER",
    "pickup_at": "TIMESTAMP",
    "dropoff_at": "TIMESTAMP",
    "passenger_count": "INTEGER",
    "trip_distance": "DOUBLE",
    "ratecode_id": "INTEGER",
    "pu_location_id": "INTEGER",
    "do_location_id": "INTEGER",
    "payment_type": "INTEGER",
    "fare_amount": "DOUBLE",
    "tip_amount": "DOUBLE",
    "total_amount": "DOUBLE",
}
_INTEGER_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
# A zone or UTC label after a CSV clock reading ("2022-03-02 15:25:57+00:00"): dropped, the reading kept.
_ZONE_LABEL = r"\s*(Z|UTC|[+-]\d{2}(:?\d{2})?)$"

# The CSV dialect Spark reads (comma, double quotes, a doubled quote inside quotes), set instead of sniffed:
# DuckDB's sniffer gives up on mixed line endings (the real gx samples 2019-01 and 2019-02 end every line in CRLF
# but the last in LF), which Spark reads; strict_mode = false takes both line endings, as Spark does. Strings, as
# Spark reads CSV.
CSV_DIALECT = "header = true, all_varchar = true, delim = ',', quote = '\"', escape = '\"', strict_mode = false"


def _relation(raw_uri: str) -> str:
    if raw_uri.lower().endswith((".csv", ".csv.gz")):
        return f"read_csv({_sql_str(raw_uri)}, {CSV_DIALECT})"
    return f"read_parquet({_sql_str(raw_uri)})"


class UnreadableSource(KitError):
    """A raw object the reference reader cannot read: the checks that need it fail, with this reason."""


def _floor_div_1000(expr: str) -> str:
    return f"(({expr}) - ((({expr}) % 1000) + 1000) % 1000) // 1000"  # exact floor, also before 1970


def _conformed(column: str | None, source_type: str | None, target: str) -> str:
    """A source column as the lake stores it: the same value Spark's conform gives, computed by DuckDB."""
    if column is None:
        return f"CAST(NULL AS {target})"
    c = '"' + column.replace('"', '""') + '"'
    t = (source_type or "").upper()
    if target == "TIMESTAMP":  # the wall clock the source shows, never shifted by a time zone
        if t == "TIMESTAMP":
            return c
        if t in ("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"):
            return f"make_timestamp(epoch_us({c}))"  # an instant labelled UTC: its UTC reading is the clock
        if t == "TIMESTAMP_NS":
            return f"make_timestamp({_floor_div_1000(f'epoch_ns({c})')})"  # sub-microsecond digits dropped
        if t in ("TIMESTAMP_MS", "TIMESTAMP_S", "DATE"):
            return f"CAST({c} AS TIMESTAMP)"
        if t == "BIGINT":  # INT64 epoch nanoseconds, as Spark reads TIMESTAMP(NANOS)
            return f"make_timestamp({_floor_div_1000(c)})"
        if t == "VARCHAR":
            return f"CAST(regexp_replace(trim({c}), {_sql_str(_ZONE_LABEL)}, '') AS TIMESTAMP)"
        raise KitError(
            f"cannot read a timestamp from a {source_type} column ({column})",
            "this source type is unknown to the reference; report it",
        )
    if target == "INTEGER" and t not in _INTEGER_TYPES:
        return f"CAST(trunc(CAST({c} AS DOUBLE)) AS INTEGER)"  # codes stored as 1.0 or '1.0': Spark truncates
    return f"CAST({c} AS {target})"


def _period_bounds(period: str) -> tuple[str, str] | None:
    """[start, end) of a load's period as TIMESTAMP literals: 'YYYY-MM', 'YYYY', or None for 'any'."""
    m = re.fullmatch(r"(\d{4})(?:-(\d{2}))?", period or "")
    if not m:
        return None
    year, month = int(m.group(1)), int(m.group(2)) if m.group(2) else None
    if month is None:
        start, end = (year, 1), (year + 1, 1)
    else:
        start, end = (year, month), (year + month // 12, month % 12 + 1)
    return (
        f"TIMESTAMP '{start[0]:04d}-{start[1]:02d}-01 00:00:00'",
        f"TIMESTAMP '{end[0]:04d}-{end[1]:02d}-01 00:00:00'",
    )


def reject_reason_sql(period: str, rules: list[tuple[str, str]] | None = None) -> str:
    """CASE expression giving the first broken rule of REFERENCE_RULES (NULL for a good row)."""
    bounds = _period_bounds(period)
    whens = []
    for code, predicate in rules or REFERENCE_RULES:
        if "{start}" in predicate:
            if bounds is None:
                continue  # no period: nothing is outside it
            predicate = predicate.format(start=bounds[0], end=bounds[1])
        whens.append(f"WHEN {predicate} THEN '{code}'")
    return "CASE " + " ".join(whens) + " END"


def source_select(
    con: duckdb.DuckDBPyConnection, raw_uri: str, period: str, columns: dict[str, str] | None = None
) -> str:
    """SELECT over one raw object: the needed canonical columns (or `columns`, name -> lake type) plus reject_reason."""
    rel = _relation(raw_uri)
    try:
        described = con.execute(f"DESCRIBE SELECT * FROM {rel}").fetchall()
    except duckdb.Error as exc:
        why = first_line(exc)
        if any(s in why for s in ("404", "No files found", "not found", "does not exist")):
            raise UnreadableSource(
                f"the raw object {raw_uri} that load_log names is gone ({why})",
                "the raw bucket must keep every loaded file: reload it with `load --mode replace` "
                "(it lands the file again)",
            ) from None
        raise UnreadableSource(
            f"the reference reader cannot read the raw object {raw_uri} ({why})",
            "the lake holds what Spark loaded from it, unchecked: `query --no-check` still runs "
            "the lessons; report the file so that the reference reader learns its format",
        ) from None
    types = {r[0]: r[1] for r in described}
    variant = schema.detect_variant([r[0] for r in described], source=raw_uri)
    source_of = {canon: src for src, canon in variant.mapping}
    cols = ", ".join(
        f"{_conformed(source_of.get(n), types.get(source_of.get(n, '')), t)} AS {n}"
        for n, t in (columns or NEEDED_COLUMNS).items()
    )
    return f"SELECT *, {reject_reason_sql(period)} AS reject_reason FROM (SELECT {cols} FROM {rel})"


def reference_connection(endpoints: Endpoints) -> duckdb.DuckDBPyConnection:
    """A private in-memory DuckDB with httpfs and the S3 secret only: it cannot see the lake."""
    con = duckdb.connect(config=connect_config())
    for stmt in [*load_statements(), secret_statements(endpoints)[0]]:
        con.execute(stmt)
    return con
