"""The benchmark suites end to end on tiny sizes: the figures have the right shape, the engines' answers agree,
and the concurrency counts add up. Shape and consistency only: nothing here is timed."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal

import pytest

from ducklake_kit.bench import concurrency as bc
from ducklake_kit.bench import queries as bq
from ducklake_kit.bench import reports
from ducklake_kit.bench.results import Outputs
from ducklake_kit.platforms.kit import Kit
from ducklake_kit.platforms.report import CallbackReporter

# -- unit: comparing answers and the Spark dialect fix -------------------------------------------------------


def test_compare_normalises_decimal_double_and_dates_the_same_way():
    duck = [(1, date(2024, 1, 2), Decimal("12.50"), 0.1 + 0.2, None)]
    spark = [(1, date(2024, 1, 2), Decimal("12.5000"), 0.3, None)]
    assert bq.compare(duck, spark) is None


@pytest.mark.parametrize(
    "actual, why",
    [
        ([(1, "a", 2.0)], "1 rows instead of 2"),
        ([(1, "a", 2.0), (2, "b", 3.01)], "row 1"),
        ([(2, "b", 3.0), (1, "a", 2.0)], "row 0"),  # the queries order their rows: order counts
        ([(1, "a", 2.0), (2, "B", 3.0)], "row 1"),
        ([(1, "a", 2.0), (2, "b", None)], "row 1"),
    ],
)
def test_compare_reports_the_first_difference(actual, why):
    expected = [(1, "a", 2.0), (2, "b", 3.0)]
    diff = bq.compare(expected, actual)
    assert diff is not None and diff.startswith(why)


def test_spark_sql_rewrites_dayname_only():
    sql = "SELECT dayname(pickup_date) AS weekday, count(*) FROM trips;\n"
    assert bq.spark_sql(sql) == "SELECT date_format(pickup_date, 'EEEE') AS weekday, count(*) FROM trips"


def test_the_duckdb_engines_take_turns_after_spark():
    orders = [bq.round_order(i) for i in range(4)]
    assert all(o[0] == "spark" and sorted(o) == sorted(bq.ENGINES) for o in orders)
    assert [o[1] for o in orders] == [
        "ducklake",
        "parquet",
        "ducklake",
        "parquet",
    ]  # neither always right after the JVM


def test_the_floor_is_cpu_bound_and_the_lone_writers_latency():
    single = bc.SingleWriter(
        ops_per_writer=100,
        median_ms=4.0,
        p95_ms=6.0,
        min_ms=3.0,
        client_cpu_ms_per_insert=5.0,
        catalog_cpu_ms_per_insert=1.0,
    )
    f = bc.floor(single, writers=3, ops=100, cores=2)
    assert f.cpu_ms_per_insert == 6.0
    assert f.total_s_at_least == 0.9  # 300 inserts x 6 ms of CPU, 3 writers sharing 2 cores
    assert f.median_ms_at_least == 4.0  # an insert alone: other writers cannot make it shorter
    assert f.ops_per_s_at_most == 333.3  # 2 cores / 6 ms
    assert f.mean_ms_at_least == 9.0  # Little's law: 3 writers / 333.3 inserts a second
    # no more writers than cores: each has a core
    f = bc.floor(single, writers=2, ops=100, cores=2)
    assert (f.total_s_at_least, f.median_ms_at_least) == (0.6, 4.0)
    # without the catalog server's CPU (k3d, external) the bound counts the client only, and says so
    single.catalog_cpu_ms_per_insert = None
    f = bc.floor(single, writers=3, ops=100, cores=2)
    assert f.cpu_ms_per_insert == 5.0 and f.catalog_cpu_counted is False


def test_percentile_is_nearest_rank():
    values = sorted(float(i) for i in range(1, 101))
    assert bc._percentile(values, 0.95) == 95.0
    assert bc._percentile(values, 0.5) == 50.0
    assert bc._percentile([], 0.95) is None


def test_every_checked_query_is_benchmarked():
    from ducklake_kit.taxi import lesson_queries as queries

    names = [q.name for q in bq.bench_query_list()]
    assert names and set(names) <= set(queries.REFERENCE_SQL)
    assert {"q1_trips_by_vendor", "q2_avg_total_by_passenger_count"} <= set(names)


# -- unit: the figures' formulas, on tiny literal inputs ------------------------------------------------------


def test_stats_of_three_runs():
    assert bq._stats([0.3, 0.1, 0.2], 1000) == bq.EngineStats(
        median_s=0.2, min_s=0.1, max_s=0.3, rows_per_s=5000, runs_s=[0.3, 0.1, 0.2]
    )


def test_ratios_per_query_and_over_all_queries():
    assert bq.ratios(0.2, 0.25, 3.0) == {"ratio_ducklake_to_parquet": 0.8, "speedup_vs_spark": 15.0}

    def query(ducklake: float, parquet: float, spark: float) -> bq.QueryFigures:
        engines = {
            e: bq.EngineStats(m, m, m, None, [m])
            for e, m in (("ducklake", ducklake), ("parquet", parquet), ("spark", spark))
        }
        return bq.QueryFigures("q", "q.sql", 1, engines, 0.0, 0.0, True)

    t = bq.totals(
        [query(0.1, 0.1, 0.5), query(0.3, 0.2, 4.5)]
    )  # sums 0.4 / 0.3 / 5.0: a slow query weighs what it costs
    assert t.total_median_s == {"ducklake": 0.4, "parquet": 0.3, "spark": 5.0}
    assert (t.ratio_ducklake_to_parquet, t.speedup_vs_spark, t.ratio_met, t.speedup_met) == (1.333, 12.5, False, True)
    assert t.as_dict()["goals"] == {
        "ratio_ducklake_to_parquet_max": 1.05,
        "speedup_vs_spark_min": 10.0,
        "ratio_met": False,
        "speedup_met": True,
    }


def test_summary_counts_lost_silently_lost_and_duplicate_rows():
    reports = [  # 2 writers x 3 inserts: writer 0 lost one to an error; 4 rows in the table, one of them twice
        {
            "worker": 0,
            "start": 10.0,
            "end": 10.5,
            "latencies_s": [(0, 0.010), (2, 0.030)],
            "errors": {"conflicting lock": 1},
        },
        {"worker": 1, "start": 10.1, "end": 11.0, "latencies_s": [(0, 0.020), (1, 0.040), (2, 0.050)], "errors": {}},
    ]
    s = bc._summary("file", reports, writers=2, ops=3, actual=5, distinct=4)
    assert (s.expected_rows, s.succeeded, s.errors, s.errors_by_kind) == (6, 5, 1, {"conflicting lock": 1})
    assert (s.rows_lost, s.silently_lost, s.duplicate_rows) == (1, 0, 1)
    assert (s.total_s, s.median_ms, s.max_ms) == (1.0, 30.0, 50.0)
    assert "reruns" not in s.as_dict() and s.as_dict()["rows_lost"] == 1  # the file mode's JSON has no DuckLake fields
    # one success whose row is not there: lost silently, the defect the suite exists to catch
    s = bc._summary("file", reports, writers=2, ops=3, actual=4, distinct=4)
    assert (s.rows_lost, s.silently_lost) == (2, 1)


def _figures(**values) -> bc.WriterFigures:
    base = {
        "mode": "ducklake",
        "writers": 3,
        "ops_per_writer": 100,
        "total_s": 0.8,
        "ops_per_s": 375.0,
        "median_ms": 6.0,
        "p95_ms": 9.0,
        "max_ms": 12.0,
        "succeeded": 300,
        "errors": 0,
        "errors_by_kind": {},
        "expected_rows": 300,
        "actual_rows": 300,
        "rows_lost": 0,
        "silently_lost": 0,
        "duplicate_rows": 0,
        "slowest_ops": [],
    }
    return bc.WriterFigures(**{**base, **values})


def test_goals_met_and_reachable():
    g = bc.goals(_figures(), bc.Floor(10.0, True, total_s_at_least=1.5, median_ms_at_least=4.0))
    assert g.met == {"total_s": True, "median_ms": False, "errors": True, "rows_lost": True}
    assert g.reachable_here == {"total_s": False, "median_ms": True}
    bad = bc.goals(_figures(total_s=2.0, median_ms=None, errors=3, rows_lost=1), None)
    assert bad.met == {"total_s": False, "median_ms": True, "errors": False, "rows_lost": False}
    assert "reachable_here" not in bad.as_dict() and bad.as_dict()["total_s"] == 1.0  # the thresholds travel with it


def test_contention_goals_per_mode_and_whether_this_machine_can_reach_them():
    assert bc.contention_goals(_figures(p99_ms=40.0, max_ms=900.0, ops_per_s=120.0)) == {
        "p99_ms": True,
        "max_ms": True,
        "ops_per_s": True,
        "rows_lost": True,
        "duplicate_rows": True,
    }
    starved = bc.contention_goals(_figures(p99_ms=60.0, max_ms=113_000.0, ops_per_s=113.9, duplicate_rows=1))
    assert starved == {"p99_ms": False, "max_ms": False, "ops_per_s": False, "rows_lost": True, "duplicate_rows": False}
    assert bc.contention_goals(_figures(p99_ms=None))["p99_ms"] is False  # nothing succeeded: not met
    single = bc.SingleWriter(100, 4.0, 6.0, 3.0, client_cpu_ms_per_insert=5.0, catalog_cpu_ms_per_insert=2.0)
    # 16 writers, 7 ms of CPU an insert on 2 cores: <= 285.7 inserts/s, a mean >= 56 ms <= 0.99 x 50 + 0.01 x 1000;
    # through the gate one at a time, 3 ms each (the fastest lone insert): <= 285.7/s too, the smaller of the two
    f = bc.floor(single, 16, 1000, 2)
    assert (f.ops_per_s_at_most, f.mean_ms_at_least, f.gated_ops_per_s_at_most, f.gated_mean_ms_at_least) == (
        285.7,
        56.0,
        285.7,
        56.0,
    )
    assert bc.contention_reachable(f) == {
        "p99_and_max_ms": True,
        "ops_per_s": True,
        "p99_and_max_ms_through_the_gate": True,
        "ops_per_s_through_the_gate": True,
    }
    single.min_ms = 5.0  # 200/s through the gate: a mean >= 80 ms, which p99 <= 50 ms and max <= 1 s cannot average
    assert bc.contention_reachable(bc.floor(single, 16, 1000, 2)) == {
        "p99_and_max_ms": True,
        "ops_per_s": True,
        "p99_and_max_ms_through_the_gate": False,
        "ops_per_s_through_the_gate": True,
    }
    single.client_cpu_ms_per_insert = 16.0  # 18 ms: 111 inserts/s at most, a mean >= 144 ms, whatever the gate
    reach = bc.contention_reachable(bc.floor(single, 16, 1000, 2))
    assert not any(reach.values()), reach


def test_the_modes_and_their_commit_gates():
    assert [bc.commit_gate_of(m) for m in bc.MODES if m != "file"] == [
        "advisory",
        "optimistic",
        "advisory",
        "optimistic",
    ]


def test_the_lake_defect_is_a_lost_or_duplicated_row():
    machine = bc.Machine(2, [0.1, 0.1, 0.1], [0.2, 0.1, 0.1])
    assert bc.ConcurrencyRun(3, 100, machine, {"ducklake": _figures()}).lake_defect() is None
    lost = bc.ConcurrencyRun(3, 100, machine, {"ducklake": _figures(actual_rows=299, rows_lost=1, silently_lost=1)})
    assert (
        lost.lake_defect()
        == "DuckLake lost 1 and duplicated 0 of 300 rows (0 inserts reported an error, 1 lost silently)"
    )
    # the report the CLI renders carries the same defect (exit 1) and shows no PASS line
    report = reports.concurrency_report(lost)
    assert report.defect == lost.lake_defect() and report.table.title.startswith("bench --suite concurrency: 3 writers")
    assert (
        report.passed[-1].startswith("PASS")
        and reports.concurrency_report(bc.ConcurrencyRun(3, 100, machine, {"ducklake": _figures()})).defect is None
    )
    twice = bc.ConcurrencyRun(3, 100, machine, {"ducklake": _figures(duplicate_rows=2)})
    assert twice.lake_defect().startswith("DuckLake lost 0 and duplicated 2")
    # the same rule for the worker plane's writers
    plane = bc.ConcurrencyRun(
        3,
        100,
        machine,
        {"ducklake": _figures(), "workers": _figures(mode="workers", actual_rows=299, rows_lost=1, silently_lost=1)},
    )
    assert plane.lake_defect() == (
        "DuckLake through the worker plane lost 1 and duplicated 0 of 300 rows "
        "(0 inserts reported an error, 1 lost silently)"
    )
    optimistic = bc.ConcurrencyRun(
        3,
        100,
        machine,
        {"ducklake-optimistic": _figures(mode="ducklake-optimistic", commit_gate="optimistic", duplicate_rows=1)},
    )
    assert optimistic.lake_defect().startswith("DuckLake without the commit gate lost 0 and duplicated 1")
    # the file mode's losses are the point of the comparison, not a defect
    assert bc.ConcurrencyRun(3, 100, machine, {"file": _figures(mode="file", rows_lost=40)}).lake_defect() is None


# -- integration: real PostgreSQL, S3 and Spark ----------------------------------------------------------------


def test_queries_suite_end_to_end(stack, tmp_path):
    json_path, png_path = tmp_path / "q.json", tmp_path / "q.png"
    steps: list[str] = []
    kit = Kit.on(stack.platform, stack.state, reporter=CallbackReporter(steps.append))
    result = bq.bench_queries(kit, rows=5000, runs=1, warmup=1, outputs=Outputs(json_path, png_path))
    names = [q.name for q in bq.bench_query_list()]
    assert [q.name for q in result.queries] == names
    assert 0 < result.table_rows <= 5000  # the quarantine keeps the rows that fail a quality rule
    for q in result.queries:
        assert q.answers_agree, (q.name, q.differences)
        assert q.result_rows > 0, q.name
        for engine in bq.ENGINES:
            s = q.engines[engine]
            assert len(s.runs_s) == 1 and s.min_s <= s.median_s <= s.max_s
            assert s.rows_per_s > 0
    assert result.answers_agree is True
    assert set(result.totals.total_median_s) == set(bq.ENGINES)
    # (a) and (b) read the very same files: same layout, same rows as the table; Spark's local copy holds them too
    data = result.data
    same = ("files", "row_groups", "rows", "compressed_bytes")
    assert data["ducklake"]["files"] >= 1 and [data["ducklake"][k] for k in same] == [
        data["parquet_s3"][k] for k in same
    ]
    assert data["ducklake"]["rows"] == data["parquet_local"]["rows"] == result.table_rows
    fixed = result.fixed_cost
    assert fixed["catalog_round_trips"] >= 3 and fixed["ducklake_ms"] > 0 and fixed["parquet_ms"] > 0
    assert "ducklake_snapshot" in fixed["catalog_tables"] and "ducklake_data_file" in fixed["catalog_tables"]
    doc = json.loads(json_path.read_text())
    assert (
        doc["table_rows"] == result.table_rows
        and doc["queries"][0]["ducklake"]["median_s"] == result.queries[0].engines["ducklake"].median_s
    )
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # what `bench --suite queries` prints: a row per query with its own figures; --json prints what --out wrote
    report = reports.queries_report(result)
    assert [row[0] for row in report.table.rows] == names and report.defect is None
    assert report.table.rows[0][-1] == "yes" and report.table.rows[0][4] == result.queries[0].ratio_ducklake_to_parquet
    assert json.loads(json.dumps(report.as_dict(), default=str)) == doc

    # a second run finds the same data in the lake and both exports: nothing is reloaded or rewritten
    again = bq.bench_queries(
        Kit.on(stack.platform, stack.state), rows=5000, runs=1, warmup=1, names=["q1_trips_by_vendor"]
    )
    assert again.data["reused"] is True
    assert again.data["parquet_local"]["written"] is False
    assert [q.name for q in again.queries] == ["q1_trips_by_vendor"]
    assert again.queries[0].answers_agree


def test_concurrency_suite_counts_add_up(stack, tmp_path):
    from ducklake_kit.workers import plane

    json_path, png_path = tmp_path / "c.json", tmp_path / "c.png"
    had_plane, had_workers = plane.scheduler_running(stack.state), plane.running_workers(stack.state)
    result = bc.bench_concurrency(
        Kit.on(stack.platform, stack.state), writers=2, ops=20, outputs=Outputs(json_path, png_path)
    )
    file, lake, tasks = result.results["file"], result.results["ducklake"], result.results["workers"]
    assert list(result.results) == list(bc.MODES)  # both commit gates, in one run
    for r in result.results.values():
        assert r.expected_rows == 40
        assert r.errors == sum(r.errors_by_kind.values())
        assert r.succeeded + r.errors == 40
        assert r.silently_lost == 0  # every INSERT that reported success left its row
        assert r.duplicate_rows == 0
        assert r.total_s > 0
        if r.succeeded:  # on a busy machine every open of the file mode may meet another's lock
            assert r.median_ms <= r.p95_ms <= r.p99_ms <= r.max_ms
    # the file path fails only by lock conflicts, and each conflict is exactly one lost row
    assert set(file.errors_by_kind) <= {"conflicting lock"}
    assert file.rows_lost == file.errors
    # the file path: every row not in the file is an error someone saw (none vanished after a success)
    assert file.actual_rows == 40 - file.errors
    # DuckLake: no errors, no loss, one snapshot per INSERT; 2 writers never exhaust DuckLake's own 30 retries
    assert lake.errors == 0 and lake.rows_lost == 0 and lake.actual_rows == 40
    assert lake.snapshots == 40
    assert lake.reruns == 0
    assert lake.insert_profile["catalog_round_trips"] >= 3  # at least begin, write, commit
    # the writers ran with the small-writer settings; what an insert costs was measured, alone and together
    assert lake.settings["threads"] == 1 and lake.client_cpu_ms_per_insert > 0
    single = lake.single_writer
    assert single.ops_per_writer == 20 and 0 < single.min_ms <= single.median_ms <= single.p95_ms
    assert single.client_cpu_ms_per_insert > 0
    if stack.env["DUCKLAKE_PLATFORM"] == "local":  # the kit's own PostgreSQL: its CPU is counted too
        assert single.catalog_cpu_ms_per_insert > 0 and lake.catalog_cpu_ms_per_insert > 0
    assert result.floor.cpu_ms_per_insert >= single.client_cpu_ms_per_insert and result.floor.total_s_at_least > 0
    assert set(result.goals.reachable_here) == {"total_s", "median_ms"}  # the rule itself: test_goals_*
    # the same inserts as worker plane tasks: the same counts; the plane is left as the run found it
    assert (tasks.errors, tasks.rows_lost, tasks.actual_rows, tasks.snapshots, tasks.reruns) == (0, 0, 40, 40, 0)
    for mode in ("ducklake-optimistic", "workers-optimistic"):  # without the gate: the same counts
        r = result.results[mode]
        assert (r.errors, r.rows_lost, r.duplicate_rows, r.actual_rows, r.snapshots) == (0, 0, 0, 40, 40), mode
    assert {m: r.commit_gate for m, r in result.results.items() if m != "file"} == {
        "ducklake": "advisory",
        "ducklake-optimistic": "optimistic",
        "workers": "advisory",
        "workers-optimistic": "optimistic",
    }
    assert (
        set(result.goals.contention_met)
        == set(result.vs_floor)
        == {"ducklake", "ducklake-optimistic", "workers", "workers-optimistic"}
    )
    assert set(result.goals.contention_reachable_here) == {
        "p99_and_max_ms",
        "ops_per_s",
        "p99_and_max_ms_through_the_gate",
        "ops_per_s_through_the_gate",
    }
    assert (plane.scheduler_running(stack.state), plane.running_workers(stack.state)) == (had_plane, had_workers)
    assert result.lake_defect() is None
    doc = json.loads(json_path.read_text())
    assert (
        doc["results"]["ducklake"]["actual_rows"] == 40
        and doc["results"]["ducklake"]["single_writer"]["ops_per_writer"] == 20
    )
    assert "reruns" not in doc["results"]["file"] and doc["floor"]["total_s_at_least"] == result.floor.total_s_at_least
    assert (doc["writers"], doc["ops_per_writer"], doc["results"]["file"]["writers"]) == (2, 20, 2)
    report = reports.concurrency_report(result)  # what `bench --suite concurrency` prints
    assert report.table.title.startswith("bench --suite concurrency: 2 writers x 20 inserts")
    assert [(row[0], row[9]) for row in report.table.rows] == [(m, r.rows_lost) for m, r in result.results.items()]
    assert report.defect is None and sum(line.startswith("PASS") for line in report.passed) == 4
    assert json.loads(json.dumps(report.as_dict(), default=str)) == doc
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_concurrency_rejects_nonsense_sizes(stack):
    from ducklake_kit.errors import KitError

    with pytest.raises(KitError, match="at least 1"):
        bc.bench_concurrency(Kit.on(stack.platform, stack.state), writers=0, ops=10)
    with pytest.raises(KitError, match="unknown concurrency mode"):
        bc.bench_concurrency(Kit.on(stack.platform, stack.state), modes=("sqlite",))


# -- the load suite: side (c) writes what the load writes; the figures' shape ----------------------------------


def test_duckdb_alone_writes_the_rows_the_spark_load_wrote(stack):
    """Side (c) against the load, every column of every row: the same rules, derived columns and zone names, computed
    by two engines. A rule, a derived column or a join written differently in bench.duckdb_load makes the EXCEPT ALL
    non-empty."""
    from ducklake_kit.bench import duckdb_load as dd
    from ducklake_kit.bench.load import remove_prefix
    from ducklake_kit.lake import Lake
    from ducklake_kit.taxi import sources
    from ducklake_kit.taxi.load import LoadInput, run_load

    ep = stack.platform.endpoints()
    files = sources.synthetic_files(stack.state.cache_dir, [(2023, 5), (2023, 6)], 3000, seed=11)
    zones, _ = sources.zone_lookup(stack.state.cache_dir)
    kit = Kit.on(stack.platform, stack.state)
    result = run_load(kit, LoadInput(files, zones, "", "test"), mode="replace", schema_name="bench_c_test")
    out = dd.duckdb_load(ep, files, zones, "bench-duckdb-test", result.load_id)
    try:
        accepted, rejected = sum(f.rows_accepted for f in result.files), sum(f.rows_rejected for f in result.files)
        assert (out.rows_accepted, out.rows_rejected) == (accepted, rejected)
        assert accepted > 0 and rejected > 0  # the generator's quirks reach the quarantine
        assert all(p.startswith(out.prefix + "/") for p in out.files)
        with Lake(ep) as lake:
            for table in ("trips", "quarantine"):
                mine = [p for p in out.files if f"/{table}/" in p]
                theirs = f"SELECT * FROM bench_c_test.{table} WHERE load_id = ?"
                written = "SELECT * FROM read_parquet(?, hive_partitioning = false)"
                for a, b, params in (
                    (theirs, written, [result.load_id, mine]),
                    (written, theirs, [mine, result.load_id]),
                ):
                    extra = lake.con.execute(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})", params).fetchone()[0]
                    assert extra == 0, (table, a)
            by_reason = lake.con.execute(
                "SELECT reject_reason, count(*) FROM read_parquet(?) GROUP BY 1 ORDER BY 1",
                [[p for p in out.files if "/quarantine/" in p]],
            ).fetchall()
            assert (
                by_reason
                == lake.con.execute(
                    "SELECT reject_reason, count(*) FROM bench_c_test.quarantine "
                    "WHERE load_id = ? GROUP BY 1 ORDER BY 1",
                    [result.load_id],
                ).fetchall()
            )
            assert lake.scalar(f"SELECT count(pu_zone) FROM bench_c_test.trips WHERE load_id = '{result.load_id}'") > 0
    finally:
        assert remove_prefix(ep, out.prefix) == len(out.files)


def test_load_suite_on_local_spark_has_every_side_and_ratio(stack):
    from ducklake_kit.bench import load as bl

    r = bl.bench_load(Kit.on(stack.platform, stack.state), [4000], cluster=False)
    (size,) = r.sizes
    assert size.rows == 4000 and size.sides["a_cluster"] is None
    for side in ("a", "b", "c"):
        f = size.sides[side]
        # the rate is computed from the unrounded time; seconds are shown rounded to 0.01 s
        assert f.seconds > 0 and 4000 / (f.seconds + 0.006) <= f.rows_per_s <= 4000 / max(f.seconds - 0.006, 0.001)
    a, c = size.sides["a"], size.sides["c"]
    assert size.ratios["a_to_c"] == round(a.rows_per_s / c.rows_per_s, 3) and size.ratios["a_cluster_to_a"] is None
    assert a.seconds == round(a.spark_s + a.commit_s, 2) and a.snapshot_id is not None
    assert c.bytes > 0  # measured before its files were removed
    assert (
        bl.remove_prefix(stack.platform.endpoints(), f"{stack.platform.endpoints().data_path}{bl.DUCKDB_FOLDER}") == 0
    )
    assert [g.met for g in r.goals] == [None, None]  # judged at 10M rows only
    doc = json.loads(json.dumps(r.as_dict()))
    assert doc["sizes"][0]["sides"]["c"]["rows_per_s"] == c.rows_per_s and doc["goals"][0]["rows"] == bl.GOAL_ROWS
    report = reports.load_report(r)  # what `bench --suite load` prints: no cluster side, the goals not measured
    assert report.table.rows[0][:3] == ["4,000", f"{a.rows_per_s:,}", "-"] and report.document["suite"] == "load"
    assert all(note.endswith("not measured (add 10000000 to --rows)") for note in report.notes[:2])


def test_load_goals_are_judged_at_ten_million_rows():
    from ducklake_kit.bench import load as bl

    def side(rate: int) -> bl.PathFigures:
        return bl.PathFigures(1.0, rate, 0, 0, 0)

    small = bl.SizeFigures(1_000_000, 1, {"a": side(100), "b": side(50), "c": side(1000), "a_cluster": side(10)})
    big = bl.SizeFigures(bl.GOAL_ROWS, 4, {"a": side(200), "b": side(100), "c": side(1000), "a_cluster": side(150)})
    run = bl.LoadBench([small, big], bc.Machine(2, [0.0] * 3, [0.0] * 3), "test", {})
    assert big.ratios == {"a_to_c": 0.2, "a_cluster_to_a": 0.75, "a_to_b": 2.0}
    assert [(g.value, g.met) for g in run.goals] == [(0.2, True), (0.75, False)]
    run = bl.LoadBench([small], bc.Machine(2, [0.0] * 3, [0.0] * 3), "test", {})
    assert [g.met for g in run.goals] == [None, None]
