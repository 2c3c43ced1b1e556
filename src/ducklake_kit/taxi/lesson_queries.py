"""The SQL lessons' catalog: the named queries in `queries/*.sql` and, for each, its reference computation from
the raw source files. Both the query lessons (lessons/queries.py, which check every answer) and the queries
benchmark (bench/queries.py) read it, so it lives below both.

    for q in list_queries(): print(q.name, q.teaches)
    columns, rows, seconds = run_query(lake, "q1_trips_by_vendor")
    ref = build_reference(lake); ref.execute(REFERENCE_SQL["daily_summary"])

The reference does not read `trips`: see lessons/queries.py for what it computes and why it is exact.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.platforms.state import project_root
from ducklake_kit.taxi.load import TRIPS, ZONES, dropped_table
from ducklake_kit.taxi.reference import NEEDED_COLUMNS, reference_connection, source_select

QUERIES_DIR = (project_root() or Path.cwd()) / "queries"
_FILE_NAME = re.compile(r"^(\d+)_(\w+)\.sql$")


@dataclass(frozen=True)
class Query:
    name: str  # the file name without its number and .sql: `query daily_summary`
    path: Path
    teaches: str  # the leading `--` comment, joined into one paragraph
    sql: str


def _parse(path: Path) -> Query:
    m = _FILE_NAME.match(path.name)
    sql = path.read_text(encoding="utf-8")
    comment = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        comment.append(line[2:].strip())
    return Query(m.group(2) if m else path.stem, path, " ".join(c for c in comment if c), sql)


def list_queries(directory: Path | None = None) -> list[Query]:
    """Every `NN_name.sql` in the queries folder, in file-name (lesson) order."""
    folder = directory or QUERIES_DIR
    if not folder.is_dir():
        raise KitError(f"no queries folder at {folder}", "run from the ducklake-kit checkout (its queries/ folder)")
    return [_parse(p) for p in sorted(folder.glob("*.sql"))]


def get_query(name: str, directory: Path | None = None) -> Query:
    """A query by name (`daily_summary`) or file stem (`05_daily_summary`); unknown names list the known ones."""
    queries = list_queries(directory)
    for q in queries:
        if name in (q.name, q.path.stem):
            return q
    raise KitError(f"unknown query '{name}'", f"choose one of: {', '.join(q.name for q in queries)}")


def run_query(lake: Lake, name: str) -> tuple[list[str], list[tuple], float]:
    """Run a named query on the lake: (column names, rows, seconds)."""
    q = get_query(name)
    start = time.perf_counter()
    try:
        results = lake.run(q.sql)
    except KitError as exc:  # say which file holds the failing SQL, or that a table it reads was dropped
        try:
            gone = next((g for g in (dropped_table(lake, t) for t in (TRIPS, ZONES)) if g is not None), None)
        except Exception:  # noqa: BLE001 - the connection itself failed: the original error says why
            gone = None
        if gone is not None:
            raise gone from None
        raise KitError(f"query {q.name} ({q.path.name}): {exc.what}", exc.fix) from None
    seconds = time.perf_counter() - start
    last = results[-1]
    return last.columns, list(last.rows), round(seconds, 4)


# --- The reference: the same answers computed from the raw source files ------------------------------------

# Each query's answer, from `source_trips` (conformed source rows with their reject_reason) and `zones`.
# Written separately from queries/*.sql and from the source columns only: the year, date, hour and weekday
# come from pickup_at here, where the queries read the columns Spark derived.
_ACCEPTED = "(SELECT * FROM source_trips WHERE reject_reason IS NULL)"
_D2 = "DECIMAL(18, 2)"


def _avg2(column: str) -> str:
    """An average as the lessons compute it: DuckDB's avg of the DECIMAL(18, 2) values, rounded to 2 decimals."""
    return f"round(avg(CAST({column} AS {_D2})), 2)"


