"""The console's Dynamic tables and Lineage pages in a real browser (fixtures: tests/console/conftest.py), each
compared with what the kit's own commands say: `dynamic show` and `dynamic history` for the Dynamic tables page.
Writes only the schema `console_pages`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.lake import Lake

SCHEMA = "console_pages"
DYNAMIC = f"{SCHEMA}.grp_counts"


def _kit(stack, *args: str) -> dict:
    """A CLI command as a user runs it, with --json: its result."""
    got = CliRunner().invoke(app, [*args, "--json"], env={**stack.env, "COLUMNS": "200"})
    assert got.exit_code == 0, got.output
    return json.loads(got.stdout)["result"]


@pytest.fixture(scope="module", autouse=True)
def sources(stack):
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(
            f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; "
            f"CREATE TABLE {SCHEMA}.src AS SELECT range AS id, range % 5 AS grp FROM range(2000)"
        )
    _kit(
        stack,
        "sql",
        f"CREATE DYNAMIC TABLE {DYNAMIC} TARGET_LAG = '1 hour' AS SELECT grp, count(*) AS n FROM {SCHEMA}.src GROUP BY grp",
    )
    yield
    _kit(stack, "sql", f"DROP DYNAMIC TABLE IF EXISTS {DYNAMIC}")


def _rows(page, testid: str) -> list[list[str]]:
    return [r.split("\t") for r in page.locator(f"[data-testid={testid}] tbody tr").all_inner_texts()]


def _history_row(r: dict) -> list[str]:
    """A refresh of `dynamic history --json` as the page's history table shows it (the time aside)."""
    dash = lambda v: "-" if v is None else str(v)  # noqa: E731
    return [
        str(r["id"]),
        r["trigger"],
        r["status"],
        dash(r["mode"]),
        dash(r["rows_inserted"]),
        dash(r["rows_deleted"]),
        dash(r["read_snapshot"]),
        dash(r["commit_snapshot"]),
    ]


def test_the_dynamic_tables_page_says_what_dynamic_show_says_and_refreshes_now(page, stack, web):
    shown = _kit(stack, "dynamic", "show", DYNAMIC)
    page.goto(web["url"] + "dynamic")
    page.wait_for_selector("[data-testid=dynamic-tables]")
    row = next(r for r in _rows(page, "dynamic-tables") if r[0] == DYNAMIC)
    last = shown["last_refresh"]
    assert row == [
        DYNAMIC,
        shown["status"],
        shown["lag"],
        shown["refresh_mode"],
        shown["plan"],
        shown["reason"] or shown["how"],
        f"#{last['id']} {last['status']} {last['mode']} at {last['started_at'][:19].replace('T', ' ')} (create)",
        str(shown["data_snapshot"]),
        ", ".join(f"{s} @ {snap}" for s, snap in shown["sources"].items()),
    ]
    assert (shown["lag"], last["mode"]) == ("1 hour", "FULL")
    # a change to the source, then "Refresh now": the package's own refresh, recorded in its history
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(f"INSERT INTO {SCHEMA}.src SELECT range + 5000, 7 FROM range(3)")
        now = lake.current_snapshot()
    page.locator("[data-testid=dynamic-select]").click()
    page.keyboard.type(DYNAMIC)
    page.get_by_role("option", name=DYNAMIC, exact=True).click()
    page.wait_for_selector("[data-testid=history-chart] svg text")
    page.locator("[data-testid=dynamic-refresh]").click()
    page.wait_for_selector("[data-testid=refresh-done], [data-testid=refresh-error]")
    assert page.locator("[data-testid=refresh-done]").inner_text() == f"{DYNAMIC}: SUCCEEDED INCREMENTAL (+1 -0)"
    page.wait_for_function("() => document.querySelectorAll('[data-testid=history] tbody tr').length === 2")
    history = _kit(stack, "dynamic", "history", DYNAMIC)["refreshes"]
    assert [(r["trigger"], r["mode"], r["read_snapshot"]) for r in history] == [
        ("manual", "INCREMENTAL", now),
        ("create", "FULL", last["read_snapshot"]),
    ]
    assert [r[:2] + r[3:9] for r in _rows(page, "history")] == [_history_row(r) for r in history]
    drawn = page.locator("[data-testid=history-chart]").evaluate(
        "el => getElement(el).chart.getOption().series.map(s => [s.name, s.data])"
    )
    oldest_first = list(reversed(history))
    assert drawn == [
        ["rows inserted", [r["rows_inserted"] for r in oldest_first]],
        ["rows deleted", [r["rows_deleted"] for r in oldest_first]],
        ["ms", [round(r["duration_ms"]) for r in oldest_first]],
    ]
    # the overview shows the new refresh too, as `dynamic show` now does
    again = _kit(stack, "dynamic", "show", DYNAMIC)
    row = next(r for r in _rows(page, "dynamic-tables") if r[0] == DYNAMIC)
    assert row[6].startswith(f"#{again['last_refresh']['id']} SUCCEEDED INCREMENTAL") and row[7] == str(now)
    with Lake(stack.platform.endpoints()) as lake:
        assert lake.run(f"SELECT n FROM {DYNAMIC} WHERE grp = 7")[-1].rows == [(3,)]
