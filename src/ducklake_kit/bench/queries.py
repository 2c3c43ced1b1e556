"""`bench --suite queries`: the same trips, the same SQL, three engines, measured side by side in one run.

(a) DuckDB on the DuckLake tables (`lake.bench.trips`: catalog in PostgreSQL, Parquet on S3);
(b) DuckDB on the same Parquet files, read as plain Parquet from the S3 server (`read_parquet` over the list of
    the lake's own data files): the same bytes, files and row groups, so (a) / (b) is what DuckLake itself
    costs (catalog round trips per query, its scan) and nothing else. An export of the table would be written
    with another layout (the lake's files come from Spark tasks, an export from DuckDB's threads), which can
    make either side faster for reasons that are not DuckLake's;
(c) Spark SQL on the same rows exported as Parquet to a local folder (Spark has no S3A jars offline).

The SQL is the learner's: the checked queries of `queries/*.sql` (the four classic taxi queries and the
aggregations), run unchanged on (a) and (b) and with one dialect fix on (c) (see `spark_sql`). For each query:
a warm-up run of every engine, then `runs` timed rounds in which the engines take turns so a busy machine
slows all three alike: Spark first, then the two DuckDB engines in alternating order (a, b then b, a), after a
short pause, so neither DuckDB engine always runs right after the JVM. The warm-up answers must agree (`compare`).

The fixed cost of a DuckLake query is measured on its own (`fixed_cost`): `SELECT 1 FROM trips LIMIT 0` on
(a) and (b), and the catalog statements a query sends (`pg_debug_show_queries`).
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from ducklake_kit.bench.results import BENCH_SCHEMA, NOT_WRITTEN, Machine, Outputs, load_average, write_outputs
from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.profile import catalog_statements
from ducklake_kit.lake.sql import quote_literal, table_exists
from ducklake_kit.platforms import s3
from ducklake_kit.platforms.base import RAW_BUCKET, Platform
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.taxi import lesson_queries as queries_mod
from ducklake_kit.taxi import sources
from ducklake_kit.taxi import spark as spark_mod
from ducklake_kit.taxi.load import LoadInput, run_load

ROWS_PER_FILE = 2_500_000  # as `bench --suite load`, so both suites share the generated months (and the cache)
SEED = 42
GOAL_LAKE_TO_PARQUET = 1.05  # DuckLake at most 5% slower than plain Parquet
GOAL_SPEEDUP_VS_SPARK = 10.0  # DuckDB on DuckLake at least 10x faster than Spark SQL
ENGINES = ("ducklake", "parquet", "spark")
ENGINE_LABELS = {
    "ducklake": "DuckDB on DuckLake",
    "parquet": "DuckDB on Parquet (S3)",
    "spark": "Spark SQL on Parquet (local)",
}
_BENCH_TABLES = ("trips", "quarantine", "zones", "load_log")
_HIVE = "hive_partitioning = true, hive_types = {'pickup_year': INTEGER, 'pickup_month': INTEGER}"
SETTLE_AFTER_SPARK_S = 0.05


@dataclass
class EngineStats:
    """One engine's timed runs of one query."""

    median_s: float
    min_s: float
    max_s: float
    rows_per_s: int | None  # rows of the table over the median: a scan rate, comparable across queries
    runs_s: list[float]


@dataclass
class QueryFigures:
    name: str
    file: str
    result_rows: int
    engines: dict[str, EngineStats]  # by ENGINES
    ratio_ducklake_to_parquet: float
    speedup_vs_spark: float
    answers_agree: bool
    differences: dict[str, str] = field(default_factory=dict)  # engine -> the first difference from DuckLake's answer

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "result_rows": self.result_rows,
            **{e: asdict(st) for e, st in self.engines.items()},
            "ratio_ducklake_to_parquet": self.ratio_ducklake_to_parquet,
            "speedup_vs_spark": self.speedup_vs_spark,
            "answers_agree": self.answers_agree,
            "differences": self.differences,
        }


