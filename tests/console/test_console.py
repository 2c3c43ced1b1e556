"""The lake console as a user meets it: started by `console` as a background process of the shared stack, refused
without its token (HTTP and websocket), and driven in a real browser (Debian's chromium through Playwright): a query
typed in the page runs on a worker and its answer equals the same query run through the lake; an error shows DuckDB's
own text; the Lake page lists a table with its true row count and the catalog's snapshots. One console and one
browser for the module; every request the browser makes must stay on the console's own address, and a page that
logs an error in the browser's console fails the test that opened it. Writes only the schema `console_tests`."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.lake import Lake, StatementFailed
from ducklake_kit.platforms import console as console_mod
from ducklake_kit.platforms import postgres, procs

SCHEMA = "console_tests"
ROWS = 250


@pytest.fixture(scope="module", autouse=True)
def trips(stack):
    """The module's schema, with a table of ROWS rows (made before the console starts)."""
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(
            f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; "
            f"CREATE TABLE {SCHEMA}.trips AS SELECT range AS id, 'zone ' || (range % 4) AS zone, "
            f"(range * 3) % 17 AS fare FROM range({ROWS})"
        )


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request, redirects not followed: (status, headers, body)."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_console_prints_its_url_with_a_token_kept_private(web, stack):
    url, token = web["url_with_token"], console_mod.read_token(stack.state)
    assert web["url"] == f"http://127.0.0.1:{web['port']}/"
    assert url == f"{web['url']}?token={token}" and len(token) >= 40
    assert os.stat(console_mod.token_file(stack.state)).st_mode & 0o777 == 0o600
    assert os.stat(console_mod.settings_file(stack.state)).st_mode & 0o777 == 0o600
    # never in the server's arguments, environment or log
    proc = console_mod.status(stack.state)
    assert proc.running, proc.detail
    import psutil

    server = psutil.Process(proc.pid)
    assert token not in " ".join(server.cmdline())
    assert all(token not in v for v in server.environ().values())
    assert token not in stack.state.log_file("console").read_text()


def test_http_without_the_token_is_refused(web, stack):
    base, token = web["url"], console_mod.read_token(stack.state)
    static = f"{base}_nicegui/3.18.0/static/vue.esm-browser.prod.js"
    for url, headers in [
        (base, {}),
        (f"{base}lake", {}),
        (f"{base}api/snapshots", {}),
        (static, {}),
        (f"{base}?token=not-{token}", {}),
        (base, {"Authorization": "token wrong"}),
        (base, {"Cookie": f"ducklake-console-{web['port']}=wrong"}),
    ]:
        assert _get(url, headers)[0] == 401, (url, headers)
    # the same requests with the token pass: the refusals above are the gate's, not a wrong address
    assert _get(static, {"Authorization": f"token {token}"})[0] == 200
    status, headers, _ = _get(f"{base}lake?token={token}")
    assert status == 303 and headers["location"] == "/lake"  # the token leaves the address bar
    cookie = headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and token not in cookie
    assert _get(f"{base}lake", {"Cookie": cookie.split(";")[0]})[0] == 200
    # another Host (a DNS-rebinding page) is refused even with the token
    assert _get(f"{base}?token={token}", {"Host": f"evil.example:{web['port']}"})[0] == 403


def test_the_websocket_without_the_token_is_refused(web, stack):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws = f"ws://127.0.0.1:{web['port']}/_nicegui_ws/socket.io/?EIO=4&transport=websocket"
    origin = f"http://127.0.0.1:{web['port']}"
    token = console_mod.read_token(stack.state)
    cookie = _get(f"{web['url']}?token={token}")[1]["set-cookie"].split(";")[0]
    for headers in ({}, {"Cookie": f"ducklake-console-{web['port']}=wrong"}):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws, origin=origin, additional_headers=headers, open_timeout=10)
        assert refused.value.response.status_code == 403
    # another site's page, with the browser's cookie: refused by its Origin
    with pytest.raises(InvalidStatus):
        connect(ws, origin="http://evil.example", additional_headers={"Cookie": cookie}, open_timeout=10)
    # with the cookie, from the console's own page: socket.io opens (so the refusals above are the gate's)
    with connect(ws, origin=origin, additional_headers={"Cookie": cookie}, open_timeout=10) as sock:
        assert sock.recv(timeout=10).startswith("0{")  # engine.io's open packet


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.urls += [v for k, v in attrs if k in ("src", "href", "action") and v]


