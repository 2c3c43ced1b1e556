"""The console's pages. Query: SQL run as a task on the worker plane, the answer as a Message, a Table or a Chart,
a slider for the rows drawn (only those cross to the page), the run's snapshot, worker and time. Lake: the tables
with their row counts and columns, the snapshot timeline, any query at a snapshot, a table's data files as strata, a
diff between two snapshots, the raw catalog tables. Elements the browser tests read
carry a `data-testid`."""

from __future__ import annotations

import uuid

from nicegui import run, ui

from ducklake_kit.console import shapes, strata
from ducklake_kit.console.at_snapshot import at_snapshot
from ducklake_kit.console.backend import Backend
from ducklake_kit.console.widgets import connected, on_pick
from ducklake_kit.console.widgets import error as _error
from ducklake_kit.console.widgets import frame as _frame
from ducklake_kit.console.widgets import table as _table
from ducklake_kit.console.widgets import tid as _tid
from ducklake_kit.errors import KitError
from ducklake_kit.workers.query import DEFAULT_ROWS, QueryAnswer

SHAPES = ["Message", "Table", "Chart"]
MOST_DRAWN = 1000
EXAMPLE = "SELECT schema_name, count(*) AS tables\nFROM duckdb_tables()\nGROUP BY ALL\nORDER BY 1"


def _summary(answer: QueryAnswer) -> str:
    if answer.total_rows is None:
        rows = answer.message or answer.statement_type
    else:
        rows = f"{answer.total_rows} rows, {len(answer.rows)} drawn"
    return f"{rows} · snapshot {answer.snapshot_id} · worker {answer.worker} · {answer.seconds:.3f} s"


def _draw(answer: QueryAnswer, shape: str) -> None:
    if not answer.ok:
        _error(answer.error or "")
        return
    _tid(ui.label(_summary(answer)).classes("text-caption"), "summary")
    if answer.total_rows is None or shape == "Message":
        lines = (
            [answer.message]
            if answer.total_rows is None
            else [", ".join(f"{c}={shapes.cell(v)}" for c, v in zip(answer.columns, r)) for r in answer.rows]
        )
        _tid(ui.code("\n".join(lines) or "(no rows)", language="text"), "message").classes("w-full")
    elif shape == "Table":
        _table(answer.columns, answer.rows, "result-table")
    else:
        spec = shapes.chart_spec(answer.types)
        if spec is None:
            _error("no chart for these columns: a chart needs a number column beside another column", "chart-none")
            return
        _tid(
            ui.echart(shapes.chart_options(spec, answer.columns, answer.rows), renderer="svg"), "result-chart"
        ).classes("w-full h-96")
        _tid(ui.label(f"{spec.kind} chart"), "chart-kind").classes("text-caption")


def query_page(backend: Backend) -> None:
    @ui.page("/", title="Query · ducklake-kit console")
    async def page() -> None:
        _frame("SQL as a task on the worker plane")
        with ui.column().classes("w-full p-4 gap-2"):
            sql = _tid(ui.textarea("SQL", value=EXAMPLE), "sql").classes("w-full font-mono").props("outlined autogrow")
            with ui.row().classes("items-center gap-6 w-full"):
                worker = _tid(ui.select({"": "any worker"}, value="", label="worker"), "worker").classes("w-40")
                shape = _tid(ui.toggle(SHAPES, value="Table"), "shape")
                with ui.column().classes("gap-0 w-64"):
                    drawn = _tid(ui.slider(min=1, max=MOST_DRAWN, value=DEFAULT_ROWS), "rows")
                    ui.label().bind_text_from(drawn, "value", lambda v: f"rows drawn: {v}")
                button = _tid(ui.button("Run"), "run")
                stop = _tid(ui.button("Cancel", color="negative"), "cancel").props("outline")
                stop.disable()
            plane = ui.row()
            out = ui.column().classes("w-full")
        # the page is served at once; the workers' names come over its websocket (a first connection to the plane
        # takes seconds)
        if not await connected():
            return
        try:
            names = await run.io_bound(backend.workers)
        except KitError as exc:
            with plane:
                _error(exc.line(), "plane-error")
        else:
            worker.set_options({"": "any worker", **{n: n for n in names}}, value=worker.value)
            with plane:
                _tid(ui.label(f"workers: {', '.join(names) or 'none'}"), "workers").classes("text-caption")

        running: dict[str, str] = {}

        async def go() -> None:
            button.disable()
            stop.enable()
            running["id"] = uuid.uuid4().hex
            out.clear()
            with out:
                _tid(ui.spinner(), "running")
            try:
                answer = await run.io_bound(
                    backend.ask, sql.value or "", worker.value or None, int(drawn.value), running["id"]
                )
            finally:
                button.enable()
                stop.disable()
            out.clear()
            with out:
                _draw(answer, shape.value)

        async def halt() -> None:
            if running.get("id"):
                stop.disable()
                try:
                    await run.io_bound(backend.cancel, running["id"])
                except KitError as exc:
                    with out:
                        _error(exc.line(), "cancel-error")

        button.on_click(go)
        stop.on_click(halt)


