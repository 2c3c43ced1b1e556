"""The Lineage page: a pipeline run drawn as its DAG, each node's state updating live as the run goes (an ECharts
graph, laid out in layers by graphlib as `pipeline plan` orders them), and the table and column lineage the pipelines
recorded for a chosen table. A run is the pipelines package's own (`flow.run`, as `pipeline run FILE` runs it: on
the worker plane, change-aware, recorded in the lake); its `on_event` feeds the states the page redraws."""

from __future__ import annotations

import threading
import time
from typing import Any

from nicegui import run, ui

from ducklake_kit.console.backend import Backend
from ducklake_kit.console.widgets import connected, error, frame, table, tid
from ducklake_kit.errors import KitError
from ducklake_kit.pipelines.draw import Arrow, layers

PENDING, RUNNING = "pending", "running"
COLORS = {
    PENDING: "#9e9e9e",
    RUNNING: "#1e88e5",
    "ok": "#43a047",
    "unchanged": "#00897b",
    "failed": "#e53935",
    "skipped": "#fb8c00",
}
REDRAW_S = 0.25


def graph_options(nodes: list[str], arrows: list[Arrow], states: dict[str, str] | None = None) -> dict[str, Any]:
    """ECharts options for a DAG: layers left to right (graphlib's depth), a node coloured by its state (when given),
    labelled with its name and state; an arrow per edge (dashed: inferred, not declared)."""
    cols = layers(nodes, arrows) if nodes else []
    height = max((len(c) for c in cols), default=1)
    pos = {
        n: (x * 220, (y - (len(col) - 1) / 2) * 90 + height * 45)
        for x, col in enumerate(cols)
        for y, n in enumerate(col)
    }
    data = []
    for n in nodes:
        state = (states or {}).get(n)
        data.append(
            {
                "name": n,
                "x": pos[n][0],
                "y": pos[n][1],
                "value": state or "",
                "itemStyle": {"color": COLORS.get(state or PENDING, "#9e9e9e") if states is not None else "#5c6bc0"},
                "label": {"show": True, "formatter": f"{n}: {state}" if state else n},
            }
        )
    return {
        "animation": False,
        "tooltip": {},
        "series": [
            {
                "type": "graph",
                "layout": "none",
                "symbol": "circle",
                "symbolSize": 26,
                "label": {"show": True, "position": "bottom", "fontSize": 13},
                "edgeSymbol": ["none", "arrow"],
                "edgeSymbolSize": 12,
                "data": data,
                "links": [
                    {"source": a.parent, "target": a.child, "lineStyle": {"type": "dashed" if a.dashed else "solid"}}
                    for a in arrows
                ],
                "lineStyle": {"width": 2, "color": "#607d8b"},
            }
        ],
    }


def register(backend: Backend) -> None:
    @ui.page("/lineage", title="Lineage · ducklake-kit console")
    async def page() -> None:
        frame("pipeline runs as their DAG, and lineage")
        if not await connected():
            return
        with ui.column().classes("w-full p-4 gap-4"):
            _run_section(backend)
            _lineage_section(backend)