def test_the_served_page_names_no_other_host(web, stack):
    token = console_mod.read_token(stack.state)
    for path in ("", "lake", "load", "dynamic", "lineage", "workers"):
        status, _, body = _get(f"{web['url']}{path}", {"Authorization": f"token {token}"})
        assert status == 200
        links = _Links()
        links.feed(body.decode())
        assert len(links.urls) >= 5, links.urls  # the parser found the page's scripts and styles
        foreign = [u for u in links.urls if urlsplit(u).netloc not in ("", f"127.0.0.1:{web['port']}")]
        assert foreign == []


# -- in the browser ---------------------------------------------------------------------------------------------


def _run(page, web, sql: str, shape: str = "Table", worker: str | None = None) -> None:
    page.goto(web["url"])
    page.wait_for_selector("[data-testid=run]")
    page.wait_for_selector("[data-testid=workers]")  # the plane's workers are listed
    page.locator("[data-testid=sql]").fill(sql)
    if worker:
        page.locator("[data-testid=worker]").click()
        page.get_by_role("option", name=worker, exact=True).click()
    page.locator("[data-testid=shape]").get_by_text(shape, exact=True).click()


def _answer(page, testid: str) -> None:
    page.locator("[data-testid=run]").click()
    page.wait_for_selector(f"[data-testid={testid}], [data-testid=error]")


def test_a_query_typed_in_the_page_runs_on_the_chosen_worker(page, stack, web):
    from playwright.sync_api import expect

    sql = f"SELECT id, zone, fare FROM {SCHEMA}.trips WHERE fare > 3 ORDER BY fare DESC, id"
    _run(page, web, sql, worker="w2")
    track = page.locator("[data-testid=rows] .q-slider__track-container")  # the slider's focusable part
    track.focus()
    for value in range(90, 10, -10):  # ten rows fewer each press: 100 -> 20, each seen before the next
        track.press("PageDown")
        expect(page.locator("[data-testid=rows]")).to_have_attribute("aria-valuenow", str(value))
    _answer(page, "result-table")
    with Lake(stack.platform.endpoints()) as lake:
        expected = lake.run(sql)[-1].rows
        snapshot = lake.current_snapshot()
    shown = [r.split("\t") for r in page.locator("[data-testid=result-table] tbody tr").all_inner_texts()]
    assert shown == [[str(v) for v in r] for r in expected[:20]]
    summary = page.locator("[data-testid=summary]").inner_text()
    assert summary.startswith(f"{len(expected)} rows, 20 drawn · snapshot {snapshot} · worker w2 · ")


def test_a_chart_is_drawn_from_the_answer(page, stack, web):
    sql = f"SELECT zone, sum(fare) AS fares FROM {SCHEMA}.trips GROUP BY zone ORDER BY zone"
    _run(page, web, sql, shape="Chart")
    _answer(page, "result-chart")
    assert page.locator("[data-testid=chart-kind]").inner_text() == "bar chart"
    page.wait_for_selector("[data-testid=result-chart] svg text")
    labels = page.locator("[data-testid=result-chart] svg text").evaluate_all("els => els.map(e => e.textContent)")
    with Lake(stack.platform.endpoints()) as lake:
        zones = [r[0] for r in lake.run(sql)[-1].rows]
    assert zones == ["zone 0", "zone 1", "zone 2", "zone 3"]
    assert [t for t in labels if t.startswith("zone ")] == zones  # the x axis, in the answer's order
    assert "fares" in labels  # the legend names the series


def test_an_error_shows_duckdbs_own_text(page, stack, web):
    sql = f"SELECT no_such_column FROM {SCHEMA}.trips"
    with Lake(stack.platform.endpoints()) as lake, pytest.raises(StatementFailed) as independent:
        lake.run(sql)
    _run(page, web, sql)
    _answer(page, "result-table")
    assert page.locator("[data-testid=error]").inner_text() == independent.value.error
    assert "no_such_column" in independent.value.error


