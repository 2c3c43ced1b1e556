"""`bench --suite dynamic` at a tiny size on the real lake: both bases built (the second of as many months as asked,
as `--months 1,3` does), each refresh of the INCREMENTAL table and of the FULL table full (the suite raises otherwise), both tables equal to their query run in full
(the suite raises otherwise), the figures and ratios computed from the same run, and the suite's tables dropped
afterwards. Nothing here is timed against a goal, so each part repeats fewer times than the suite's (the fixed cost
5 refreshes, the stream 6 changes with its replace at the middle and 2 tables per mode, the star join and the chain 3
each): the shape and the checks are the suite's, only the medians are of fewer runs."""

from __future__ import annotations

import json

import pytest

from ducklake_kit.bench import dynamic, dynamic_joins, reports, suites
from ducklake_kit.bench.dynamic import ADAPT, INC, SMALL, TRIPS, bases_of, bench_dynamic, replicas
from ducklake_kit.bench.dynamic_joins import CHAIN, FACTS, JOINED
from ducklake_kit.dynamic_tables.refresh import ADAPTIVE_CROSSOVER, ALWAYS, PHASES
from ducklake_kit.errors import EXIT_USAGE, KitError
from ducklake_kit.lake import Lake
from ducklake_kit.lake.sql import table_exists
from ducklake_kit.platforms.kit import Kit

FIXED_RUNS, STREAM, REPLICAS, STAR_RUNS, CHAIN_RUNS = 5, 6, 2, 3, 3


def test_months_are_the_first_base_or_both():
    assert [bases_of(suites.months(m)) for m in (12, "12", "12,48", " 3, 4")] == [
        (12, 24),
        (12, 24),
        (12, 48),
        (3, 4),
    ]
    for bad in ("12,x", "1,2,3", "-1", ""):
        with pytest.raises(KitError) as e:
            suites.months(bad)
        assert e.value.exit_code == EXIT_USAGE and "e.g. --months 12" in e.value.fix
    for bad in ((0, 4), (4, 4), (4, 3)):
        with pytest.raises(KitError, match="the second more than the first"):
            bases_of(bad)


