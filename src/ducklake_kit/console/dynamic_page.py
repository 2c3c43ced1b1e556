"""The Dynamic tables page: each dynamic table's lag, mode and the reason for it, its last refresh and the snapshot
each source was last read at; for a chosen one, its refresh history charted (rows inserted and deleted, and the time
each took) and listed, and "Refresh now" (the dynamic_tables package's own refresh, as `dynamic refresh NAME`)."""

from __future__ import annotations

from typing import Any

from nicegui import run, ui

from ducklake_kit.console.backend import Backend
from ducklake_kit.console.widgets import connected, error, frame, table, tid
from ducklake_kit.errors import KitError

HISTORY = 50  # the most refreshes charted


def _when(t: Any) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S") if t is not None else "-"


def _sources(d: Any) -> str:
    return ", ".join(f"{s} @ {snap if snap is not None else '-'}" for s, snap in d.sources.items())


def _last(r: Any) -> str:
    if r is None:
        return "never"
    return f"#{r.id} {r.status} {r.mode or '-'} at {_when(r.started_at)} ({r.trigger})"


def history_chart(refreshes: list) -> dict[str, Any]:
    """ECharts options: per refresh (oldest first) the rows it inserted and deleted (bars), and its time (a line)."""
    ordered = list(reversed(refreshes))
    return {
        "animation": False,
        "tooltip": {"trigger": "axis"},
        "legend": {"data": ["rows inserted", "rows deleted", "ms"]},
        "xAxis": {"type": "category", "data": [f"#{r.id} {r.mode or r.status}" for r in ordered]},
        "yAxis": [{"type": "value", "name": "rows"}, {"type": "value", "name": "ms"}],
        "series": [
            {"name": "rows inserted", "type": "bar", "data": [r.rows_inserted or 0 for r in ordered]},
            {"name": "rows deleted", "type": "bar", "data": [r.rows_deleted or 0 for r in ordered]},
            {
                "name": "ms",
                "type": "line",
                "yAxisIndex": 1,
                "data": [None if r.duration_ms is None else round(r.duration_ms) for r in ordered],
            },
        ],
    }


def register(backend: Backend) -> None:
    @ui.page("/dynamic", title="Dynamic tables · ducklake-kit console")
    async def page() -> None:
        frame("dynamic tables, kept fresh from the change feed")
        loading = tid(ui.spinner(size="lg"), "loading").classes("m-4")
        if not await connected():
            return
        with ui.column().classes("w-full p-4 gap-4"):
            try:
                every = await run.io_bound(backend.dynamic_tables)
            except KitError as exc:
                error(exc.line(), "dynamic-error")
                return
            finally:
                loading.delete()
            overview = ui.column().classes("w-full")

            def draw_overview(every: list) -> None:
                overview.clear()
                with overview:
                    tid(ui.label(f"Dynamic tables: {len(every)}").classes("text-h6"), "dynamic-count")
                    table(
                        [
                            "table",
                            "status",
                            "lag",
                            "mode",
                            "plan",
                            "reason",
                            "last refresh",
                            "data snapshot",
                            "sources",
                        ],
                        [
                            (
                                d.name,
                                d.status,
                                d.lag,
                                d.refresh_mode,
                                d.plan_kind,
                                d.reason or d.plan,
                                _last(last),
                                d.data_snapshot,
                                _sources(d),
                            )
                            for d, last in every
                        ],
                        "dynamic-tables",
                    )

            draw_overview(every)
            names = [d.name for d, _ in every]
            with ui.row().classes("items-center gap-4"):
                picked = tid(ui.select(names, label="dynamic table", with_input=True), "dynamic-select")
                picked.classes("w-72")
                button = tid(ui.button("Refresh now"), "dynamic-refresh")
                button.disable()
            made = ui.column().classes("w-full")
            shown = ui.column().classes("w-full")

            async def show(_: Any = None) -> None:
                shown.clear()
                if not picked.value:
                    button.disable()
                    return
                button.enable()
                try:
                    d, refreshes = await run.io_bound(backend.dynamic_history, picked.value, HISTORY)
                except KitError as exc:
                    with shown:
                        error(exc.line(), "history-error")
                    return
                with shown:
                    tid(ui.label(f"{d.name}: {len(refreshes)} refreshes, newest first"), "history-summary")
                    if refreshes:
                        chart = ui.echart(history_chart(refreshes), renderer="svg").classes("w-full h-72")
                        tid(chart, "history-chart")
                    table(
                        [
                            "id",
                            "trigger",
                            "started",
                            "status",
                            "mode",
                            "inserted",
                            "deleted",
                            "read",
                            "made",
                            "ms",
                            "why",
                        ],
                        [
                            (
                                r.id,
                                r.trigger,
                                _when(r.started_at),
                                r.status,
                                r.mode or "-",
                                "-" if r.rows_inserted is None else r.rows_inserted,
                                "-" if r.rows_deleted is None else r.rows_deleted,
                                r.read_snapshot if r.read_snapshot is not None else "-",
                                r.commit_snapshot if r.commit_snapshot is not None else "-",
                                "-" if r.duration_ms is None else round(r.duration_ms),
                                r.error or r.reason or "",
                            )
                            for r in refreshes
                        ],
                        "history",
                    )
                    ui.code(d.query, language="sql").classes("w-full")

            async def refresh_now() -> None:
                name = picked.value
                if not name:
                    return
                button.disable()
                made.clear()
                with made:
                    tid(ui.spinner(), "refreshing")
                try:
                    refreshes = await run.io_bound(backend.dynamic_refresh, name)
                except KitError as exc:
                    made.clear()
                    with made:
                        error(exc.line(), "refresh-error")
                    return
                finally:
                    button.enable()
                made.clear()
                with made:
                    lines = [
                        f"{r.name}: {r.status} {r.mode or ''} (+{r.rows_inserted or 0} -{r.rows_deleted or 0})"
                        + (f": {r.error}" if r.error else "")
                        for r in refreshes
                    ]
                    tid(ui.label("; ".join(lines)), "refresh-done")
                try:
                    draw_overview(await run.io_bound(backend.dynamic_tables))
                except KitError as exc:
                    with made:
                        error(exc.line(), "dynamic-error")
                await show()

            picked.on_value_change(show)
            button.on_click(refresh_now)
