"""The console suite's report, without services (the suite itself drives a browser: `bench --suite console`): the
ratios it prints are computed from the runs, a wrong answer makes the run a defect (exit 1), a goal not met says so."""

from __future__ import annotations

from ducklake_kit.bench.console import ConsoleBench, report
from ducklake_kit.bench.results import Machine


def _bench(**changes) -> ConsoleBench:
    figures = {
        "rows": 10_000_000,
        "runs": 3,
        "first_page_s": [0.6, 0.8, 0.7],
        "drawn_s": [0.5, 0.6, 0.5],
        "start_s": [2.0, 2.1, 2.2],
        "query_console_s": [1.0, 1.2, 1.1],
        "query_sql_s": [2.0, 2.2, 2.4],
        "query_attached_s": [0.9, 1.0, 1.0],
        "drawn": 1000,
        "total_rows": 5000,
        "alone_s": [0.1, 0.2, 0.2],
        "sessions_s": [0.3] * 19 + [1.2],
        "answers_right": 20,
        "wrong": [],
        "machine": Machine(2, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),
        "alone_worker_s": [0.08, 0.1, 0.1],
        "sessions_worker_s": [0.1] * 19 + [0.2],
    }
    return ConsoleBench(**(figures | changes))


def test_the_goals_are_computed_from_the_medians():
    r = _bench()
    assert (r.first_page_median_s, r.vs_sql, r.vs_attached, r.worst_vs_alone) == (0.7, 0.5, 1.1, 6.0)
    rows = {row[0]: row for row in report(r).table.rows}
    assert rows["first page ready after the URL"][3] == "met"
    assert rows["same query as `sql` runs it"][3] == "0.5x met"
    assert rows["20 sessions at once: slowest"][3] == "6.0x NOT met"  # 1.2 s against 0.2 s alone
    assert report(r).defect is None


def test_a_wrong_answer_is_a_defect():
    made = report(_bench(answers_right=19, wrong=["session 3: [['3', '1']] (the lake: [(3, 2)])"]))
    assert made.defect == "session 3: [['3', '1']] (the lake: [(3, 2)])"


def test_where_the_sessions_waited_is_computed_from_the_workers_time():
    r = _bench()
    # 2.1 s of worker time on 2 workers while the slowest session took 1.2 s: busy 2.1 / 2.4
    assert r.plane_busy == 0.88
    note = next(n for n in report(r).notes if n.startswith("where the 20 sessions waited"))
    assert "ran their queries for 2.10 s in all while the slowest session took 1.2 s: busy 88%" in note
    assert "0.1 s alone, 0.1 s among the others" in note and "add 0.1 s to an answer alone" in note
    assert _bench(sessions_worker_s=[0.06] * 20).plane_busy == 0.5  # the workers idled half the time