@dataclass
class Totals:
    """Over all queries: each engine's sum of medians, their ratios (sum over sum), and the goals they meet."""

    total_median_s: dict[str, float]
    ratio_ducklake_to_parquet: float
    speedup_vs_spark: float
    ratio_met: bool
    speedup_met: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_median_s": self.total_median_s,
            "ratio_ducklake_to_parquet": self.ratio_ducklake_to_parquet,
            "speedup_vs_spark": self.speedup_vs_spark,
            "goals": {
                "ratio_ducklake_to_parquet_max": GOAL_LAKE_TO_PARQUET,
                "speedup_vs_spark_min": GOAL_SPEEDUP_VS_SPARK,
                "ratio_met": self.ratio_met,
                "speedup_met": self.speedup_met,
            },
        }


@dataclass
class QueriesRun:
    rows_requested: int
    table_rows: int
    machine: Machine
    runs: int
    warmup: int
    data: dict[str, Any]  # where each engine's rows live: files, row groups, bytes (a description, printed as JSON)
    queries: list[QueryFigures]
    totals: Totals
    fixed_cost: dict[str, Any]  # the probe's times and the catalog statements a query sends (a description)

    @property
    def answers_agree(self) -> bool:
        return all(q.answers_agree for q in self.queries)

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": "queries",
            "rows_requested": self.rows_requested,
            "table_rows": self.table_rows,
            **self.machine.as_dict(),
            "runs": self.runs,
            "warmup": self.warmup,
            "engines": ENGINE_LABELS,
            "data": self.data,
            "queries": [q.as_dict() for q in self.queries],
            **self.totals.as_dict(),
            "answers_agree": self.answers_agree,
            "fixed_cost": self.fixed_cost,
        }


def round_order(i: int) -> tuple[str, ...]:
    """Round i of the timed runs: Spark, then the DuckDB engines, DuckLake first in even rounds, last in odd ones."""
    return ("spark", "ducklake", "parquet") if i % 2 == 0 else ("spark", "parquet", "ducklake")