def _run_section(backend: Backend) -> None:
    ui.label("Run a pipeline").classes("text-h6")
    files = backend.pipeline_files()
    with ui.row().classes("items-center gap-4"):
        chosen = tid(ui.select(files, label="pipeline file", value=files[0] if files else None), "pipeline-file")
        chosen.classes("w-72")
        # the name its runs are recorded under (a change-aware run compares with the last run of that name)
        named = tid(ui.input("pipeline name"), "pipeline-name").classes("w-56")
        button = tid(ui.button("Run"), "pipeline-run")
    text = tid(ui.textarea("pipeline SQL (-- id / -- depends_on / -- node headers)"), "pipeline-sql")
    text.classes("w-full font-mono").props("outlined autogrow input-style='max-height: 16rem'")
    status = ui.column().classes("w-full")
    drawn = ui.column().classes("w-full")
    live: dict[str, Any] = {"states": {}, "pipeline": None, "chart": None}
    lock = threading.Lock()

    def load_file(_: Any = None) -> None:
        if chosen.value:
            try:
                text.set_value(backend.pipeline_text(chosen.value))
                named.set_value(chosen.value.removesuffix(".sql"))
            except KitError as exc:
                with status:
                    error(exc.line(), "pipeline-error")

    def draw(pipeline, states: dict[str, str] | None) -> None:
        arrows = [Arrow(e.parent, e.child, dashed=not e.declared) for e in pipeline.edges]
        options = graph_options(list(pipeline.nodes), arrows, states)
        if live["chart"] is None:
            drawn.clear()
            with drawn:
                live["chart"] = tid(ui.echart(options, renderer="svg"), "pipeline-graph").classes("w-full h-96")
                live["nodes"] = ui.column().classes("w-full")
        else:
            live["chart"].options.clear()
            live["chart"].options.update(options)
            live["chart"].update()

    def draw_nodes(rows: list[tuple]) -> None:
        live["nodes"].clear()
        with live["nodes"]:
            table(["node", "state", "worker", "ms", "snapshot", "why / error"], rows, "pipeline-nodes")

    def redraw() -> None:
        pipeline = live["pipeline"]
        if pipeline is None:
            return
        with lock:
            states = dict(live["states"])
            runs = dict(live.get("runs", {}))
        if states == live.get("shown"):
            return
        live["shown"] = states
        draw(pipeline, states)
        draw_nodes(
            [
                (
                    n,
                    states.get(n, PENDING),
                    runs[n].worker if n in runs else "-",
                    "-" if n not in runs or runs[n].duration_ms is None else round(runs[n].duration_ms),
                    "-" if n not in runs or runs[n].snapshot_id is None else runs[n].snapshot_id,
                    (runs[n].error or runs[n].reason or "") if n in runs else "",
                )
                for n in pipeline.nodes
            ]
        )

    timer = ui.timer(REDRAW_S, redraw, active=False)

    async def go() -> None:
        status.clear()
        try:
            pipeline = backend.build_pipeline(text.value or "", (named.value or "console").strip() + ".sql")
        except KitError as exc:
            with status:
                error(exc.line(), "pipeline-error")
            return
        with lock:
            live.update(pipeline=pipeline, states=dict.fromkeys(pipeline.nodes, PENDING), runs={}, shown=None)
        live["chart"] = None
        redraw()
        button.disable()
        timer.activate()

        def on_event(kind: str, node: Any) -> None:  # on the run's thread
            with lock:
                if kind == "start":
                    live["states"][node.id] = RUNNING
                else:
                    live["states"][node.id] = node.status
                    live["runs"][node.id] = node

        started = time.perf_counter()
        try:
            outcome = await run.io_bound(backend.run_pipeline, pipeline, on_event)
        except KitError as exc:
            with status:
                error(exc.line(), "pipeline-error")
            return
        finally:
            timer.deactivate()
            button.enable()
        redraw()
        with status:
            if outcome is None:
                tid(ui.label("nothing to run"), "pipeline-done")
                return
            r = outcome.run
            counts = ", ".join(f"{r.count(s)} {s}" for s in ("ok", "unchanged", "failed", "skipped") if r.count(s))
            line = f"run {r.run_id} of {r.pipeline}: {r.status} ({counts}) in {time.perf_counter() - started:.1f} s"
            tid(ui.label(line + (f"; aborted: {r.aborted}" if r.aborted else "")), "pipeline-done")

    chosen.on_value_change(load_file)
    load_file()
    button.on_click(go)


def _lineage_section(backend: Backend) -> None:
    ui.label("Lineage of a table (as pipelines built it)").classes("text-h6")
    with ui.row().classes("items-center gap-4"):
        name = tid(ui.input("table", placeholder="marts.borough_summary"), "lineage-table").classes("w-72")
        button = tid(ui.button("Show lineage"), "lineage-run")
    shown = ui.column().classes("w-full")

    async def go() -> None:
        shown.clear()
        try:
            view = await run.io_bound(backend.lineage, (name.value or "").strip())
        except KitError as exc:
            with shown:
                error(exc.line(), "lineage-error")
            return
        nodes = list(dict.fromkeys([view.table, *(e.parent for e in view.edges), *(e.child for e in view.edges)]))
        arrows = list(dict.fromkeys(Arrow(e.parent, e.child) for e in view.edges))
        with shown:
            tid(ui.label(f"{view.table}: {len(nodes) - 1} tables upstream"), "lineage-summary")
            chart = ui.echart(graph_options(nodes, arrows), renderer="svg").classes("w-full h-80")
            tid(chart, "lineage-graph")
            table(
                ["table", "built from", "pipeline", "node"],
                [(e.child, e.parent, e.pipeline, e.node_id) for e in view.edges],
                "lineage-edges",
            )
            ui.label("Columns").classes("text-subtitle1")
            table(["column", "from"], [(f"{c}.{cc}", f"{p}.{pc}") for c, cc, p, pc in view.columns], "lineage-columns")

    button.on_click(go)