def test_dynamic_table_ddl_runs_in_the_page_as_in_sql(page, stack, web):
    name = f"{SCHEMA}.zone_fares"
    _run(
        page,
        web,
        f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' AS "
        f"SELECT zone, sum(fare) AS fares FROM {SCHEMA}.trips GROUP BY zone",
    )
    _answer(page, "result-table")
    with Lake(stack.platform.endpoints()) as lake:
        expected = lake.run(f"SELECT zone, sum(fare) FROM {SCHEMA}.trips GROUP BY zone ORDER BY zone")[-1].rows
    made = page.locator("[data-testid=result-table] tbody tr").all_inner_texts()
    assert [r.split("\t")[:2] for r in made] == [[name, str(len(expected))]]
    assert (
        "the console (dynamic-table DDL runs where `sql` runs it)" in page.locator("[data-testid=summary]").inner_text()
    )
    # the table it made answers on a worker like its query run through the lake
    _run(page, web, f"SELECT zone, fares FROM {name} ORDER BY zone")
    _answer(page, "result-table")
    shown = [r.split("\t") for r in page.locator("[data-testid=result-table] tbody tr").all_inner_texts()]
    assert shown == [[str(v) for v in r] for r in expected]
    _run(page, web, f"DROP DYNAMIC TABLE {name}", shape="Message")
    _answer(page, "message")
    with Lake(stack.platform.endpoints()) as lake:
        assert (
            lake.scalar(
                f"SELECT count(*) FROM duckdb_tables() WHERE schema_name = '{SCHEMA}' AND table_name = 'zone_fares'"
            )
            == 0
        )


def test_cancel_stops_a_running_query(page, web):
    _run(page, web, "SELECT sum(range % 7) AS s FROM range(50000000000)", worker="w1")  # minutes of work
    page.locator("[data-testid=run]").click()
    page.wait_for_selector("[data-testid=running]")
    page.wait_for_timeout(1000)  # the task has reached its worker
    page.locator("[data-testid=cancel]").click()
    page.wait_for_selector("[data-testid=error]", timeout=30_000)
    assert page.locator("[data-testid=error]").inner_text().startswith("cancelled (INTERRUPT Error")
    # the worker is free again
    page.locator("[data-testid=sql]").fill("SELECT 6 * 7 AS answer")
    page.locator("[data-testid=run]").click()
    page.wait_for_selector("[data-testid=summary]")  # the error above is gone: this run's answer
    assert page.locator("[data-testid=result-table] tbody tr").all_inner_texts() == ["42"]


def test_the_lake_page_lists_true_counts_and_the_catalogs_snapshots(page, stack, web):
    from ducklake_kit.lake import explore

    with Lake(stack.platform.endpoints()) as lake:
        # a lake of many tables, as a learner's becomes: DuckLake keeps a ducklake_inlined_data_* table per table, so
        # the catalog's list is longer than the select's menu draws (found by the whole suite's shared lake)
        for i in range(35):
            lake.run(f"CREATE OR REPLACE TABLE {SCHEMA}.many_{i} AS SELECT {i} AS x")
        assert len(explore.catalog_tables(lake)) > 40
        lake.run(f"INSERT INTO {SCHEMA}.trips SELECT range + 1000, 'zone 9', 1 FROM range(7)")
        rows = lake.scalar(f"SELECT count(*) FROM {SCHEMA}.trips")
    with postgres.connect(stack.platform.endpoints().pg) as conn:
        snapshots = conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone()[0]
    assert rows == ROWS + 7
    page.goto(web["url"] + "lake")
    page.wait_for_selector("[data-testid=tables]")
    tables = [r.split("\t") for r in page.locator("[data-testid=tables] tbody tr").all_inner_texts()]
    assert [SCHEMA, "trips", str(rows), "id BIGINT, zone VARCHAR, fare BIGINT"] in tables
    assert page.locator("[data-testid=snapshot-count]").inner_text() == f"Snapshots: {snapshots}"
    assert page.locator("[data-testid=snapshots] tbody tr").count() == snapshots
    page.locator("[data-testid=catalog-select]").click()
    # typed, as a user finds it among the catalog's tables: on a lake of many tables (this session's, in the whole
    # suite) the menu draws only its first options (ducklake_inlined_data_...), and ducklake_snapshot is not among them
    page.keyboard.type("ducklake_snapshot")
    page.get_by_role("option", name="ducklake_snapshot", exact=True).click()
    page.wait_for_selector("[data-testid=catalog-summary]")
    shown = min(snapshots, 200)
    assert page.locator("[data-testid=catalog-summary]").inner_text() == (
        f"ducklake_snapshot: {snapshots} rows, {shown} shown"
    )