def months(n: int) -> list[tuple[int, int]]:
    """The months `bench --suite load` generates for the same size (same files, same cache)."""
    return [(2024 + (i // 12), i % 12 + 1) for i in range(n)]


def bench_query_list() -> list[Any]:
    """The checked queries of queries/: those with a reference computation (the classic four + aggregations)."""
    found = [q for q in queries_mod.list_queries() if q.name in queries_mod.REFERENCE_SQL]
    if not found:
        raise KitError(f"no benchmark queries in {queries_mod.QUERIES_DIR}", "run from the ducklake-kit checkout")
    return found


def spark_sql(sql: str) -> str:
    """The one dialect difference the queries meet: DuckDB's dayname() is the full name ('Monday'), Spark's is
    the three-letter abbreviation, so Spark gets date_format(x, 'EEEE'). A trailing `;` is dropped."""
    sql = re.sub(r"\bdayname\(([^()]*)\)", r"date_format(\1, 'EEEE')", sql, flags=re.IGNORECASE)
    return sql.strip().rstrip(";")


# -- comparing answers -------------------------------------------------------------------------------------


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, int):
        return v
    if isinstance(v, (float, Decimal)):
        f = float(v)
        return int(f) if f.is_integer() and abs(f) < 2**53 else f
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if (
            not isinstance(a, (int, float))
            or not isinstance(b, (int, float))
            or isinstance(a, bool)
            or isinstance(b, bool)
        ):
            return False
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)  # doubles summed in another order
    return a == b


def compare(expected: list[tuple], actual: list[tuple]) -> str | None:
    """None when the answers agree row for row (in order), else the first difference, in words.

    Every value is normalised the same way for every engine: DECIMAL and DOUBLE become floats (integral
    ones ints), dates ISO strings; floats must agree to 1e-9 relative (summation order), all else exactly."""
    if len(expected) != len(actual):
        return f"{len(actual)} rows instead of {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        ne, na = [_norm(x) for x in e], [_norm(x) for x in a]
        if len(ne) != len(na) or not all(_same(x, y) for x, y in zip(ne, na)):
            return f"row {i}: {na} instead of {ne}"
    return None


# -- the data: DuckLake tables, plain Parquet on S3, plain Parquet locally ----------------------------------


def _bench_shas(lake: Lake) -> set[str]:
    if not table_exists(lake.con, lake.alias, BENCH_SCHEMA, "load_log"):
        return set()
    return {r[0] for r in lake.con.execute(f"SELECT sha256 FROM {lake.alias}.{BENCH_SCHEMA}.load_log").fetchall()}


def ensure_lake_data(kit: Kit, rows: int) -> dict[str, Any]:
    """bench.trips holds exactly the generated months for `rows` (loaded through the kit's Spark load), or is
    reloaded: a bench schema with other content (another size, the load suite's warm-up) is dropped first."""
    ep, say = kit.platform.endpoints(), kit.say
    cache = kit.state.cache_dir
    n_files = math.ceil(rows / ROWS_PER_FILE)
    per_file = rows // n_files
    say(f"generating {n_files} synthetic month(s) of {per_file:,} rows (cached after the first run)")
    files = sources.synthetic_files(cache, months(n_files), per_file, seed=SEED)
    want = {f.sha256 for f in files}
    with Lake(ep) as lake:
        have = _bench_shas(lake)
        reused = have == want
        if have and not reused:
            say(f"lake.{BENCH_SCHEMA} holds other data: dropping its tables")
            lake.con.execute("BEGIN TRANSACTION")
            for t in _BENCH_TABLES:
                lake.con.execute(f"DROP TABLE IF EXISTS {BENCH_SCHEMA}.{t}")
            lake.con.execute("COMMIT")
    load_s = None
    if not reused:
        say(f"loading {sum(f.rows or 0 for f in files):,} rows into lake.{BENCH_SCHEMA}.trips through the Spark load")
        zones_path, _ = sources.zone_lookup(cache)
        t = time.perf_counter()
        # replace: the tables may have just been dropped on purpose (above), which `skip` refuses to load over
        run_load(kit, LoadInput(files, zones_path, "", "bench queries"), mode="replace", schema_name=BENCH_SCHEMA)
        load_s = round(time.perf_counter() - t, 1)
    else:
        say(f"lake.{BENCH_SCHEMA} already holds these {len(files)} month(s): not reloaded")
    digest = hashlib.sha256("".join(sorted(want)).encode()).hexdigest()[:12]
    return {"digest": digest, "source_files": len(files), "reused": reused, "load_s": load_s}


def _parquet_count(con: duckdb.DuckDBPyConnection, root: str) -> int | None:
    try:
        return int(
            con.execute(f"SELECT count(*) FROM read_parquet('{root}/trips/**/*.parquet', {_HIVE})").fetchone()[0]
        )
    except duckdb.Error:
        return None


def _clear_s3_prefix(platform: Platform, prefix: str) -> None:
    client = s3.client(platform.endpoints().s3, timeout=30)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=RAW_BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=RAW_BUCKET, Key=obj["Key"])


def export_parquet(platform: Platform, lake: Lake, root: str, expected: int, say: Callable[[str], None]) -> bool:
    """`trips` (hive-partitioned like the lake) and `zones` as plain Parquet under `root`; skipped when the
    same number of rows is already there (`root` names the data by its content). True when it wrote."""
    if _parquet_count(lake.con, root) == expected:
        return False
    say(f"exporting lake.{BENCH_SCHEMA}.trips as plain Parquet to {root}")
    if root.startswith("s3://"):
        _clear_s3_prefix(platform, root.removeprefix(f"s3://{RAW_BUCKET}/") + "/")
    else:
        shutil.rmtree(root, ignore_errors=True)
        Path(root, "zones").mkdir(parents=True)
    a = lake.alias
    lake.con.execute(
        f"COPY (FROM {a}.{BENCH_SCHEMA}.trips) TO '{root}/trips' "
        "(FORMAT parquet, PARTITION_BY (pickup_year, pickup_month), OVERWRITE_OR_IGNORE true)"
    )
    lake.con.execute(f"COPY (FROM {a}.{BENCH_SCHEMA}.zones) TO '{root}/zones/zones.parquet' (FORMAT parquet)")
    got = _parquet_count(lake.con, root)
    if got != expected:
        raise KitError(
            f"the Parquet export at {root} holds {got} rows, the lake {expected}", "this is a bug; run the bench again"
        )
    return True


