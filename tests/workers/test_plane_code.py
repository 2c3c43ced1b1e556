"""A plane (or a console) that runs code which is no longer here is started anew, not reused: after a `git pull` or
an upgrade its processes would take the new code's tasks with their old functions (seen: an old console process
sent old-style arguments to workers running new code, and every task failed with a TypeError)."""

from __future__ import annotations

from pathlib import Path

from ducklake_kit.platforms import procs
from ducklake_kit.workers import plane


def test_the_code_fingerprint_follows_the_source_files(tmp_path):
    fingerprint = procs.code_fingerprint.__wrapped__  # the uncached function: the files change under it
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "tasks.py").write_text("def f(a): return a\n")
    (tmp_path / "notes.txt").write_text("not code")
    first = fingerprint(tmp_path)
    assert fingerprint(tmp_path) == first  # stable while nothing changes
    (tmp_path / "notes.txt").write_text("still not code")
    assert fingerprint(tmp_path) == first
    (tmp_path / "pkg" / "tasks.py").write_text("def f(a, b): return a\n")
    assert fingerprint(tmp_path) != first
    assert procs.code_fingerprint() == procs.code_fingerprint(Path(procs.__file__).resolve().parents[1])


def _pids(status: plane.PlaneStatus) -> dict[str, int | None]:
    return {w.name: w.pid for w in status.workers} | {"scheduler": status.scheduler_pid}


def test_up_starts_a_plane_of_other_code_anew_and_reuses_one_of_this_code(stack):
    ep = stack.platform.endpoints()
    before = plane.up(stack.state, ep)
    assert stack.state.settings()["plane_code"] == procs.code_fingerprint()
    stack.state.save_settings(plane_code="0123456789abcdef")  # what a plane started by another checkout records
    again = plane.up(stack.state, ep)
    assert again.detail.startswith("restarted: the kit's code changed since the plane started"), again.detail
    assert again.healthy and len(again.workers) == len(before.workers)
    assert not set(_pids(before).values()) & set(_pids(again).values())  # every process is new
    assert stack.state.settings()["plane_code"] == procs.code_fingerprint()
    third = plane.up(stack.state, ep)
    assert third.detail == "already running, reused" and _pids(third) == _pids(again)