def test_a_diff_on_the_lake_page_is_the_change_feed(page, stack, web):
    with Lake(stack.platform.endpoints()) as lake:
        before = lake.current_snapshot()
        lake.run(f"DELETE FROM {SCHEMA}.trips WHERE id < 4; INSERT INTO {SCHEMA}.trips VALUES (5000, 'zone 7', 2)")
        after = lake.current_snapshot()
        feed = lake.con.execute(
            f"SELECT * FROM ducklake_table_changes('lake', '{SCHEMA}', 'trips', {before + 1}, {after}) "
            "ORDER BY snapshot_id, rowid"
        ).fetchall()
    assert sorted(r[2] for r in feed) == ["delete"] * 4 + ["insert"]
    page.goto(web["url"] + "lake")
    page.wait_for_selector("[data-testid=diff-run]")
    page.locator("[data-testid=diff-table]").click()
    page.keyboard.press("Control+A")  # typed, as a user finds it among many tables (see the lake page's test)
    page.keyboard.type(f"{SCHEMA}.trips")
    page.get_by_role("option", name=f"{SCHEMA}.trips", exact=True).click()
    page.locator("[data-testid=diff-before]").fill(str(before))
    page.locator("[data-testid=diff-after]").fill(str(after))
    page.locator("[data-testid=diff-run]").click()
    page.wait_for_selector("[data-testid=diff-summary], [data-testid=diff-error]")
    assert page.locator("[data-testid=diff-summary]").inner_text() == (
        f"{SCHEMA}.trips, snapshots {before + 1}..{after}: delete 4, insert 1"
    )
    shown = [r.split("\t") for r in page.locator("[data-testid=diff-rows] tbody tr").all_inner_texts()]
    assert shown == [[str(v) for v in r] for r in feed]
    # what the page showed is what /api/diff serves (lab 18 reads it with curl), and its timeline is the page's
    auth = {"Authorization": f"token {console_mod.read_token(stack.state)}"}
    query = f"api/diff?table={SCHEMA}.trips&before={before}&after={after}"
    status, _, body = _get(web["url"] + query, auth)
    served = json.loads(body)
    assert status == 200 and served["summary"] == page.locator("[data-testid=diff-summary]").inner_text()
    assert served["rows"] == [list(r) for r in feed]
    timeline = json.loads(_get(web["url"] + "api/snapshots", auth)[2])["snapshots"]
    with postgres.connect(stack.platform.endpoints().pg) as conn:
        ids = [r[0] for r in conn.execute("SELECT snapshot_id FROM ducklake_snapshot ORDER BY 1 DESC").fetchall()]
    assert [s["snapshot_id"] for s in timeline] == ids and after in ids
    status, _, body = _get(web["url"] + f"api/diff?table={SCHEMA}.trips&before={after}&after={before}", auth)
    assert status == 400 and json.loads(body)["error"].startswith("Error: a diff runs from an earlier snapshot")


def _catalog(stack, query: str, params: list | None = None) -> list[tuple]:
    with postgres.connect(stack.platform.endpoints().pg) as conn:
        return conn.execute(query, params or []).fetchall()


def test_a_query_at_a_snapshot_chosen_on_the_timeline(page, stack, web):
    from playwright.sync_api import expect

    sql = f"SELECT count(*) AS n, sum(fare) AS fares FROM {SCHEMA}.trips"
    with Lake(stack.platform.endpoints()) as lake:
        then = lake.current_snapshot()
        lake.run(f"INSERT INTO {SCHEMA}.trips SELECT range + 9000, 'zone 5', 100 FROM range(30)")
        # independent of the page's rewrite: the same question asked of the lake, AT written by hand
        expected = lake.run(f"SELECT count(*), sum(fare) FROM {SCHEMA}.trips AT (VERSION => {then})")[-1].rows
        now = lake.run(sql)[-1].rows
    assert expected != now  # the insert changed the answer: a query that ignored the snapshot would show it
    page.goto(web["url"] + "lake")
    page.wait_for_selector("[data-testid=at-run]")
    row = page.locator("[data-testid=snapshots] tbody tr").filter(
        has=page.locator("td:first-child").get_by_text(str(then), exact=True)
    )
    row.click()
    expect(page.locator("[data-testid=at-snapshot]")).to_have_value(str(then))
    page.locator("[data-testid=at-sql]").fill(sql)
    page.locator("[data-testid=at-run]").click()
    page.wait_for_selector("[data-testid=at-summary], [data-testid=at-error]")
    assert page.locator("[data-testid=at-query] pre").inner_text().strip() == (
        f"SELECT COUNT(*) AS n, SUM(fare) AS fares FROM {SCHEMA}.trips AT (VERSION => {then})"
    )
    shown = [r.split("\t") for r in page.locator("[data-testid=at-rows] tbody tr").all_inner_texts()]
    assert shown == [[str(v) for v in r] for r in expected]
    assert page.locator("[data-testid=at-summary]").inner_text().startswith(f"at snapshot {then}: 1 rows, 1 drawn")
    # a statement that writes is refused before it reaches a worker
    page.locator("[data-testid=at-sql]").fill(f"DELETE FROM {SCHEMA}.trips")
    page.locator("[data-testid=at-run]").click()
    expect(page.locator("[data-testid=at-error]")).to_contain_text("a query at a snapshot is one SELECT")