def lake_page(backend: Backend) -> None:
    @ui.page("/lake", title="Lake · ducklake-kit console")
    async def page() -> None:
        _frame("tables, snapshots and the raw catalog")
        loading = _tid(ui.spinner(size="lg"), "loading").classes("m-4")
        if not await connected():  # as on the Query page: the lake's first connection takes seconds
            return
        with ui.column().classes("w-full p-4 gap-4"):
            try:
                tables = await run.io_bound(backend.tables)
                snaps = await run.io_bound(backend.snapshots)
                catalog = await run.io_bound(backend.catalog_tables)
            except KitError as exc:
                _error(exc.line(), "lake-error")
                return
            finally:
                loading.delete()
            ui.label("Tables").classes("text-h6")
            _table(
                ["schema", "table", "rows", "columns"],
                [(t.schema, t.name, t.rows, ", ".join(f"{c} {ty}" for c, ty in t.columns)) for t in tables],
                "tables",
            )
            _tid(ui.label(f"Snapshots: {len(snaps)}").classes("text-h6"), "snapshot-count")
            ui.label("Click a snapshot to query the lake as it was then (below).").classes("text-caption")
            timeline = _table(
                ["snapshot", "time", "author", "commit message", "extra info", "changes"],
                [
                    (s.snapshot_id, s.time, s.author, s.commit_message, s.commit_extra_info, _changes(s.changes))
                    for s in snaps
                ],
                "snapshots",
            )
            names = [t.qualified for t in tables]
            pinned = _at_snapshot_section(backend, names, snaps[0].snapshot_id if snaps else 0)
            timeline.on("rowClick", lambda e: pinned.set_value(int(e.args[1]["c0"])))
            _strata_section(backend, names)
            _diff_section(backend, names, [s.snapshot_id for s in snaps])
            ui.label("Catalog tables (read-only)").classes("text-h6")
            # typed to filter: DuckLake keeps a ducklake_inlined_data_<table>_<version> table per table, so on a
            # lake of many tables the list is long (and its menu draws only the first options until scrolled)
            picked = _tid(ui.select(catalog, label="ducklake_* table", with_input=True), "catalog-select")
            picked.classes("w-72")

            def draw(got) -> None:
                _tid(ui.label(f"{got.table}: {got.total_rows} rows, {len(got.rows)} shown"), "catalog-summary")
                _table(got.columns, got.rows, "catalog-table")

            on_pick(picked, backend.catalog_rows, draw, "catalog-error")


def _at_snapshot_section(backend: Backend, tables: list[str], newest: int):
    """Any query at a chosen snapshot: each lake table it reads pinned `AT (VERSION => n)`, run on the plane. Returns
    the snapshot's input (a click on the timeline sets it)."""
    ui.label("Query at a snapshot").classes("text-h6")
    example = f"SELECT count(*) AS rows FROM {tables[0]}" if tables else "SELECT 1"
    with ui.row().classes("items-center gap-4 w-full"):
        snap = _tid(ui.number("snapshot", value=newest, min=0, precision=0), "at-snapshot").classes("w-32")
        text = _tid(ui.textarea("SQL", value=example), "at-sql").classes("w-[40rem] font-mono")
        text.props("outlined autogrow")
        button = _tid(ui.button("Run at this snapshot"), "at-run")
    shown = ui.column().classes("w-full")

    async def go() -> None:
        shown.clear()
        try:
            query = at_snapshot(text.value or "", int(snap.value or 0))
        except KitError as exc:
            with shown:
                _error(exc.line(), "at-error")
            return
        with shown:
            _tid(ui.spinner(), "at-running")
        button.disable()
        try:
            answer = await run.io_bound(backend.ask, query, None, DEFAULT_ROWS, uuid.uuid4().hex)
        finally:
            button.enable()
        shown.clear()
        with shown:
            _tid(ui.code(query, language="sql"), "at-query").classes("w-full")
            if not answer.ok:
                _error(answer.error or "", "at-error")
                return
            rows = f"{answer.total_rows} rows, {len(answer.rows)} drawn"
            line = f"at snapshot {int(snap.value or 0)}: {rows} · worker {answer.worker} · {answer.seconds:.3f} s"
            _tid(ui.label(line), "at-summary")
            _table(answer.columns, answer.rows, "at-rows")

    button.on_click(go)
    return snap


