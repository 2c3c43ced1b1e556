"""The time-travel lesson against the real stack: every figure checked, re-runnable, and the checks can fail."""

from __future__ import annotations

import dataclasses

import pytest

from ducklake_kit.checks import CheckRun
from ducklake_kit.lake import Lake
from ducklake_kit.lessons import timetravel
from ducklake_kit.lessons.timetravel import SCHEMA, build_story, check_story
from ducklake_kit.platforms.kit import Kit

pytestmark = [pytest.mark.integration, pytest.mark.spark]
ROWS = 4000  # per month: small, every figure is checked exactly anyway


def _failed(checks: CheckRun) -> list[str]:
    return [c.name for c in checks.failed]


def test_the_lesson_checks_every_figure_and_a_rerun_tells_the_same_story(stack):
    with Lake(stack.platform.endpoints()) as lake:
        main_before = lake.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND schema_name = 'main'"
        ).fetchone()
    runs = []
    for _ in range(2):
        checks = CheckRun()
        runs.append(timetravel.run(Kit.on(stack.platform, stack.state), checks, rows_per_month=ROWS))
        assert checks.ok, [c.as_dict() for c in checks.failed]
    first, second = runs
    # the same story, in later snapshots: the same counts and changes per step
    assert [c["trips"] for c in first.counts_at_version] == [c["trips"] for c in second.counts_at_version]
    assert second.story.month1 > first.story.restore
    assert second.name == "timetravel" and second.ok and len(second.checks) >= 8 and second.seconds > 0
    counts = {c["step"]: c["trips"] for c in second.counts_at_version}
    m1, m2 = second.story.accepted
    zero = second.story.zero_distance
    assert counts == {"month 1": m1, "month 2": m1 + m2, "correction": m1 + m2 - zero, "restore": m1 + m2}
    assert 0 < zero < m1 + m2 and m1 + m2 < 2 * ROWS  # some trips quarantined, some corrected
    assert second.at_timestamp["trips"] == m1
    assert second.changes[1] == {
        "from": second.story.month2,
        "to": second.story.correction,
        "delete": zero,
        "insert": m2,
    }
    with Lake(stack.platform.endpoints()) as lake:
        # only one lesson schema's worth of tables, and `main` untouched
        assert (
            lake.scalar(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND schema_name = ?", [SCHEMA]
            )
            == 4
        )
        assert (
            lake.con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND schema_name = 'main'"
            ).fetchone()
            == main_before
        )


def test_tampered_expectations_and_a_changed_table_fail_the_checks(stack):
    checks = CheckRun()
    story = build_story(Kit.on(stack.platform, stack.state), checks, rows_per_month=ROWS)
    with Lake(stack.platform.endpoints()) as lake:
        honest = CheckRun()
        check_story(lake, story, honest)
        assert honest.ok, [c.as_dict() for c in honest.failed]

        wrong = CheckRun()
        check_story(lake, dataclasses.replace(story, zero_distance=story.zero_distance + 1), wrong)
        assert not wrong.ok
        assert any("AT (VERSION =>" in n and "[correction]" in n for n in _failed(wrong))
        assert any("ducklake_table_changes" in n for n in _failed(wrong))

        off_by_one = CheckRun()
        check_story(lake, dataclasses.replace(story, accepted=[story.accepted[0] - 1, story.accepted[1]]), off_by_one)
        assert any("AT (TIMESTAMP =>" in n for n in _failed(off_by_one))

        # one trip changed behind the lesson's back: the restored table no longer equals the earlier version
        lake.con.execute(
            f"UPDATE {SCHEMA}.trips SET tip_amount = tip_amount + 0.01 WHERE rowid = (SELECT min(rowid) FROM {SCHEMA}.trips)"
        )
        changed = CheckRun()
        check_story(lake, story, changed)
        assert sorted(n for n in _failed(changed) if "EXCEPT ALL" in n) == [
            f"restored table EXCEPT ALL version {story.month2}: no extra rows",
            f"version {story.month2} EXCEPT ALL restored table: no missing rows",
        ]