STRATA_SQL = """
WITH f AS (
  SELECT f.record_count, f.begin_snapshot, f.end_snapshot FROM ducklake_data_file f
  JOIN ducklake_table t ON t.table_id = f.table_id AND t.end_snapshot IS NULL
  JOIN ducklake_schema s ON s.schema_id = t.schema_id AND s.end_snapshot IS NULL
  WHERE s.schema_name = %s AND t.table_name = %s),
xs AS (SELECT begin_snapshot AS x FROM f UNION SELECT end_snapshot FROM f WHERE end_snapshot IS NOT NULL
       UNION SELECT max(snapshot_id) FROM ducklake_snapshot),
layers AS (SELECT DISTINCT begin_snapshot AS b FROM f)
SELECT b, array_agg(alive ORDER BY x) FROM (
  SELECT layers.b, xs.x, (SELECT coalesce(sum(record_count), 0) FROM f WHERE f.begin_snapshot = layers.b
                          AND f.begin_snapshot <= xs.x AND (f.end_snapshot IS NULL OR xs.x < f.end_snapshot)) AS alive
  FROM layers CROSS JOIN xs) g
GROUP BY b ORDER BY b
"""


def test_a_tables_data_files_are_drawn_as_strata_from_the_catalog(page, stack, web):
    with Lake(stack.platform.endpoints()) as lake:  # three files, then one's rows all deleted: its layer ends
        lake.run(
            f"CREATE OR REPLACE TABLE {SCHEMA}.layers AS SELECT range AS id FROM range(100); "
            f"INSERT INTO {SCHEMA}.layers SELECT range + 100 FROM range(50); "
            f"INSERT INTO {SCHEMA}.layers SELECT range + 200 FROM range(60); "
            f"DELETE FROM {SCHEMA}.layers WHERE id >= 100 AND id < 150"
        )
    expected = [(b, [int(v) for v in alive]) for b, alive in _catalog(stack, STRATA_SQL, [SCHEMA, "layers"])]
    files = _catalog(
        stack,
        "SELECT f.data_file_id, f.record_count, f.begin_snapshot, f.end_snapshot FROM ducklake_data_file f "
        "JOIN ducklake_table t USING (table_id) WHERE t.table_name = 'layers' AND t.end_snapshot IS NULL "
        "ORDER BY f.begin_snapshot, f.data_file_id",
    )
    assert [r[1] for r in files] == [100, 50, 60] and [r[3] is None for r in files] == [True, False, True]
    page.goto(web["url"] + "lake")
    page.wait_for_selector("[data-testid=strata-table]")
    page.locator("[data-testid=strata-table]").click()
    page.keyboard.type(f"{SCHEMA}.layers")
    page.get_by_role("option", name=f"{SCHEMA}.layers", exact=True).click()
    page.wait_for_selector("[data-testid=strata-chart] svg text")
    drawn = page.locator("[data-testid=strata-chart]").evaluate(
        "el => { const o = getElement(el).chart.getOption();"
        " return {x: o.xAxis[0].data, series: o.series.map(s => [s.name, s.data, s.stack])}; }"
    )
    xs = sorted(
        {r[2] for r in files}
        | {r[3] for r in files if r[3] is not None}
        | {_catalog(stack, "SELECT max(snapshot_id) FROM ducklake_snapshot")[0][0]}
    )
    assert drawn["x"] == [str(x) for x in xs]
    assert drawn["series"] == [[f"added at {b}", alive, "files"] for b, alive in expected]
    listed = [r.split("\t") for r in page.locator("[data-testid=strata-files] tbody tr").all_inner_texts()]
    assert [(int(r[0]), int(r[2]), int(r[4]), None if r[5] == "NULL" else int(r[5])) for r in listed] == files
    assert (
        page.locator("[data-testid=strata-summary]")
        .inner_text()
        .startswith(f"{SCHEMA}.layers: 3 data files in the catalog, 2 in the table now (160 rows;")
    )


