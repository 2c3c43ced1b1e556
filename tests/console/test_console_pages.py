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


PIPELINE = "console_pages_run"
PIPELINE_SQL = f"""-- id: base
CREATE OR REPLACE TABLE {SCHEMA}.p_base AS SELECT range AS id, range % 3 AS grp FROM range(1000);

-- id: slow
-- depends_on: base
-- description: seconds of work, so that the page is seen drawing it running while the others wait
CREATE OR REPLACE TABLE {SCHEMA}.p_slow AS
SELECT grp, count(*) AS n, (SELECT count(*) FROM range(150000000) WHERE range % 7 = 3) AS busy
FROM {SCHEMA}.p_base GROUP BY grp;

-- id: quick
-- depends_on: base
CREATE OR REPLACE TABLE {SCHEMA}.p_quick AS SELECT id * 2 AS twice, grp FROM {SCHEMA}.p_base;

-- id: summary
-- depends_on: slow, quick
CREATE OR REPLACE TABLE {SCHEMA}.p_summary AS
SELECT s.grp, s.n, count(q.twice) AS q FROM {SCHEMA}.p_slow s JOIN {SCHEMA}.p_quick q USING (grp) GROUP BY ALL;
"""


def test_the_lineage_page_draws_a_run_live_and_the_lineage_it_recorded(page, stack, web):
    import time

    from ducklake_kit.pipelines import history
    from ducklake_kit.pipelines.runner import commit_message

    page.goto(web["url"] + "lineage")
    page.wait_for_selector("[data-testid=pipeline-run]")
    assert "taxi_marts.sql" in page.locator("[data-testid=pipeline-file]").inner_text()  # the project's pipelines
    page.locator("[data-testid=pipeline-sql]").fill(PIPELINE_SQL)
    page.locator("[data-testid=pipeline-name]").fill(PIPELINE)
    page.locator("[data-testid=pipeline-run]").click()
    seen: dict[str, list[str]] = {}  # node -> the states the page showed it in, in order
    both: set[tuple[str, str]] = set()  # (slow's state, summary's state) seen at one moment
    deadline = time.monotonic() + 300
    while not page.locator("[data-testid=pipeline-done]").count():
        assert time.monotonic() < deadline, f"the run did not end: {seen}"
        cells = [r.split("\t") for r in page.locator("[data-testid=pipeline-nodes] tbody tr").all_inner_texts()]
        rows = {c[0]: c[1] for c in cells if len(c) >= 2}  # a row caught mid-redraw reads as one cell: next poll
        for node, state in rows.items():
            if not seen.get(node) or seen[node][-1] != state:
                seen.setdefault(node, []).append(state)
        if rows:
            both.add((rows.get("slow"), rows.get("summary")))
        page.wait_for_timeout(100)
    done = page.locator("[data-testid=pipeline-done]").inner_text()
    assert done.startswith("run ") and f" of {PIPELINE}: ok (4 ok)" in done, done
    run_id = done.split()[1]
    # live: the slow node was drawn running while the node after it still waited, and every node ended ok
    assert ("running", "pending") in both, both
    final = dict(r.split("\t")[:2] for r in page.locator("[data-testid=pipeline-nodes] tbody tr").all_inner_texts())
    assert final == dict.fromkeys(["base", "slow", "quick", "summary"], "ok")
    for node, state in final.items():  # the last node's ok can come with the run's end, after the last poll
        if seen.get(node, [None])[-1] != state:
            seen.setdefault(node, []).append(state)
    for node, states in seen.items():  # never backwards: pending, then running, then ok
        order = ["pending", "running", "ok"]
        assert states == sorted(states, key=order.index) and states[-1] == "ok", (node, states)
    drawn = page.locator("[data-testid=pipeline-graph]").evaluate(
        "el => { const s = getElement(el).chart.getOption().series[0];"
        " return {nodes: s.data.map(d => [d.name, d.value]), links: s.links.map(l => [l.source, l.target])}; }"
    )
    assert sorted(drawn["nodes"]) == [[n, "ok"] for n in ["base", "quick", "slow", "summary"]]
    assert sorted(drawn["links"]) == [["base", "quick"], ["base", "slow"], ["quick", "summary"], ["slow", "summary"]]
    # what the lake recorded: this run, every node ok, each node's snapshot the one its commit made
    with Lake(stack.platform.endpoints()) as lake:
        assert history.last_run(lake, PIPELINE) == (run_id, dict.fromkeys(final, "ok"))
        made = dict(
            lake.con.execute(
                "SELECT commit_message, snapshot_id FROM ducklake_snapshots('lake') WHERE commit_message LIKE ?",
                [f"pipeline {PIPELINE}: %"],
            ).fetchall()
        )
    snapshots = {
        r.split("\t")[0]: r.split("\t")[4]
        for r in page.locator("[data-testid=pipeline-nodes] tbody tr").all_inner_texts()
    }
    assert snapshots == {n: str(made[commit_message(PIPELINE, n, run_id)]) for n in final}
    # the lineage it recorded, as `pipeline lineage --columns` says it
    page.locator("[data-testid=lineage-table]").fill(f"{SCHEMA}.p_summary")
    page.locator("[data-testid=lineage-run]").click()
    page.wait_for_selector("[data-testid=lineage-summary], [data-testid=lineage-error]")
    told = _kit(stack, "pipeline", "lineage", f"{SCHEMA}.p_summary", "--columns")
    edges = [r.split("\t") for r in page.locator("[data-testid=lineage-edges] tbody tr").all_inner_texts()]
    assert edges == [[e["child"], e["parent"], e["pipeline"], e["node"]] for e in told["edges"]]
    columns = [r.split("\t") for r in page.locator("[data-testid=lineage-columns] tbody tr").all_inner_texts()]
    assert columns == [
        [f"{c['child']}.{c['child_column']}", f"{c['parent']}.{c['parent_column']}"] for c in told["columns"]
    ]
    assert [f"{SCHEMA}.p_summary.q", f"{SCHEMA}.p_quick.twice"] in columns
