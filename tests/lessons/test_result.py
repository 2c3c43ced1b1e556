"""The one shape of a lesson (issue 24), without the stack: every lesson module exposes `run(kit, checks, ...)`
returning its own LessonResult; `@lesson` gives the result the checks that run added and its seconds; `as_dict()`
keeps the JSON the commands and `all` printed when the lessons returned dicts."""

from __future__ import annotations

import importlib
import inspect
import time

import pytest

from ducklake_kit import all as all_flow
from ducklake_kit.checks import CheckRun
from ducklake_kit.lessons import foundation, maintain, pipeline, queries, steps, timetravel, workers
from ducklake_kit.lessons.result import LessonResult, lesson
from ducklake_kit.lessons.workers import PLANE_OFF

LESSONS = ["foundation", "queries", "timetravel", "maintain", "workers", "pipeline", "steps", "dynamic"]


@pytest.mark.parametrize("name", LESSONS)
def test_every_lesson_is_run_of_kit_and_checks_returning_its_typed_result(name):
    module = importlib.import_module(f"ducklake_kit.lessons.{name}")
    signature = inspect.signature(module.run)
    assert list(signature.parameters)[:2] == ["kit", "checks"]
    assert all(p.kind is p.KEYWORD_ONLY for p in list(signature.parameters.values())[2:])  # options by name
    result_type = getattr(module, signature.return_annotation)  # a class of the lesson's own module
    assert issubclass(result_type, LessonResult) and result_type is not LessonResult
    # one verb: no other run_* entry point of its own (maintain keeps run_maintain for notebook 05, returning the dict)
    own = [n for n, v in vars(module).items() if getattr(v, "__module__", None) == module.__name__]
    assert [n for n in own if n.startswith("run_")] == (["run_maintain"] if name == "maintain" else [])


def test_lesson_keeps_only_the_checks_its_run_added_and_its_seconds():
    @lesson("demo")
    def run(kit, checks: CheckRun, *, wrong: bool = False) -> workers.WorkersResult:
        checks.equal("demo: one", 1, 1)
        checks.equal("demo: two", 2, 3 if wrong else 2)
        time.sleep(0.01)
        return workers.WorkersResult(workers=["w1"])

    shared = CheckRun()
    shared.equal("an earlier stage's check", 0, 1)  # failed, and not the lesson's
    good = run(None, shared)
    assert (good.name, [c.name for c in good.checks], good.ok) == ("demo", ["demo: one", "demo: two"], True)
    assert good.seconds >= 0.01
    bad = run(None, shared, wrong=True)
    assert not bad.ok and [(c.name, c.expected, c.actual) for c in bad.failed] == [("demo: two", 3, 2)]
    assert len(shared.checks) == 5  # the shared CheckRun still holds every check, in order


def test_a_lesson_skipped_because_the_plane_is_off_is_not_a_failure_and_prints_as_before():
    assert workers.WorkersResult(skipped=PLANE_OFF).ok
    assert workers.WorkersResult(skipped=PLANE_OFF).as_dict() == {"workers": [], "skipped": PLANE_OFF}
    assert workers.WorkersResult(workers=["w1"]).as_dict() == {"workers": ["w1"]}  # fewer than two: no tasks
    assert workers.WorkersResult(workers=["w1", "w2"], tasks=3, ran_on=["w1", "w2"]).as_dict() == {
        "workers": ["w1", "w2"],
        "tasks": 3,
        "ran_on": ["w1", "w2"],
    }
    assert pipeline.PipelineResult(skipped=PLANE_OFF).as_dict() == {"skipped": PLANE_OFF}
    assert steps.StepsResult(skipped=PLANE_OFF).as_dict() == {"skipped": PLANE_OFF}


def test_steps_prints_the_runner_s_seconds_not_the_lesson_s():
    done = steps.StepsResult(
        playbook="p.yaml", execution_id="e1", statuses=["ok"], iterations=8, workers=["w1"], run_seconds=1.5
    )
    done.seconds = 9.0
    assert done.as_dict() == {
        "playbook": "p.yaml",
        "execution_id": "e1",
        "steps": ["ok"],
        "iterations": 8,
        "workers": ["w1"],
        "seconds": 1.5,
    }


def test_maintain_prints_a_dry_run_and_a_real_run_with_the_keys_it_always_had():
    base = {"dry_run": True, "cutoff": "2026-11-25T00:00:00+00:00", "versions": None, "before": {"snapshots": 3}}
    dry = maintain.MaintainResult(**base, after={"snapshots": 3}, would={"expire_snapshots": [1]})
    dry.unreferenced_left = {"running": 0, "dead": 0, "other": 0}
    assert list(dry.as_dict()) == ["dry_run", "cutoff", "versions", "before", "would", "unreferenced_left", "after"]
    assert "done" not in dry.as_dict()  # tests/cli/test_cli_json.py pins it
    real = maintain.MaintainResult(**{**base, "dry_run": False}, done=maintain.Done(expired=[1]))
    assert list(real.as_dict()) == [
        "dry_run",
        "cutoff",
        "versions",
        "before",
        "unreferenced_left",
        "done",
        "after",
        "other_writers_snapshots",
        "reachability",
        "deleted_from_s3",
    ]
    assert list(real.as_dict()["done"]) == ["flushed", "merged", "expired", "cleaned", "orphans_deleted"]
    real.done.dead_load_files_deleted = []  # asked for (`--dead-loads`), even when none were found
    assert real.as_dict()["done"]["dead_load_files_deleted"] == []


def test_queries_prints_whole_answers_for_query_and_a_summary_for_all():
    done = queries.QueriesResult(answers={"q1": queries.Answer(["vendor", "trips"], [(1, 10), (2, 5)], 0.012345)})
    columns, rows, seconds = done.answers["q1"]
    assert rows == [(1, 10), (2, 5)]  # an Answer unpacks as the (columns, rows, seconds) it was
    assert done.as_dict() == {"queries": {"q1": {"columns": columns, "rows": [[1, 10], [2, 5]], "seconds": seconds}}}
    assert done.summary() == {"q1": {"rows": 2, "seconds": 0.0123}}


def test_all_prints_each_stage_from_its_typed_result():
    story = timetravel.Story(
        before=1,
        month1=2,
        month2=3,
        correction=4,
        restore=5,
        accepted=[10, 20],
        zero_distance=1,
        deleted=1,
        reinserted=1,
    )
    result = all_flow.AllResult(
        foundation.FoundationResult(table="lake.main.foundation", snapshots=[7, 8], catalog_info={"snapshot_id": 8}),
        timetravel=timetravel.TimetravelResult(
            story=story, snapshots=[], counts_at_version=[], at_timestamp={}, changes=[], restore={}
        ),
        maintain=maintain.MaintainResult(
            dry_run=False, cutoff="c", versions=[2], before={"a": 1}, after={"a": 2}, done=maintain.Done(expired=[2])
        ),
        workers=workers.WorkersResult(skipped=PLANE_OFF),
        catalog_info={"snapshot_id": 99},
    )
    assert result.as_dict() == {
        "table": "lake.main.foundation",
        "snapshots": [7, 8],
        "timetravel": {"snapshots": [2, 3, 4, 5]},
        "maintain": {"expired": [2], "before": {"a": 1}, "after": {"a": 2}},
        "workers": {"workers": [], "skipped": PLANE_OFF},
    }  # catalog_info travels in the envelope, the one read after everything
