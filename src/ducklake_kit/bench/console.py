"""`bench --suite console`: the lake console as a user meets it, measured in Debian's Chromium (Playwright).

- First page ready: the console stopped, started again (as `console` starts it), and from the moment its URL is
  known, the time until the Query page, opened with the token, lists the plane's workers (served, its websocket
  up, the plane answered). Goal < 1 s.
- A query with 1,000 rows drawn: a GROUP BY over ROWS rows (default 10,000,000; 5,000 groups) typed in the Query
  page with the slider at 1,000, from the click on Run until the 1,000 rows are in the page's table, against the same
  query run as `sql` runs it (attach the lake, run, read every row; the CLI's own start-up left out, which only
  flatters `sql`). Goal < 1.5x.
- 20 sessions at once: 20 pages, each asking its own question (a different slice of the table), all clicked at once;
  each session's time (click to answer, timed in the browser) against the same question asked alone; every answer
  must equal the lake's (else the run is a defect, exit 1). Goal: none over 5x its time alone.

The console is left running afterwards, with a new token (the bench restarted it): run `console` for its URL.
Writes the table `bench.console_trips` (made once per size, reused while it has the right row count)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ducklake_kit.bench.results import BENCH_SCHEMA, Machine, load_average, write_outputs
from ducklake_kit.errors import KitError
from ducklake_kit.platforms.kit import Kit

DEFAULT_ROWS = 10_000_000
SESSIONS = 20
WORKERS = 2  # the plane the bench starts: two workers of one thread, as `up` starts it
DRAWN = 1000
GOAL_FIRST_PAGE_S = 1.0
GOAL_VS_SQL = 1.5
GOAL_VS_ALONE = 5.0
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TABLE = f"{BENCH_SCHEMA}.console_trips"
GROUPS = 5000
QUERY = f"SELECT zone, count(*) AS trips, sum(fare) AS fares FROM {TABLE} GROUP BY zone ORDER BY zone"


def session_sql(i: int) -> str:
    return f"SELECT {i} AS session, count(*) AS trips, sum(fare) AS fares FROM {TABLE} WHERE zone % {SESSIONS} = {i}"


@dataclass
class ConsoleBench:
    rows: int
    runs: int
    first_page_s: list[float]  # until the plane's workers are listed
    drawn_s: list[float]  # until the page is drawn and its websocket up (the Run button answers)
    start_s: list[float]  # platforms.console.start itself (process up and answering), before the URL is known
    query_console_s: list[float]
    query_sql_s: list[float]
    query_attached_s: list[float]  # the query alone, on a lake connection attached beforehand
    drawn: int
    total_rows: int | None
    alone_s: list[float]
    sessions_s: list[float]
    answers_right: int
    wrong: list[str]
    machine: Machine
    notes: list[str] = field(default_factory=list)
    alone_worker_s: list[float] = field(default_factory=list)  # the worker's own time (the page's summary) alone
    sessions_worker_s: list[float] = field(default_factory=list)  # and in each of the sessions at once
    workers: int = WORKERS

    @property
    def plane_busy(self) -> float:
        """How busy the plane's workers were while the slowest session waited: the sessions' worker seconds over
        (workers x the slowest session's time). Near 1: the queue is the plane's (its workers never idled); well under
        1: the answers waited somewhere else (the console, the browser)."""
        return round(sum(self.sessions_worker_s) / (self.workers * max(self.sessions_s)), 2)

    @property
    def first_page_median_s(self) -> float:
        return round(statistics.median(self.first_page_s), 3)

    @property
    def vs_sql(self) -> float:
        return round(statistics.median(self.query_console_s) / statistics.median(self.query_sql_s), 2)

    @property
    def vs_attached(self) -> float:
        return round(statistics.median(self.query_console_s) / statistics.median(self.query_attached_s), 2)

    @property
    def worst_vs_alone(self) -> float:
        return round(max(self.sessions_s) / statistics.median(self.alone_s), 2)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["machine"] = self.machine.as_dict()
        out.update(
            first_page_median_s=self.first_page_median_s,
            vs_sql=self.vs_sql,
            worst_vs_alone=self.worst_vs_alone,
            plane_busy=self.plane_busy,
        )
        return out


def _settings(kit: Kit) -> dict[str, Any]:
    """What `console` gives the server (cli/console.py builds the same)."""
    from ducklake_kit.workers.config import PlaneConfig

    plane = PlaneConfig.of(kit.state, kit.scheduler)
    return {
        "platform": kit.platform_name,
        "pipelines_dir": str(Path.cwd() / "pipelines"),
        "endpoints": asdict(kit.platform.endpoints()),
        "plane": {
            "address": plane.address,
            "dashboard": plane.dashboard,
            "tls": asdict(plane.tls) if plane.tls else None,
        },
    }


def _table(kit: Kit, rows: int) -> None:
    from ducklake_kit.lake import Lake

    with Lake(kit.platform.endpoints()) as lake:
        lake.run(f"CREATE SCHEMA IF NOT EXISTS {BENCH_SCHEMA}")
        fare = lake.scalar(
            f"SELECT any_value(data_type) FROM duckdb_columns() WHERE database_name = '{lake.alias}' "
            f"AND schema_name = '{BENCH_SCHEMA}' AND table_name = 'console_trips' AND column_name = 'fare'"
        )
        if fare == "BIGINT" and lake.scalar(f"SELECT count(*) FROM {TABLE}") == rows:
            return  # made by this code before, at this size
        kit.say(f"making {TABLE} ({rows:,} rows)")
        lake.run(
            f"CREATE OR REPLACE TABLE {TABLE} AS SELECT range AS id, range % {GROUPS} AS zone, "
            f"(range * 7) % 1000 AS fare FROM range({rows})"  # cents: whole numbers, so every sum is exact
        )


def _query_page(page, url: str, sql: str) -> None:
    page.goto(url)
    page.wait_for_selector("[data-testid=workers]")
    page.locator("[data-testid=sql]").fill(sql)


def _draw_most(page) -> None:
    """The slider at 1,000 rows drawn (PageUp: ten more a press), checked."""
    slider = page.locator("[data-testid=rows]")
    track = slider.locator(".q-slider__track-container")
    track.focus()
    # presses can be lost while the server echoes the value back: press, read, until it holds at the end
    for n in range(4 * DRAWN // 10):
        if slider.get_attribute("aria-valuenow") == str(DRAWN):
            page.wait_for_timeout(300)
            if slider.get_attribute("aria-valuenow") == str(DRAWN):
                return
        track.press("PageUp")
        if n % 10 == 9:
            page.wait_for_timeout(100)
    raise KitError(f"the Query page's slider did not reach {DRAWN} rows drawn", "report it: the page changed")


def timed_run(rows: int) -> str:
    """JS: click Run and resolve with the milliseconds until the answer's `rows` rows are in the page's table (or
    an error is), timed in the page itself."""
    return f"""() => new Promise(resolve => {{
  const t0 = performance.now();
  const done = () => document.querySelector('[data-testid=error]')
    || document.querySelectorAll('[data-testid=result-table] tbody tr').length >= {rows};
  const seen = new MutationObserver(() => {{ if (done()) {{ seen.disconnect(); resolve(performance.now() - t0); }} }});
  seen.observe(document.body, {{childList: true, subtree: true}});
  document.querySelector('[data-testid=run]').click();
}})"""


def bench_console(kit: Kit, *, rows: int = DEFAULT_ROWS, runs: int = 3, json_path: Path | None = None) -> ConsoleBench:
    from playwright.sync_api import sync_playwright

    from ducklake_kit.lake import Lake
    from ducklake_kit.lake.expect import run_sql
    from ducklake_kit.platforms import console as console_mod
    from ducklake_kit.workers import plane as plane_mod

    if not CHROMIUM.exists():
        raise KitError(f"the console bench drives a browser: {CHROMIUM} is absent", "sudo apt-get install chromium")
    if rows < SESSIONS or runs < 1:
        raise KitError(f"--rows must be at least {SESSIONS} and --runs at least 1", "e.g. --rows 10000000 --runs 3")
    load_before = load_average()
    ep = kit.platform.endpoints()
    plane_mod.up(kit.state, ep, WORKERS, kit.scheduler)
    _table(kit, rows)
    with Lake(ep) as lake:
        expected = {i: lake.run(session_sql(i))[-1].rows for i in range(SESSIONS)}
        first_rows = lake.run(QUERY)[-1].rows[:DRAWN]
    firsts, drawn, starts, console_s, sql_s, attached_s, alone = [], [], [], [], [], [], []
    alone_worker: list[float] = []
    sessions_worker: list[float] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            for i in range(runs):
                kit.say(f"first page: run {i + 1} of {runs}")
                console_mod.stop(kit.state)
                t = time.perf_counter()
                status, token = console_mod.start(kit.state, _settings(kit))
                starts.append(round(time.perf_counter() - t, 3))
                context = browser.new_context()
                page = context.new_page()
                page.set_default_timeout(120_000)
                t = time.perf_counter()  # the URL is known (`console` would print it now)
                page.goto(console_mod.url_with_token(status, token))
                page.wait_for_selector("[data-testid=run]")
                page.wait_for_function("() => window.did_handshake === true")
                drawn.append(round(time.perf_counter() - t, 3))
                page.wait_for_selector("[data-testid=workers]")
                firsts.append(round(time.perf_counter() - t, 3))
                context.close()
            base = status.address or ""
            context = browser.new_context()
            page = context.new_page()
            page.set_default_timeout(300_000)
            page.goto(console_mod.url_with_token(status, token))
            total = None
            for i in range(runs + 1):  # the first, a warm-up, is not counted
                kit.say(f"a query with {DRAWN} rows drawn: run {i + 1} of {runs + 1}")
                _query_page(page, base, QUERY)
                _draw_most(page)
                took = page.evaluate(timed_run(DRAWN)) / 1000
                summary = page.locator("[data-testid=summary]").inner_text()
                total = int(summary.split(" rows")[0])
                t = time.perf_counter()
                sql_rows = run_sql(ep, kit.platform_name, QUERY).results[-1].rows
                took_sql = time.perf_counter() - t
                with Lake(ep) as lake:
                    t = time.perf_counter()
                    lake.run(QUERY)
                    took_attached = time.perf_counter() - t
                if i:
                    console_s.append(round(took, 3))
                    sql_s.append(round(took_sql, 3))
                    attached_s.append(round(took_attached, 3))
            shown = [r.split("\t") for r in page.locator("[data-testid=result-table] tbody tr").all_inner_texts()]
            wrong = []
            if total != len(sql_rows) or shown[:20] != [[_text(v) for v in r] for r in first_rows[:20]]:
                wrong.append(f"the 1,000-row query: the page showed {total} rows, {shown[:2]}...")
            for i in range(runs + 1):
                kit.say(f"one session alone: run {i + 1} of {runs + 1}")
                _query_page(page, base, session_sql(0))
                took = page.evaluate(timed_run(1)) / 1000
                if i:
                    alone.append(round(took, 3))
                    alone_worker.append(_worker_seconds(page))
            context.close()
            kit.say(f"{SESSIONS} sessions at once")
            contexts = [browser.new_context() for _ in range(SESSIONS)]
            pages = []
            for n, c in enumerate(contexts):
                p = c.new_page()
                p.set_default_timeout(300_000)
                p.goto(console_mod.url_with_token(status, token))
                _query_page(p, base, session_sql(n))
                pages.append(p)
            start = "() => { window.__took = null; (" + timed_run(1) + ")().then(ms => { window.__took = ms; }); }"
            for p in pages:
                p.evaluate(start)
            sessions, right = [], 0
            for n, p in enumerate(pages):
                p.wait_for_function("() => window.__took !== null")
                took = p.evaluate("() => window.__took")
                if took is None:  # undefined: the page was loaded again (its socket dropped and came back too late)
                    wrong.append(f"session {n}: its page reloaded before the answer came")
                    continue
                sessions.append(round(took / 1000, 3))
                sessions_worker.append(_worker_seconds(p))
                got = [r.split("\t") for r in p.locator("[data-testid=result-table] tbody tr").all_inner_texts()]
                if got == [[_text(v) for v in r] for r in expected[n]]:
                    right += 1
                else:
                    wrong.append(f"session {n}: {got} (the lake: {expected[n]})")
            for c in contexts:
                c.close()
        finally:
            browser.close()
    result = ConsoleBench(
        rows,
        runs,
        firsts,
        drawn,
        starts,
        console_s,
        sql_s,
        attached_s,
        DRAWN,
        total,
        alone,
        sessions,
        right,
        wrong,
        Machine.since(load_before),
        alone_worker_s=alone_worker,
        sessions_worker_s=sessions_worker,
    )
    write_outputs(result, json_path, None)
    return result


def _worker_seconds(page) -> float:
    """The worker's own time for the answer on the page: the summary's last figure (`... · worker w1 · 0.250 s`)."""
    return float(page.locator("[data-testid=summary]").inner_text().rsplit("·", 1)[1].split()[0])


def _text(value: Any) -> str:
    """A value as the page's table shows it (console.shapes.cell, then the browser's text)."""
    if value is None:
        return "NULL"
    return str(value)


def report(r: ConsoleBench):
    from ducklake_kit.bench.results import Report, Table

    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 3)

    cells = [
        [
            "first page ready after the URL",
            med(r.first_page_s),
            f"< {GOAL_FIRST_PAGE_S:g} s",
            met(r.first_page_median_s < GOAL_FIRST_PAGE_S),
        ],
        ["first page drawn, its websocket up", med(r.drawn_s), "", ""],
        [f"query, {r.drawn:,} rows drawn: console", med(r.query_console_s), "", ""],
        [
            "same query as `sql` runs it",
            med(r.query_sql_s),
            f"console < {GOAL_VS_SQL}x",
            f"{r.vs_sql}x {met(r.vs_sql < GOAL_VS_SQL)}",
        ],
        ["the query alone on an attached lake", med(r.query_attached_s), "", f"console {r.vs_attached}x"],
        ["one session alone", med(r.alone_s), "", ""],
        [
            f"{SESSIONS} sessions at once: slowest",
            max(r.sessions_s),
            f"< {GOAL_VS_ALONE:g}x alone",
            f"{r.worst_vs_alone}x {met(r.worst_vs_alone < GOAL_VS_ALONE)}",
        ],
    ]
    notes = [
        f"console start (process up and answering, before its URL is known): median {med(r.start_s)} s",
        f"{SESSIONS} sessions: median {med(r.sessions_s)} s, each asking its own slice; answers right: "
        f"{r.answers_right} of {SESSIONS} (compared with the lake's)",
        f"where the {SESSIONS} sessions waited: the plane's {r.workers} one-thread workers ran their queries for "
        f"{sum(r.sessions_worker_s):.2f} s in all while the slowest session took {max(r.sessions_s)} s: busy "
        f"{r.plane_busy:.0%} of it (near 100%: the queue is the plane's, {SESSIONS} queries {r.workers} at a time; a "
        f"query's worker time: {med(r.alone_worker_s)} s alone, {med(r.sessions_worker_s)} s among the others); the "
        f"console and the browser add {round(med(r.alone_s) - med(r.alone_worker_s), 3)} s to an answer alone",
        "`sql` here is the query as the command runs it, in process (attach, run, read every row): the CLI's start-up "
        "(about 2 s of Python imports) is left out",
        "medians of --runs runs after a warm-up; the console was restarted by the bench: run `console` for its URL",
    ]
    title = (
        f"bench --suite console: {r.rows:,} rows, {r.runs} runs, Chromium headless ({r.machine.cores} cores; load "
        f"average {r.machine.load_average_before[0]})"
    )
    return Report(
        r,
        Table(title, ["measure", "seconds (median)", "goal", "result"], cells),
        notes,
        r.as_dict(),
        defect="; ".join(r.wrong) if r.wrong else None,
        fix="an answer in the console differs from the lake's: this is a defect of the console, report it",
        passed=[f"every answer in the console equals the lake's ({r.answers_right} sessions and the 1,000-row query)"],
    )