def test_dynamic_bench_refreshes_both_ways_at_two_bases_and_cleans_up(stack, tmp_path, monkeypatch):
    for module, name, runs in (
        (dynamic, "FIXED_RUNS", FIXED_RUNS),
        (dynamic, "STREAM", STREAM),
        (dynamic, "REPLICAS", REPLICAS),
        (dynamic_joins, "STAR_RUNS", STAR_RUNS),
        (dynamic_joins, "CHAIN_RUNS", CHAIN_RUNS),
    ):
        monkeypatch.setattr(module, name, runs)
    out = tmp_path / "dynamic.json"
    kit = Kit.on(stack.platform, stack.state)
    r = bench_dynamic(kit, months=(1, 3), rows_per_month=2000, runs=1, json_path=out)
    assert [(b.months, b.base_rows) for b in r.bases] == [(1, 2000), (3, 6000)]
    for b in r.bases:  # a tenth of a month, then a month, appended and refreshed both ways
        assert (b.small_change_rows, b.change_rows) == (200, 2000)
        assert len(b.small_incremental_s) == len(b.small_full_s) == len(b.incremental_s) == len(b.full_s) == 1
        assert b.incremental_how.startswith("inserts merged into")
        assert b.ratio == pytest.approx(b.incremental_median_s / b.full_median_s, abs=0.01)
        assert b.small_ratio == pytest.approx(b.small_incremental_median_s / b.small_full_median_s, abs=0.01)
    first, second = r.bases
    assert r.growth == pytest.approx(second.incremental_median_s / first.incremental_median_s - 1, abs=0.01)
    goals = json.loads(out.read_text())["goals"]
    change = goals["change"]  # issue 30's goal, computed from the small change's figures
    assert change["ratio"] == first.small_ratio and change["ratio_met"] == (first.small_ratio <= 0.15)
    small_growth = second.small_incremental_median_s / first.small_incremental_median_s - 1
    assert change["growth"] == pytest.approx(small_growth, abs=0.01) and change["growth_met"] == (
        change["growth"] <= 0.05
    )
    assert (change["change_rows"], change["first_base_rows"], change["second_base_rows"]) == (200, 2000, 6000)
    assert change["at_goal_size"] is False and goals["second_base_rows"] == 6000
    report = reports.dynamic_report(r)  # what `bench --suite dynamic` prints
    assert [row[:3] for row in report.table.rows] == [
        [1, "2,000", "200"],
        [1, "2,000", "2,000"],
        [3, "6,000", "200"],
        [3, "6,000", "2,000"],
    ]
    assert "median of 1 " in report.table.title and "file cache off" in report.table.title
    assert "(the goal is set at 12,000,000 base rows: --rows 1000000)" in report.notes[0]
    assert report.notes[1].startswith(f"a change of 200 rows: incremental / full at 2,000 rows: {change['ratio']} ")
    assert "; its incremental refresh's phases (ms, median): at 2,000 rows lock " in report.notes[1]
    assert all(set(b.small_phase_medians) == set(PHASES) for b in r.bases)
    assert (
        report.notes[1]
        .split("; its incremental")[0]
        .endswith("(the goal is set at 100,000 rows into 12,000,000 and 48,000,000: --rows 1000000 --months 12,48)")
    )
    assert goals["at_goal_size"] is False and goals["ratio_goal"] == 0.1 and goals["growth_goal"] == 0.2
    # the fixed cost: every refresh timed in its phases, which add up to (nearly) its wall time
    f = r.fixed
    assert len(f.wall_ms) == len(f.phases_ms) == FIXED_RUNS and "(ADAPTIVE chose incremental: " in f.how
    for wall, phases in zip(f.wall_ms, f.phases_ms):
        assert set(ALWAYS) <= set(phases) <= set(PHASES) and all(ms >= 0 for ms in phases.values())
        assert sum(phases.values()) <= wall + 1
    assert goals["fixed_cost_ms"] == f.median_ms and goals["fixed_cost_goal_ms"] == 50
    assert any(
        n.startswith(f"fixed cost of a refresh (one row into 1,000 rows, median of {FIXED_RUNS}):")
        for n in report.notes
    )
    # the stream: one replace among appends, three tables refreshed after each change, totals from the same steps
    st = r.stream
    assert [s.kind for s in st.steps].count("replace") == 1 and len(st.steps) == STREAM
    assert st.total("adaptive") == pytest.approx(sum(s.adaptive_s for s in st.steps), abs=0.01)
    assert st.ratio == pytest.approx(st.total("adaptive") / min(st.total("incremental"), st.total("full")), abs=0.01)
    replace = next(s for s in st.steps if s.kind == "replace")
    assert replace.change_rows > 2000  # its month's rows deleted, and its 2,000 rows loaded again
    for s in st.steps:  # the choice follows the change's share (counted by the bench) against the crossover
        if s.share > 2 * ADAPTIVE_CROSSOVER:
            assert s.adaptive_mode == "FULL", s
        elif s.share < ADAPTIVE_CROSSOVER / 2:
            assert s.adaptive_mode == "INCREMENTAL", s
        assert f"ADAPTIVE chose {s.adaptive_mode.lower()}: " in s.adaptive_reason
    assert replace.adaptive_mode == "FULL" and st.steps[0].adaptive_mode == "INCREMENTAL"
    per = st.per_step()  # whether ADAPTIVE chose the mode whose table was faster in each step, counted from the steps
    faster = [s.adaptive_mode == ("INCREMENTAL" if s.incremental_s <= s.full_s else "FULL") for s in st.steps]
    assert per["chose_faster"] == sum(faster) and goals["adaptive_per_step_met"] == (per["over_goal"] == 0)
    for s in st.steps:  # each step keeps both refreshes' phases; the gap is ADAPTIVE's less INCREMENTAL's, by phase
        assert set(ALWAYS) <= set(s.incremental_phases) and set(ALWAYS) <= set(s.adaptive_phases)
        if s.adaptive_mode == "INCREMENTAL":
            assert s.gap["delta"] == pytest.approx(s.adaptive_phases["delta"] - s.incremental_phases["delta"], abs=0.1)
    # each mode's REPLICAS tables refreshed after every change, in rounds of one per mode whose order turns with the
    # step and the round; a step's time per mode is the (lower) median of its tables', the noise their spread
    turns = ("IFA", "FAI", "AIF")
    for i, s in enumerate(st.steps):
        assert s.order == "".join(turns[(i + k) % 3] for k in range(REPLICAS)), (i, s.order)
        for median, times in (
            (s.incremental_s, s.incremental_tables_s),
            (s.full_s, s.full_tables_s),
            (s.adaptive_s, s.adaptive_tables_s),
        ):
            assert len(times) == REPLICAS and median == sorted(times)[(REPLICAS - 1) // 2]
        assert s.adaptive_modes == [s.adaptive_mode] * REPLICAS  # the same change, the same choice in every table
    one = [s.adaptive_tables_s[0] / min(s.incremental_tables_s[0], s.full_tables_s[0]) for s in st.steps]
    assert per["one_table"]["worst"] == pytest.approx(max(one), abs=0.001)
    assert per["one_table"]["over_goal"] == sum(x > 1.1 for x in one)
    spreads = [
        max(t) / min(t) for s in st.steps for t in (s.incremental_tables_s, s.full_tables_s, s.adaptive_tables_s)
    ]
    assert per["noise_worst"] == pytest.approx(max(spreads), abs=0.001) and per["noise_worst"] >= 1
    assert any(n.startswith(f"stream of {STREAM} refreshes") for n in report.notes)
    assert any(f"each mode's time the median of its {REPLICAS} tables" in n for n in report.notes)
    # the star join: one delta term per fact append (the refresher's own count; the dimensions did not change), the
    # ratio from the same refreshes; the chain: three INCREMENTAL refreshes, upstream first, per row
    sj = r.star
    assert sj.base_rows == 2000 and sj.append_rows == 20 and len(sj.joined_s) == len(sj.plain_s) == STAR_RUNS
    assert sj.joined_terms == [1] * STAR_RUNS and sj.joined_how.startswith("inserts merged into")
    assert sj.joined_copied == [3] * STAR_RUNS  # the unchanged dimensions were read from copies in memory
    assert goals["star"]["ratio"] == sj.ratio and goals["star"]["goal"] == 1.2
    assert len(r.chain.end_to_end_s) == CHAIN_RUNS
    assert r.chain.refreshes[0] == [f"{n.split('.')[1]} SUCCEEDED INCREMENTAL" for n in CHAIN]
    assert any(n.startswith("star join (1 fact of 2,000 rows + 3 dimensions)") for n in report.notes)
    assert any(n.startswith("one row through a chain of 3 DOWNSTREAM tables") for n in report.notes)
    with Lake(stack.platform.endpoints()) as lake:
        for name in (TRIPS, *replicas(INC), *replicas(ADAPT), SMALL, FACTS, JOINED, CHAIN[-1]):
            schema, table = name.split(".")
            assert not table_exists(lake.con, lake.alias, schema, table)
