"""`bench --suite steps` on a short loop, on the real worker plane: every iteration's row is counted in the lake
(read after the run, not taken from the runner's report), the direct and plane figures come from the same run, and
the ratio is computed from them. Nothing here is timed against a goal."""

from __future__ import annotations

import json

import pytest

from ducklake_kit.bench import reports
from ducklake_kit.bench.steps import bench_steps
from ducklake_kit.lake import Lake
from ducklake_kit.platforms.kit import Kit


def test_steps_bench_counts_every_iteration_and_compares_in_one_run(stack, tmp_path):
    out = tmp_path / "steps.json"
    r = bench_steps(Kit.on(stack.platform, stack.state), workers=2, iterations=12, json_path=out)
    f = r.runner
    assert (f.iterations, f.errors, f.rows_lost, f.duplicate_rows, f.rows_counted) == (12, 0, 0, 0, 12)
    with Lake(stack.platform.endpoints()) as lake:  # independently of the runner's report
        assert lake.con.execute(
            "SELECT count(*), count(DISTINCT i), min(i), max(i) FROM bench.step_inserts"
        ).fetchone() == (12, 12, 0, 11)
        assert {r[0] for r in lake.con.execute("SELECT DISTINCT worker FROM bench.step_inserts").fetchall()} <= {
            "w1",
            "w2",
        }
    assert set(f.workers_used) <= {"w1", "w2"} and f.total_s > 0 and f.median_ms <= f.p95_ms
    assert r.direct_inserts == 12 and r.direct_errors == 0 and r.direct_rows_lost == 0 and r.plane_rows_lost == 0
    assert r.ratio_vs_direct == pytest.approx(f.total_s / r.direct_total_scaled_s, abs=0.01)
    assert r.defect() is None
    doc = json.loads(out.read_text())
    assert doc["seed"] == {"total_s": 28.0, "median_ms": 280.0} and doc["goal_vs_direct"] == 1.3
    assert doc["machine"]["cores"] and doc["runner"]["rows_counted"] == 12
    report = reports.steps_report(r)  # what `bench --suite steps` prints
    assert report.table.title.startswith("bench --suite steps: 12 one-row INSERTs over 2 workers")
    assert report.table.rows[1][0] == "direct: 2 processes x 6, scaled to 12" and report.defect is None
    assert report.passed == ["PASS: all 12 iterations inserted their row exactly once (12 rows counted)"]