def lake_files(lake: Lake, table: str) -> list[str]:
    """The Parquet data files of lake.bench.<table> as of now; a table with delete files or inlined rows has rows
    the files alone do not tell, so it cannot be compared file for file."""
    rows = lake.con.execute(
        "SELECT data_file, delete_file FROM ducklake_list_files(?, ?, schema => ?) ORDER BY 1",
        [lake.alias, table, BENCH_SCHEMA],
    ).fetchall()
    if any(d for _, d in rows):
        raise KitError(f"lake.{BENCH_SCHEMA}.{table} has delete files", "run the bench again: it reloads its schema")
    return [f for f, _ in rows]


def layout(con: duckdb.DuckDBPyConnection, files: list[str] | str) -> dict[str, Any]:
    """Files, row groups, rows and bytes (from the Parquet footers)."""
    n_files, groups, rows, size = con.execute(
        "SELECT count(DISTINCT file_name), count(*), sum(num_rows), sum(total_compressed_size) FROM "
        "(SELECT file_name, row_group_id, any_value(row_group_num_rows) AS num_rows, sum(total_compressed_size) AS total_compressed_size "
        " FROM parquet_metadata(?) GROUP BY ALL)",
        [files],
    ).fetchone()
    return {
        "files": int(n_files),
        "row_groups": int(groups),
        "rows": int(rows or 0),
        "compressed_bytes": int(size or 0),
    }


def _sql_list(values: list[str]) -> str:
    return "[" + ", ".join(quote_literal(v) for v in values) + "]"


def fixed_cost(
    lake_cur: duckdb.DuckDBPyConnection, parquet_cur: duckdb.DuckDBPyConnection, runs: int, query_sql: str
) -> dict[str, Any]:
    """What every DuckLake query pays before it reads a row, timed on a query that reads none (its snapshot
    only), and the catalog statements a real query (`query_sql`) sends (snapshot, file list, deletes, ...)."""
    probe = "SELECT 1 FROM trips LIMIT 0"
    times: dict[str, list[float]] = {"ducklake": [], "parquet": []}
    for cur in (lake_cur, parquet_cur):
        cur.execute(probe).fetchall()  # warm
    for _ in range(max(runs, 5) * 3):
        for engine, cur in (("ducklake", lake_cur), ("parquet", parquet_cur)):
            t = time.perf_counter()
            cur.execute(probe).fetchall()
            times[engine].append(time.perf_counter() - t)
    lake_cur.execute(query_sql).fetchall()  # a first query after a schema change reloads the whole catalog schema
    statements, _ = catalog_statements(lake_cur, query_sql)
    lake_ms, parquet_ms = (statistics.median(times[e]) * 1000 for e in ("ducklake", "parquet"))
    return {
        "probe": probe,
        "ducklake_ms": round(lake_ms, 2),
        "parquet_ms": round(parquet_ms, 2),
        "extra_ms_per_query": round(lake_ms - parquet_ms, 2),
        "catalog_round_trips": len(statements),  # of the first benchmark query, BEGIN and COMMIT included
        "catalog_tables": list(dict.fromkeys(t for st in statements for t in re.findall(r"ducklake_\w+", st))),
        "catalog_statements": [s.split("\n")[0][:110] for s in statements],
    }


# -- running ------------------------------------------------------------------------------------------------