REFERENCE_SQL: dict[str, str] = {
    "q1_trips_by_vendor": f"""
        SELECT vendor_id, count(*) FROM {_ACCEPTED} GROUP BY 1 ORDER BY 1 NULLS FIRST""",
    "q2_avg_total_by_passenger_count": f"""
        SELECT passenger_count, count(*), {_avg2("total_amount")}
        FROM {_ACCEPTED} GROUP BY 1 ORDER BY 1 NULLS FIRST""",
    "q3_trips_by_passenger_count_and_year": f"""
        SELECT passenger_count, year(pickup_at) AS y, count(*) FROM {_ACCEPTED} GROUP BY 1, 2
        ORDER BY y, passenger_count NULLS FIRST""",
    "q4_trips_by_passenger_count_year_distance": f"""
        SELECT passenger_count, year(pickup_at) AS y, CAST(round(trip_distance) AS INTEGER) AS d, count(*) AS n
        FROM {_ACCEPTED} GROUP BY 1, 2, 3 ORDER BY y, n DESC, passenger_count NULLS FIRST, d""",
    "daily_summary": f"""
        SELECT CAST(pickup_at AS DATE) AS day, count(*),
               {_avg2("trip_distance")}, {_avg2("total_amount")}, sum(CAST(total_amount AS {_D2}))
        FROM {_ACCEPTED} GROUP BY day ORDER BY day""",
    "top_pickup_zones": f"""
        WITH by_zone AS (SELECT pu_location_id AS id, count(*) AS n, sum(CAST(total_amount AS {_D2})) AS revenue
                         FROM {_ACCEPTED} GROUP BY id)
        SELECT by_zone.id, zones.borough, zones.zone, n, revenue
        FROM by_zone LEFT JOIN zones ON zones.location_id = by_zone.id
        ORDER BY revenue DESC, by_zone.id LIMIT 10""",
    "hourly_demand_by_weekday": f"""
        WITH counts AS (SELECT isodow(pickup_at) AS wd, dayname(pickup_at) AS day, hour(pickup_at) AS h, count(*) AS n
                        FROM {_ACCEPTED} GROUP BY 1, 2, 3),
             per_day AS (SELECT wd, sum(n) AS day_n FROM counts GROUP BY wd)
        SELECT wd, day, h, n, round(100.0 * n / day_n, 2)
        FROM counts JOIN per_day USING (wd) ORDER BY wd, h""",
    "tip_share_by_payment_type": f"""
        SELECT payment_type,
               CASE payment_type WHEN 0 THEN 'Flex Fare' WHEN 1 THEN 'Credit card' WHEN 2 THEN 'Cash'
                    WHEN 3 THEN 'No charge' WHEN 4 THEN 'Dispute' WHEN 5 THEN 'Unknown' WHEN 6 THEN 'Voided' END,
               count(*), sum(CAST(tip_amount AS {_D2})),
               round(100 * sum(CAST(tip_amount AS {_D2})) / nullif(sum(CAST(total_amount AS {_D2})), 0), 2),
               round(100.0 * sum(CASE WHEN tip_amount > 0 THEN 1 ELSE 0 END) / count(*), 2)
        FROM {_ACCEPTED} GROUP BY payment_type ORDER BY payment_type NULLS FIRST""",
    "airport_trips": f"""
        WITH airports(id, code) AS (VALUES (1, 'EWR'), (132, 'JFK'), (138, 'LGA')),
             legs AS (SELECT a.code, l.leg, t.*
                      FROM {_ACCEPTED} AS t
                      CROSS JOIN (VALUES ('pickup'), ('dropoff')) AS l(leg)
                      JOIN airports AS a ON a.id = CASE l.leg WHEN 'pickup' THEN t.pu_location_id ELSE t.do_location_id END)
        SELECT code, leg, count(*), sum(CASE WHEN ratecode_id = 2 OR ratecode_id = 3 THEN 1 ELSE 0 END),
               {_avg2("trip_distance")}, sum(CAST(total_amount AS {_D2}))
        FROM legs GROUP BY code, leg ORDER BY code, leg""",
}


def build_reference(lake: Lake) -> duckdb.DuckDBPyConnection:
    """The reference connection with `source_trips` (every row of every load in load_log, conformed, with
    reject_reason) and `zones` (copied from the lake's lookup)."""
    if not table_exists(lake.con, lake.alias, "main", "load_log"):
        raise KitError("the lake holds no loads yet, so there is nothing to query", "run `load` first")
    loads = lake.con.execute(
        f"SELECT raw_uri, period FROM {lake.alias}.main.load_log ORDER BY load_id, raw_uri"
    ).fetchall()
    zones = lake.con.execute(f"SELECT location_id, borough, zone FROM {lake.alias}.main.zones").to_arrow_table()
    con = reference_connection(lake.endpoints)
    try:
        con.register("zones_in", zones)
        con.execute("CREATE TABLE zones AS SELECT * FROM zones_in")
        con.unregister("zones_in")
        empty = (
            "SELECT "
            + ", ".join(f"CAST(NULL AS {t}) AS {n}" for n, t in NEEDED_COLUMNS.items())
            + ", CAST(NULL AS VARCHAR) AS reject_reason WHERE false"
        )
        parts = [source_select(con, uri, period) for uri, period in loads] or [empty]
        con.execute("CREATE TABLE source_trips AS " + "\nUNION ALL ".join(parts))
    except BaseException:
        con.close()
        raise
    return con
