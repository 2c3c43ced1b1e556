"""The named queries in `queries/*.sql`, run against the lake and checked against the source files.

    for q in list_queries(): print(q.name, q.teaches)
    columns, rows, seconds = run_query(lake, "q1_trips_by_vendor")
    check_queries(lake, checks)        # one check per query: "query <name> matches the source"

The check is an independent computation. It does not read `trips`: a private DuckDB connection reads the raw
objects that `load_log.raw_uri` names (one read per load still in load_log, so a file loaded twice with
`--mode append` counts twice, as it does in the lake), conforms each with its own variant's column spellings
(`schema.detect_variant`), applies the quality rules re-implemented in SQL (`taxi.reference.REFERENCE_RULES`, not
the Spark code), joins the `zones` lookup and computes each aggregate with its own SQL (`REFERENCE_SQL`). The
lake's answer must equal it exactly: money and distances are summed as DECIMAL(18, 2) and averages and
percentages rounded to 2 decimals in both, so no floating-point summation order can differ. An average is the
lessons' own arithmetic in both, `avg` over those DECIMALs: an exact sum, then one division to DOUBLE (DuckDB 1.5.5
divides no DECIMAL exactly: `avg` and `/` both give DOUBLE), so both round the same DOUBLE. `sum(...) / count(*)`
divides another way and, on two days of the real samples, rounded exact averages of 3.035 and 18.885 down where the
lesson rounds them up. (The DOUBLE itself can fall below a tie: the real 2022-05-22 averages 4.015 miles, shown as
4.01 by both; exact decimal rounding would need an exact average in the lesson's SQL too.)

A dropped partition, a duplicated load, a row the loader kept or rejected wrongly, a shifted timestamp or a
wrong derived column (weekday, hour, date, year) makes the lake's answer differ from the reference.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ducklake_kit.checks import CheckRun
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.platforms.base import Endpoints
from ducklake_kit.platforms.state import project_root
from ducklake_kit.taxi.load import TRIPS, ZONES, dropped_table
from ducklake_kit.taxi.reference import NEEDED_COLUMNS, UnreadableSource, reference_connection, source_select

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
_QUARANTINE_CHECK = "quarantine reasons match the source"


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


def check_queries(
    lake: Lake, checks: CheckRun, names: list[str] | None = None
) -> dict[str, tuple[list[str], list[tuple], float]]:
    """Run each query (all by default) and check its answer equals the reference computed from the source files.

    Returns the lake's answers by name, (columns, rows, seconds), for rendering. With all queries, also checks
    that the quarantine holds, per reject_reason, exactly the rows the reference rules reject."""
    known = {q.name: q for q in list_queries()}
    for n in names or []:
        get_query(n)  # an unknown name is one clear error, before anything is read
    wanted = [get_query(n).name for n in names] if names else [n for n in known if n in REFERENCE_SQL]
    missing = [n for n in wanted if n not in REFERENCE_SQL]
    if missing:
        raise KitError(
            f"query '{missing[0]}' has no reference computation to check it against",
            f"checked queries: {', '.join(n for n in known if n in REFERENCE_SQL)}",
        )
    answers: dict[str, tuple[list[str], list[tuple], float]] = {}
    try:
        with checks.step("queries: reference from the source files"):
            ref = build_reference(lake)
    except UnreadableSource as exc:  # one failed check naming the file and the fix, and the lessons still run
        checks.true(
            "queries: the reference reads every loaded raw object", False, expected="readable", actual=exc.line()
        )
        return {name: run_query(lake, name) for name in wanted}
    try:
        for name in wanted:
            columns, rows, seconds = run_query(lake, name)
            answers[name] = (columns, rows, seconds)
            expected = ref.execute(REFERENCE_SQL[name]).fetchall()
            checks.equal(f"query {name} matches the source", rows, expected)
        if names is None:
            lake_reasons = lake.con.execute(
                f"SELECT reject_reason, count(*) FROM {lake.alias}.main.quarantine GROUP BY 1 ORDER BY 1"
            ).fetchall()
            ref_reasons = ref.execute(
                "SELECT reject_reason, count(*) FROM source_trips WHERE reject_reason IS NOT NULL GROUP BY 1 ORDER BY 1"
            ).fetchall()
            checks.equal(_QUARANTINE_CHECK, lake_reasons, ref_reasons)
    finally:
        ref.close()
    return answers


def run_queries(
    endpoints: Endpoints, platform_name: str, names: list[str] | None = None, *, check: bool = True
) -> tuple[dict[str, tuple[list[str], list[tuple], float]], CheckRun, dict[str, Any]]:
    """`query`: run the named queries (all by default), each checked against the source files unless `check` is
    off: (answers by name, the checks, the lake's catalog_info afterwards)."""
    run = CheckRun()
    with Lake(endpoints) as lake:
        if check:
            answers = check_queries(lake, run, names)
        else:
            answers = {n: run_query(lake, n) for n in (names or [x.name for x in list_queries()])}
        info = lake.catalog_info(platform_name)
    return answers, run, info


def answers_as_dict(answers: dict[str, tuple[list[str], list[tuple], float]]) -> dict[str, Any]:
    """{name: {columns, rows, seconds}} with rows as lists (the CLI makes dates and decimals JSON-safe)."""
    return {n: {"columns": c, "rows": [list(r) for r in rows], "seconds": s} for n, (c, rows, s) in answers.items()}
