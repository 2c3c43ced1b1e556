"""The suite registry (bench/suites.py): each suite's declared options are exactly the keyword parameters of its run
function and each is read there (so an option cannot be silently ignored again); the options the registry knows
are the `bench` command's; `prepare` refuses an option a suite does not take. No service is started."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import typer

from ducklake_kit.bench import suites
from ducklake_kit.cli import app
from ducklake_kit.errors import EXIT_USAGE, KitError


def _names_read(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    return {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def test_the_seven_suites_are_registered_in_the_order_help_lists_them():
    assert list(suites.SUITES) == ["load", "queries", "concurrency", "pipeline", "steps", "dynamic", "console"]


@pytest.mark.parametrize("name", ["load", "queries", "concurrency", "pipeline", "steps", "dynamic", "console"])
def test_a_suite_takes_exactly_the_options_it_declares_and_reads_each(name):
    s = suites.SUITES[name]
    params = inspect.signature(s.run).parameters
    assert next(iter(params)) == "kit"
    keyword = {p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keyword == set(s.takes) == set(params) - {"kit"}
    assert set(s.takes) <= set(suites.OPTIONS)
    unread = set(s.takes) - _names_read(s.run)
    assert unread == set(), f"--suite {name} declares {sorted(unread)} but its run never reads them"
    assert all(meaning.strip() for meaning in s.takes.values())


def test_the_read_check_can_fail():
    def ignores(kit, *, rows=None, ops=100):
        return rows

    assert {"rows", "ops"} - _names_read(ignores) == {"ops"}


def test_every_option_is_taken_by_some_suite_and_is_a_bench_option():
    assert {o for s in suites.SUITES.values() for o in s.takes} == set(suites.OPTIONS)
    bench = typer.main.get_command(app).commands["bench"]
    flags = {opt for p in bench.params for opt in p.opts} - {"--suite", "--json", "--help"}
    assert flags == {suites.flag(o) for o in suites.OPTIONS}


def test_prepare_keeps_the_options_given_and_parses_rows():
    p = suites.prepare("load", {"rows": ["1_000,2000", "3000"], "out": None, "ops": None})
    assert p.suite.name == "load" and p.options == {"rows": (1000, 2000, 3000)}
    assert suites.prepare("concurrency", {"writers": 2, "ops": 5}).options == {"writers": 2, "ops": 5}
    assert suites.prepare("dynamic", {"rows": [5000]}).options == {"rows": (5000,)}  # a notebook's ints


@pytest.mark.parametrize(
    "name, given, line",
    [
        (
            "load",
            {"ops": 5},
            "Error: --ops means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --ops is "
            "for --suite concurrency, steps).",
        ),
        (
            "steps",
            {"modes": "file"},
            "Error: --modes means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, "
            "--out; --modes is for --suite concurrency).",
        ),
        (
            "load",
            {"rows": ["1e6"]},
            "Error: --rows 1e6 is not a list of whole numbers. Try: e.g. --rows 1000000,10000000.",
        ),
        (
            "sqlite",
            {},
            "Error: unknown suite 'sqlite'. Try: choose one of: load, queries, concurrency, pipeline, steps, dynamic, "
            "console.",
        ),
    ],
)
def test_prepare_refuses_in_one_line(name, given, line):
    with pytest.raises(KitError) as caught:
        suites.prepare(name, given)
    assert caught.value.line() == line
    assert caught.value.exit_code == (3 if name == "sqlite" else EXIT_USAGE)


def test_help_says_what_an_option_means_to_each_suite():
    assert suites.help_for("workers") == (
        "pipeline: the worker plane's Dask workers (default 2); steps: the worker plane's Dask workers (default 3)."
    )
    assert suites.help_for("out") == "every suite: also write the results to this JSON file."
