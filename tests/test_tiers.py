"""The test tiers: tests/conftest.py marks a test `service` (and `integration` or `spark`) from the fixtures it uses,
so `pytest -m "not service"` (just test-fast) runs only tests that start nothing; and a test that reaches a stack
or Spark without being marked (a fixture asked for at run time) is stopped before anything starts. Each test runs a
small pytest session with the real conftest; it starts no service when the tiers work."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py").read_text(encoding="utf-8")

# prints each collected test with its markers, as the session that runs it sees them
SHOW_MARKS = """

def pytest_collection_finish(session):
    for item in session.items:
        print("MARKS", item.name, ",".join(sorted({m.name for m in item.iter_markers()})))
"""

SUBJECTS = """
import pytest

@pytest.fixture
def lake(stack):  # a fixture of a test module built on the session's stack
    return stack

def test_plain(tmp_path):
    pass

def test_stack(stack):
    pass

def test_module_stack(module_stack):
    pass

def test_through_a_fixture(lake):
    pass

def test_private_stack(fresh_stack):
    pass

def test_labs(lab_stack):
    pass

def test_spark(spark):
    pass

def test_time_zone(time_zone):
    pass

@pytest.mark.integration
def test_marked_by_hand():
    pass
"""

SNEAKY = """
import pytest

@pytest.mark.parametrize("fixture", ["stack", "module_stack", "fresh_stack", "lab_stack", "spark"])
def test_sneaks_in(request, fixture):
    request.getfixturevalue(fixture)  # invisible to collection: this test is not marked `service`
"""


def test_tests_are_marked_by_the_fixtures_they_use(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST + SHOW_MARKS)
    pytester.makepyfile(test_subjects=SUBJECTS)
    result = pytester.runpytest_subprocess("--collect-only", "-q", "-p", "no:cacheprovider")
    marks = dict(line.split(" ", 2)[1:] for line in result.outlines if line.startswith("MARKS "))
    assert marks == {
        "test_plain": "",
        "test_stack": "integration,service",
        "test_module_stack": "integration,service",
        "test_through_a_fixture": "integration,service",
        "test_private_stack": "integration,service",
        "test_labs": "integration,service",
        "test_spark": "service,spark",
        "test_time_zone": "service,spark",
        "test_marked_by_hand": "integration,service",
    }


def test_an_unmarked_test_may_not_start_a_service(pytester: pytest.Pytester):
    # without the refusal these tests pass, having started PostgreSQL, rclone or a Spark JVM in the fast tier
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_sneaky=SNEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "not service")
    result.assert_outcomes(failed=5)
    for fixture, what in [
        ("stack", "PostgreSQL and rclone S3"),
        ("module_stack", "PostgreSQL and rclone S3"),
        ("fresh_stack", "PostgreSQL and rclone S3"),
        ("lab_stack", "PostgreSQL and rclone S3"),
        ("spark", "a SparkSession"),
    ]:
        result.stdout.fnmatch_lines([f"*test_sneaks_in?{fixture}? starts {what}* but is not marked `service`*"])
