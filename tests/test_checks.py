"""CheckRun: ok only when checks ran and all held."""

from __future__ import annotations

from ducklake_kit.checks import CheckRun


def test_check_run_is_not_ok_without_checks_or_with_one_failure():
    run = CheckRun()
    assert not run.ok  # nothing checked is not a pass
    run.equal("a", 1, 1)
    assert run.ok
    run.equal("b", [1, 2], [1, 3])
    assert not run.ok and [c.name for c in run.failed] == ["b"]