def test_the_workers_page_lists_the_plane(page, stack, web):
    _run(page, web, "CREATE OR REPLACE TABLE local.console_scratch AS SELECT 1 AS x", worker="w2")
    _answer(page, "summary")
    assert page.locator("[data-testid=error]").count() == 0
    page.goto(web["url"] + "workers")
    page.wait_for_selector("[data-testid=workers-table]")
    rows = {
        r.split("\t")[0]: r.split("\t") for r in page.locator("[data-testid=workers-table] tbody tr").all_inner_texts()
    }
    assert sorted(rows) == ["w1", "w2"]
    for name, row in rows.items():  # each worker's pid is the one in the kit's pid file, its lake attached
        assert row[2] == str(procs.read_pid(stack.state.pid_file(f"worker-{name}")).pid)
        assert row[4] == "attached"
    assert "console_scratch" in rows["w2"][8] and "console_scratch" not in rows["w1"][8]
    link = page.locator("[data-testid=dashboard]")
    assert link.get_attribute("href") == f"http://127.0.0.1:{stack.dashboard_port}/status"


# -- the other commands know it (last: the final test stops it) --------------------------------------------------


def test_console_again_reuses_it_and_status_and_connect_show_it_without_the_token(web, stack):
    runner, env = CliRunner(), {**stack.env, "COLUMNS": "200"}
    token = console_mod.read_token(stack.state)
    again = runner.invoke(app, ["console", "--json"], env=env)
    assert again.exit_code == 0, again.output
    got = json.loads(again.stdout)["result"]
    assert (got["detail"], got["pid"], got["url_with_token"]) == (
        "already running, reused",
        web["pid"],
        web["url_with_token"],
    )
    status = runner.invoke(app, ["status", "--json"], env=env)
    shown = json.loads(status.stdout)["result"]["console"]
    assert (shown["running"], shown["url"], shown["pid"]) == (True, web["url"], web["pid"])
    assert shown["token_file"] == str(console_mod.token_file(stack.state))
    text = runner.invoke(app, ["status"], env=env).stdout
    assert f"console: {web['url']} (pid {web['pid']}" in text and str(console_mod.token_file(stack.state)) in text
    connect = runner.invoke(app, ["connect", "--json"], env=env)
    assert json.loads(connect.stdout)["result"]["console"]["url"] == web["url"]
    for out in (status.stdout, text, connect.stdout, runner.invoke(app, ["connect"], env=env).stdout):
        assert token not in out


def test_a_console_started_by_other_code_is_started_anew(web, stack):
    # after a pull or an upgrade the running console would serve the old pages and send the workers old-style
    # arguments: `console` replaces it (what it was started with is in its settings file)
    import psutil

    settings = console_mod.settings_file(stack.state)
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "code": "0123456789abcdef"}))
    runner, env = CliRunner(), {**stack.env, "COLUMNS": "200"}
    again = runner.invoke(app, ["console", "--json"], env=env)
    assert again.exit_code == 0, again.output
    got = json.loads(again.stdout)["result"]
    assert got["detail"] == "restarted: the kit's code changed since it started" and got["pid"] != web["pid"]
    assert not psutil.pid_exists(web["pid"]) or psutil.Process(web["pid"]).status() == psutil.STATUS_ZOMBIE
    assert json.loads(settings.read_text())["code"] == procs.code_fingerprint()
    token = console_mod.read_token(stack.state)
    assert _get(got["url"], {"Authorization": f"token {token}"})[0] == 200 and _get(got["url"])[0] == 401
    web.update(pid=got["pid"], url=got["url"], url_with_token=got["url_with_token"])


def test_stopping_it_ends_the_process_and_its_token(web, stack):
    import psutil

    assert console_mod.stop(stack.state) == f"console: stopped (pid {web['pid']})"
    assert not psutil.pid_exists(web["pid"]) or psutil.Process(web["pid"]).status() == psutil.STATUS_ZOMBIE
    assert console_mod.read_token(stack.state) is None
    assert not console_mod.status(stack.state).running
    with pytest.raises(urllib.error.URLError):
        _get(web["url"])