def _stats(seconds: list[float], table_rows: int) -> EngineStats:
    med = statistics.median(seconds)
    return EngineStats(
        round(med, 4),
        round(min(seconds), 4),
        round(max(seconds), 4),
        round(table_rows / med) if med else None,
        [round(s, 4) for s in seconds],
    )


def ratios(ducklake_s: float, parquet_s: float, spark_s: float) -> dict[str, float]:
    """DuckLake's time over plain Parquet's on the same files (1.0: no overhead), and Spark's over DuckLake's."""
    return {
        "ratio_ducklake_to_parquet": round(ducklake_s / parquet_s, 3),
        "speedup_vs_spark": round(spark_s / ducklake_s, 1),
    }


def totals(entries: list[QueryFigures]) -> Totals:
    """Over all queries: each engine's sum of medians, their ratios (sum over sum) and the goals they meet."""
    total = {e: round(sum(q.engines[e].median_s for q in entries), 4) for e in ENGINES}
    r = ratios(total["ducklake"], total["parquet"], total["spark"])
    return Totals(
        total,
        r["ratio_ducklake_to_parquet"],
        r["speedup_vs_spark"],
        r["ratio_ducklake_to_parquet"] <= GOAL_LAKE_TO_PARQUET,
        r["speedup_vs_spark"] >= GOAL_SPEEDUP_VS_SPARK,
    )


