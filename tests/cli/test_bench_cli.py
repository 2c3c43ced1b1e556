"""`bench` as a thin command: an option the suite does not take is refused in one line (exit 2) before anything
starts; the options given reach the suite as given; its Report is rendered as a table, lines, `--json` and exit 1
on a defect. No service is started: the figures themselves are tests/bench's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ducklake_kit.bench import suites
from ducklake_kit.bench.results import Report, Table

# every refusal: (suite, the option given, the one line on stderr)
REFUSALS = [
    ("load", ["--runs", "3"], "--runs means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --runs is for --suite queries, dynamic, console)."),
    ("load", ["--months", "3"], "--months means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --months is for --suite dynamic)."),
    ("load", ["--file-cache"], "--file-cache means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --file-cache is for --suite dynamic)."),
    ("load", ["--workers", "2"], "--workers means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --workers is for --suite pipeline, steps)."),
    ("load", ["--writers", "2"], "--writers means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --writers is for --suite concurrency)."),
    ("load", ["--ops", "5"], "--ops means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --ops is for --suite concurrency, steps)."),
    ("load", ["--modes", "file"], "--modes means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --modes is for --suite concurrency)."),
    ("load", ["--png", "x.png"], "--png means nothing to --suite load. Try: drop it (--suite load takes --rows, --out; --png is for --suite queries, concurrency)."),
    ("queries", ["--months", "3"], "--months means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --months is for --suite dynamic)."),
    ("queries", ["--workers", "2"], "--workers means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --workers is for --suite pipeline, steps)."),
    ("queries", ["--ops", "5"], "--ops means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --ops is for --suite concurrency, steps)."),
    ("concurrency", ["--rows", "1000"], "--rows means nothing to --suite concurrency. Try: drop it (--suite concurrency takes --writers, --ops, --modes, --out, --png; --rows is for --suite load, queries, dynamic, console)."),
    ("concurrency", ["--workers", "3"], "bench --suite concurrency takes --writers N (the concurrent writers); --workers is the worker plane's Dask workers. Try: bench --suite concurrency --writers 3."),
    ("concurrency", ["--runs", "3"], "--runs means nothing to --suite concurrency. Try: drop it (--suite concurrency takes --writers, --ops, --modes, --out, --png; --runs is for --suite queries, dynamic, console)."),
    ("pipeline", ["--writers", "2"], "--writers is for --suite concurrency, not pipeline. Try: bench --suite pipeline --workers 2."),
    ("pipeline", ["--ops", "5"], "--ops means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --ops is for --suite concurrency, steps)."),
    ("pipeline", ["--png", "x.png"], "--png means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --png is for --suite queries, concurrency)."),
    ("steps", ["--writers", "2"], "--writers is for --suite concurrency, not steps. Try: bench --suite steps --workers 2."),
    ("steps", ["--modes", "file"], "--modes means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --modes is for --suite concurrency)."),
    ("steps", ["--rows", "1000"], "--rows means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --rows is for --suite load, queries, dynamic, console)."),
    ("dynamic", ["--workers", "2"], "--workers means nothing to --suite dynamic. Try: drop it (--suite dynamic takes --rows, --runs, --months, --file-cache, --out; --workers is for --suite pipeline, steps)."),
    ("dynamic", ["--ops", "5"], "--ops means nothing to --suite dynamic. Try: drop it (--suite dynamic takes --rows, --runs, --months, --file-cache, --out; --ops is for --suite concurrency, steps)."),
    ("dynamic", ["--modes", "file"], "--modes means nothing to --suite dynamic. Try: drop it (--suite dynamic takes --rows, --runs, --months, --file-cache, --out; --modes is for --suite concurrency)."),
    ("dynamic", ["--png", "x.png"], "--png means nothing to --suite dynamic. Try: drop it (--suite dynamic takes --rows, --runs, --months, --file-cache, --out; --png is for --suite queries, concurrency)."),
    ("queries", ["--file-cache"], "--file-cache means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --file-cache is for --suite dynamic)."),
    ("queries", ["--writers", "2"], "--writers means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --writers is for --suite concurrency)."),
    ("queries", ["--modes", "file"], "--modes means nothing to --suite queries. Try: drop it (--suite queries takes --rows, --runs, --out, --png; --modes is for --suite concurrency)."),
    ("concurrency", ["--months", "2"], "--months means nothing to --suite concurrency. Try: drop it (--suite concurrency takes --writers, --ops, --modes, --out, --png; --months is for --suite dynamic)."),
    ("concurrency", ["--file-cache"], "--file-cache means nothing to --suite concurrency. Try: drop it (--suite concurrency takes --writers, --ops, --modes, --out, --png; --file-cache is for --suite dynamic)."),
    ("pipeline", ["--rows", "1000"], "--rows means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --rows is for --suite load, queries, dynamic, console)."),
    ("pipeline", ["--runs", "2"], "--runs means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --runs is for --suite queries, dynamic, console)."),
    ("pipeline", ["--months", "2"], "--months means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --months is for --suite dynamic)."),
    ("pipeline", ["--file-cache"], "--file-cache means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --file-cache is for --suite dynamic)."),
    ("pipeline", ["--modes", "file"], "--modes means nothing to --suite pipeline. Try: drop it (--suite pipeline takes --workers, --out; --modes is for --suite concurrency)."),
    ("steps", ["--runs", "2"], "--runs means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --runs is for --suite queries, dynamic, console)."),
    ("steps", ["--months", "2"], "--months means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --months is for --suite dynamic)."),
    ("steps", ["--file-cache"], "--file-cache means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --file-cache is for --suite dynamic)."),
    ("steps", ["--png", "x.png"], "--png means nothing to --suite steps. Try: drop it (--suite steps takes --workers, --ops, --out; --png is for --suite queries, concurrency)."),
    ("dynamic", ["--writers", "2"], "--writers means nothing to --suite dynamic. Try: drop it (--suite dynamic takes --rows, --runs, --months, --file-cache, --out; --writers is for --suite concurrency)."),
    ("console", ["--months", "3"], "--months means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --months is for --suite dynamic)."),
    ("console", ["--file-cache"], "--file-cache means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --file-cache is for --suite dynamic)."),
    ("console", ["--workers", "2"], "--workers means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --workers is for --suite pipeline, steps)."),
    ("console", ["--writers", "2"], "--writers means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --writers is for --suite concurrency)."),
    ("console", ["--ops", "5"], "--ops means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --ops is for --suite concurrency, steps)."),
    ("console", ["--modes", "file"], "--modes means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --modes is for --suite concurrency)."),
    ("console", ["--png", "x.png"], "--png means nothing to --suite console. Try: drop it (--suite console takes --rows, --runs, --out; --png is for --suite queries, concurrency)."),
]  # fmt: skip


@pytest.mark.parametrize("suite, option, line", REFUSALS, ids=[f"{s}{o[0]}" for s, o, _ in REFUSALS])
def test_an_option_the_suite_does_not_take_is_refused_in_one_line(cli, tmp_path, suite, option, line):
    home = tmp_path / "home"
    result = cli({"DUCKLAKE_HOME": str(home)}, "bench", "--suite", suite, *option)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "Error: " + line
    assert not home.exists()  # refused before anything started


@pytest.mark.parametrize("suite", ["queries", "dynamic"])
def test_a_suite_of_one_size_refuses_a_list(cli, tmp_path, suite):
    home = tmp_path / "home"
    result = cli({"DUCKLAKE_HOME": str(home)}, "bench", "--suite", suite, "--rows", "2000,4000")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"Error: --suite {suite} takes one size, not 2. Try: --rows 2000."
    assert not home.exists()


def test_the_refusals_above_are_every_option_a_suite_does_not_take():
    expected = {(name, suites.flag(o)) for name, s in suites.SUITES.items() for o in set(suites.OPTIONS) - set(s.takes)}
    assert {(suite, option[0]) for suite, option, _ in REFUSALS} == expected
    assert len(REFUSALS) == len(expected) == 7 * 10 - 24  # 7 suites, 10 options, 24 taken


def test_json_refusal_is_the_error_envelope(cli, tmp_path):
    result = cli({"DUCKLAKE_HOME": str(tmp_path / "home")}, "bench", "--suite", "load", "--ops", "5", "--json")
    assert result.exit_code == 2
    doc = json.loads(result.stdout)
    assert doc["status"] == "error" and doc["result"]["error"].startswith("Error: --ops means nothing to --suite load.")


@pytest.fixture
def echo(monkeypatch):
    """A suite that takes every option and reports what it was given; `defect` set: it reports that defect."""
    seen: dict = {}

    def run(kit, **options) -> Report:
        seen.update(options)
        doc = {"given": {k: str(v) for k, v in options.items()}}
        return Report(
            options,
            Table("echo: what the suite was given", ["option", "value"], [[k, v] for k, v in options.items()]),
            ["a note under the table"],
            doc,
            [Path(options["out"])] if "out" in options else [],
            seen.get("defect"),
            passed=["PASS: only without a defect"],
        )

    monkeypatch.setitem(suites.SUITES, "echo", suites.Suite("echo", "", dict.fromkeys(suites.OPTIONS, "x"), run))
    return seen


def test_the_options_given_reach_the_suite_as_given_and_the_report_is_rendered(cli, tmp_path, echo):
    argv = ["--rows", "1000,2000", "--runs", "3", "--months", "4", "--no-file-cache", "--workers", "5"]
    argv += ["--writers", "6", "--ops", "7", "--modes", "file,ducklake", "--out", "o.json", "--png", "p.png"]
    result = cli({"DUCKLAKE_HOME": str(tmp_path / "home")}, "bench", "--suite", "echo", *argv)
    assert result.exit_code == 0, result.output
    assert echo == {
        "rows": (1000, 2000),
        "runs": 3,
        "months": 4,
        "file_cache": False,
        "workers": 5,
        "writers": 6,
        "ops": 7,
        "modes": "file,ducklake",
        "out": Path("o.json"),
        "png": Path("p.png"),
    }
    out = result.stdout
    assert "echo: what the suite was given" in out and "writers" in out and "file,ducklake" in out
    lines = out.splitlines()
    assert (
        lines.index("a note under the table") < lines.index("wrote o.json") < lines.index("PASS: only without a defect")
    )


def test_json_is_the_envelope_alone_and_a_defect_exits_1(cli, tmp_path, echo):
    env = {"DUCKLAKE_HOME": str(tmp_path / "home")}
    result = cli(env, "bench", "--suite", "echo", "--ops", "1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout: the envelope alone
    assert (doc["status"], doc["result"]) == ("ok", {"given": {"ops": "1"}})
    assert "a note under the table" in result.stderr

    echo["defect"] = "a row was lost"
    result = cli(env, "bench", "--suite", "echo", "--ops", "1", "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "error"
    result = cli(env, "bench", "--suite", "echo", "--ops", "1")
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: a row was lost. Try: see the JSON results (--out FILE)."
    assert "PASS" not in result.stdout
