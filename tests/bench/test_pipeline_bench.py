"""`bench --suite pipeline` on a tiny DAG, on the real worker plane: the figures are consistent with each other (no
run beats its bound, the serial run is serial, the order held). Nothing here is timed against a goal."""

from __future__ import annotations

import json

import pytest

from ducklake_kit.bench import reports
from ducklake_kit.bench.pipeline import DagShape, bench_pipeline, dag_source
from ducklake_kit.pipelines.dag import build
from ducklake_kit.platforms.kit import Kit


def test_the_generated_dag_is_k_independent_nodes_and_a_chain():
    dag = build(dag_source(3, 2, 1000), "<bench dag>")
    assert dag.waves() == [["i1", "i2", "i3", "c1"], ["c2"]]


def test_pipeline_bench_figures_hold_together(stack, tmp_path):
    out = tmp_path / "pipeline.json"
    r = bench_pipeline(
        Kit.on(stack.platform, stack.state),
        workers=2,
        shape=DagShape(
            independent=3,
            chain=2,
            node_s=0.1,
            scheduling_nodes=6,
            lake_nodes=3,
            months=3,
            month_rows=1000,
            keys=200,
            changed_keys=10,
        ),
        json_path=out,
    )
    p, s = r.parallel, r.serial
    assert (p.nodes, s.nodes) == (5, 5) and r.order_held
    assert p.bound_s == pytest.approx(max(p.critical_path_s, p.total_node_s / 2), abs=0.002)  # figures rounded to ms
    assert p.makespan_s >= p.bound_s * 0.99  # no schedule beats max(critical path, total / workers)
    # one worker runs the serial DAG: its nodes never overlap, so it lasts at least as long as their sum
    assert s.makespan_s >= s.total_node_s * 0.99 and s.bound_s == pytest.approx(s.total_node_s, abs=0.002)
    assert r.scheduling_ms_per_node > 0
    # the change-aware pair: the second run of the unchanged lake DAG ran nothing, and is timed end to end
    c = r.changes
    assert (c.nodes, c.unchanged_nodes) == (3, 3) and c.forced_run_s > 0 and c.unchanged_run_s > 0
    # the incremental node after one more month read that month's rows alone: 1000 of 4000 (every month the same size)
    i = r.incremental
    assert (i.mode, i.equals_full, i.rows_read_incremental, i.rows_full_rebuild) == ("incremental", True, 1000, 4000)
    assert i.ratio == 0.25 and i.full_run_s > 0 and i.incremental_run_s > 0
    doc = json.loads(out.read_text())
    assert set(doc["goals"]) == {"makespan <= 1.15 x bound", "scheduling < 10 ms a node"}
    assert doc["machine"]["cores"] and doc["parallel"]["vs_bound"] == p.vs_bound
    report = reports.pipeline_report(r)  # what `bench --suite pipeline` prints
    assert [row[:2] for row in report.table.rows] == [
        ["DAG on 2 workers", p.makespan_s],
        ["serial (one worker)", s.makespan_s],
    ]
    assert report.defect is None and json.loads(json.dumps(report.as_dict(), default=str)) == doc
    assert doc["changes"]["unchanged_nodes"] == 3
    assert (
        report.notes[-3].startswith("change-aware: 3 lake tables, a --force run")
        and "3 of 3 nodes unchanged" in (report.notes[-3])
    )
    assert report.notes[-2].startswith("incremental_by_time after one more month (3 before, 1,000 rows each): read ")
    assert "(ratio 0.25, 1/4 = 0.2500)" in report.notes[-2] and report.notes[-2].endswith("full rebuild: yes")
    # incremental_by_key: 5 existing accounts got a row and 5 new ones appeared, so its MERGE wrote those 10 rows
    # (5 updated, 5 inserted) of the 205 a full rebuild writes
    k = r.by_key
    assert (k.mode, k.equals_full, k.changed_keys, k.rows_merged, k.rows_full_rebuild) == (
        "incremental",
        True,
        10,
        10,
        205,
    )
    assert report.notes[-1].startswith("incremental_by_key after 10 of 200 accounts changed (2,000 ledger rows): ")
    assert "merged 10 of the 205 rows a full rebuild writes (ratio 0.04878)" in report.notes[-1]