def bench_queries(
    kit: Kit,
    *,
    rows: int,
    runs: int = 5,
    warmup: int = 1,
    names: list[str] | None = None,
    outputs: Outputs = NOT_WRITTEN,
) -> QueriesRun:
    """Run the benchmark queries on the three engines; figures per query and in total, answers checked."""
    if rows < 1000:
        raise KitError(f"--rows {rows} is too small to measure", "use --rows 1000000 or more")
    if runs < 1 or warmup < 1:
        raise KitError("--runs and --warmup must be at least 1", "the warm-up answers are the ones compared")
    load_before = load_average()
    platform, state, say = kit.platform, kit.state, kit.say
    data = ensure_lake_data(kit, rows)
    query_list = [q for q in bench_query_list() if not names or q.name in names]
    local_root = str(state.cache_dir / "bench-parquet" / data["digest"])
    spark = spark_mod.session()
    with Lake(platform.endpoints()) as lake:
        table_rows = int(lake.scalar(f"SELECT count(*) FROM {BENCH_SCHEMA}.trips"))
        wrote_local = export_parquet(platform, lake, local_root, table_rows, say)
        files = {t: lake_files(lake, t) for t in ("trips", "zones")}
        data["ducklake"] = {
            **layout(lake.con, files["trips"]),
            "snapshot_id": lake.current_snapshot(),
            "snapshots_in_catalog": int(lake.scalar("SELECT count(*) FROM ducklake_snapshots(?)", [lake.alias])),
        }
        data["parquet_s3"] = {
            **layout(lake.con, files["trips"]),
            "source": "the lake's own data files (ducklake_list_files)",
            "uri": files["trips"][0].rsplit("/", 3)[0] if files["trips"] else None,
        }
        data["parquet_local"] = {
            **layout(lake.con, f"{local_root}/trips/**/*.parquet"),
            "path": local_root,
            "written": wrote_local,
        }

        say("engines: DuckDB on lake.bench, DuckDB views over read_parquet(the lake's files), Spark temp views")
        on_lake = lake.con.cursor()
        on_lake.execute(f"USE {lake.alias}.{BENCH_SCHEMA}")
        on_parquet = lake.con.cursor()  # same DuckDB instance: same threads, same caches as (a)
        on_parquet.execute("USE memory.main")
        # the partition columns are inside the lake's files (WRITE_PARTITION_COLUMNS): no hive partitioning needed
        on_parquet.execute(
            f"CREATE OR REPLACE VIEW trips AS FROM read_parquet({_sql_list(files['trips'])}, hive_partitioning = false)"
        )
        on_parquet.execute(
            f"CREATE OR REPLACE VIEW zones AS FROM read_parquet({_sql_list(files['zones'])}, hive_partitioning = false)"
        )
        parquet_rows = int(on_parquet.execute("SELECT count(*) FROM trips").fetchone()[0])
        if parquet_rows != table_rows:
            raise KitError(
                f"the lake's data files hold {parquet_rows:,} rows, the table {table_rows:,}",
                "the table has rows outside its files (inlined data): run the bench again",
            )
        spark.read.parquet(f"{local_root}/trips").createOrReplaceTempView("trips")
        spark.read.parquet(f"{local_root}/zones/zones.parquet").createOrReplaceTempView("zones")

        def run(engine: str, sql: str) -> list[tuple]:
            if engine == "spark":
                return [tuple(r) for r in spark.sql(spark_sql(sql)).collect()]
            return (on_lake if engine == "ducklake" else on_parquet).execute(sql).fetchall()

        say("fixed cost of a DuckLake query: SELECT 1 FROM trips LIMIT 0 on both DuckDB engines")
        fixed = fixed_cost(on_lake, on_parquet, runs, query_list[0].sql)

        results = []
        for q in query_list:
            say(f"{q.name}: {warmup} warm-up + {runs} timed run(s) on each engine")
            answers: dict[str, list[tuple]] = {}
            for engine in ENGINES:
                for _ in range(warmup):
                    answers[engine] = run(engine, q.sql)
            times: dict[str, list[float]] = {e: [] for e in ENGINES}
            for i in range(runs):
                for engine in round_order(i):  # take turns: load from other processes hits every engine alike
                    t = time.perf_counter()
                    run(engine, q.sql)
                    times[engine].append(time.perf_counter() - t)
                    if engine == "spark":
                        time.sleep(SETTLE_AFTER_SPARK_S)  # the JVM finishes its own work, off the DuckDB clocks
            diffs = {e: compare(answers["ducklake"], answers[e]) for e in ("parquet", "spark")}
            stats = {e: _stats(times[e], table_rows) for e in ENGINES}
            r = ratios(stats["ducklake"].median_s, stats["parquet"].median_s, stats["spark"].median_s)
            results.append(
                QueryFigures(
                    q.name,
                    q.path.name,
                    len(answers["ducklake"]),
                    stats,
                    r["ratio_ducklake_to_parquet"],
                    r["speedup_vs_spark"],
                    not any(diffs.values()),
                    {e: d for e, d in diffs.items() if d},
                )
            )
        on_lake.close()
        on_parquet.close()

    out = QueriesRun(rows, table_rows, Machine.since(load_before), runs, warmup, data, results, totals(results), fixed)
    write_outputs(out, outputs.json, outputs.png, chart_queries)
    return out


# -- output -------------------------------------------------------------------------------------------------


def chart_queries(result: QueriesRun, path: Path) -> None:
    """Grouped bars: median seconds per query and engine (log scale, min..max as error bars)."""
    import matplotlib  # only with --png: matplotlib takes a while to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    qs = result.queries
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(qs)), 5))
    width = 0.27
    for i, engine in enumerate(ENGINES):
        med = [q.engines[engine].median_s for q in qs]
        err = [
            [m - q.engines[engine].min_s for m, q in zip(med, qs)],
            [q.engines[engine].max_s - m for m, q in zip(med, qs)],
        ]
        ax.bar(
            [x + (i - 1) * width for x in range(len(qs))], med, width, yerr=err, capsize=2, label=ENGINE_LABELS[engine]
        )
    ax.set_xticks(range(len(qs)), [q.name for q in qs], fontsize=7, rotation=25, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("median seconds (log scale; bars: min..max)")
    ax.set_title(
        f"bench --suite queries: {result.table_rows:,} rows, {result.machine.cores} cores, {result.runs} runs; "
        f"DuckLake/Parquet {result.totals.ratio_ducklake_to_parquet}, Spark/DuckLake {result.totals.speedup_vs_spark}x",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