def _strata_section(backend: Backend, tables: list[str]) -> None:
    """A table's data files (the catalog's ducklake_data_file) drawn as strata by snapshot, and listed."""
    ui.label("A table's data files, by snapshot").classes("text-h6")
    table = _tid(ui.select(tables, label="table", with_input=True), "strata-table").classes("w-72")

    def draw(got) -> None:
        alive = [f for f in got.files if f.end_snapshot is None]
        _tid(
            ui.label(
                f"{got.table}: {len(got.files)} data files in the catalog, {len(alive)} in the table now "
                f"({sum(f.rows for f in alive)} rows; rows still inlined in the catalog are in no file)"
            ),
            "strata-summary",
        )
        if got.files:
            chart = ui.echart(strata.chart_options(got), renderer="svg").classes("w-full h-80")
            _tid(chart, "strata-chart")
        _table(
            ["file", "path", "rows", "bytes", "added at", "removed at"],
            [(f.file_id, f.path, f.rows, f.size_bytes, f.begin_snapshot, f.end_snapshot) for f in got.files],
            "strata-files",
        )

    on_pick(table, backend.strata, draw, "strata-error")


def _diff_section(backend: Backend, tables: list[str], snapshot_ids: list[int]) -> None:
    """A table's diff between two snapshots: what the change feed says changed after the first up to the second."""
    ui.label("Diff a table between two snapshots").classes("text-h6")
    newest = snapshot_ids[0] if snapshot_ids else 0
    with ui.row().classes("items-center gap-4"):
        first = tables[0] if tables else None
        # typed to filter, as the catalog tables' select: a lake of many tables is a long list
        table = _tid(ui.select(tables, label="table", value=first, with_input=True), "diff-table").classes("w-72")
        before = _tid(ui.number("after snapshot", value=max(newest - 1, 0), min=0, precision=0), "diff-before")
        after = _tid(ui.number("up to snapshot", value=newest, min=0, precision=0), "diff-after")
        button = _tid(ui.button("Diff"), "diff-run")
    shown = ui.column().classes("w-full")

    async def go() -> None:
        shown.clear()
        if not table.value:
            return
        try:
            got = await run.io_bound(backend.diff, table.value, int(before.value or 0), int(after.value or 0))
        except KitError as exc:
            with shown:
                _error(exc.line(), "diff-error")
            return
        with shown:
            _tid(ui.label(shapes.diff_summary(got)), "diff-summary")
            _table(got.columns, got.rows, "diff-rows")

    button.on_click(go)


def workers_page(backend: Backend) -> None:
    @ui.page("/workers", title="Workers · ducklake-kit console")
    async def page() -> None:
        _frame("the worker plane's DuckDB workers")
        if not await connected():
            return
        with ui.column().classes("w-full p-4 gap-4"):
            try:
                workers = await run.io_bound(backend.worker_list)
            except KitError as exc:
                _error(exc.line(), "workers-error")
                return
            _tid(ui.label(f"Workers: {len(workers)} at {backend.address}").classes("text-h6"), "worker-count")
            _table(
                ["worker", "address", "pid", "state", "lake", "tasks run", "uptime s", "memory MiB", "local tables"],
                [
                    (
                        w.name,
                        w.address,
                        w.pid,
                        w.state,
                        w.lake,
                        w.tasks_run,
                        w.uptime_s,
                        None if w.memory_mib is None else round(w.memory_mib),
                        ", ".join(w.local_tables) or "-",
                    )
                    for w in workers
                ],
                "workers-table",
            )
            if backend.dashboard:
                _tid(ui.link(f"Dask dashboard: {backend.dashboard}", backend.dashboard, new_tab=True), "dashboard")


def _changes(changes: dict[str, list[str]]) -> str:
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(changes.items()))


def register(backend: Backend) -> None:
    from ducklake_kit.console import dynamic_page, lineage_page, load_page

    query_page(backend)
    lake_page(backend)
    load_page.register(backend)
    dynamic_page.register(backend)
    lineage_page.register(backend)
    workers_page(backend)
