"""The Load page (Sord's management tab): a CSV or Parquet file of trips, or a folder of them, into the lake through
the kit's own PySpark `load` (console.loading runs it in the background, one at a time), its progress while it runs
and its result (the snapshot it made, each file's rows, every check it computed). Cancel (confirmed) ends a running
load; the page then says what the lake holds of it. Leave the page and come back: the running load, or the last one,
is shown again."""

from __future__ import annotations

from nicegui import run, ui

from ducklake_kit.console.backend import Backend
from ducklake_kit.console.loading import MODES, LoadJob
from ducklake_kit.console.widgets import error, frame, table, tid
from ducklake_kit.errors import KitError

MODE_HELP = {
    "skip": "skip: a file already loaded (same content) is not loaded again",
    "append": "append: every file is loaded, even one loaded before",
    "replace": "replace: a file's period replaces what an earlier load took from the same file name",
}


def _summary(job: LoadJob) -> str:
    r = job.result
    rows = sum(int(f.get("rows_accepted") or 0) for f in r.get("files", []) if f.get("status") == "loaded")
    bad = sum(int(f.get("rows_rejected") or 0) for f in r.get("files", []) if f.get("status") == "loaded")
    snap = (
        f"snapshot {r['snapshot_id']} (was {r.get('previous_snapshot')})"
        if r.get("snapshot_id") is not None
        else f"no new snapshot (still {r.get('previous_snapshot')})"
    )
    checks = f"checks: {r.get('passed', 0)} passed, {r.get('failed', 0)} failed"
    return f"load {r.get('load_id')}: {snap}; {rows} rows loaded, {bad} quarantined; {checks} · {job.seconds()} s"


def _state(job: LoadJob) -> str:
    if job.running:
        return "cancelling" if job.cancelled else "running"
    if job.cancelled and job.envelope is None:
        return "cancelled"
    return "done" if job.ok else "failed"


def _draw(job: LoadJob) -> None:
    head = f"load {job.id} of {len(job.files)} file(s), mode {job.mode}: {_state(job)} ({job.seconds()} s)"
    tid(ui.label(head), "load-state").classes("text-subtitle1")
    tid(ui.code("\n".join(job.lines) or "starting the load", language="text"), "load-progress").classes("w-full")
    if job.running:
        if job.cancelled:
            tid(
                ui.label(
                    "cancelling: ending the load's processes (Spark's JVM with them), then asking the lake whether it "
                    "committed"
                ),
                "load-cancelling",
            ).classes("text-caption")
        tid(ui.spinner(), "load-running")
        return
    if job.stopped:  # no envelope: what the lake holds of it, found by its id
        tid(ui.label(job.stopped), "load-stopped").classes("font-bold" if job.cancelled else "text-negative")
        return
    if job.error:
        error(job.error, "load-error")
        return
    r = job.result
    tid(ui.label(_summary(job)), "load-summary").classes("font-bold")
    table(
        ["file", "period", "status", "read", "accepted", "quarantined", "data files", "note"],
        [
            (
                f.get("file"),
                f.get("period"),
                f.get("status"),
                f.get("rows_read"),
                f.get("rows_accepted"),
                f.get("rows_rejected"),
                f.get("data_files"),
                f.get("reason"),
            )
            for f in r.get("files", [])
        ],
        "load-files",
    )
    table(
        ["check", "passed", "expected", "actual"],
        [(c["name"], "ok" if c["passed"] else "FAIL", c["expected"], c["actual"]) for c in r.get("checks", [])],
        "load-checks",
    )


def register(backend: Backend) -> None:
    @ui.page("/load", title="Load · ducklake-kit console")
    async def page() -> None:
        frame("files of trips into the lake, through the PySpark load")
        loads = backend.loads
        with ui.column().classes("w-full p-4 gap-2"):
            ui.label(
                "A CSV or Parquet file of TLC yellow trips, or a folder of them, on the machine the console runs on "
                "(readable by its user): loaded as `load --source files --path ... --mode ...` loads it, one "
                "snapshot, every figure checked against the files. One load at a time."
            ).classes("text-caption")
            with ui.row().classes("items-center gap-4 w-full"):
                path = tid(ui.input("file or folder", placeholder="/data/trips/"), "load-path").classes("w-[40rem]")
                mode = tid(ui.select(list(MODES), value="skip", label="mode"), "load-mode").classes("w-32")
                button = tid(ui.button("Load"), "load-run")
                cancel = tid(ui.button("Cancel load…", color="negative"), "load-cancel").props("outline")
                cancel.set_visibility(False)
            ui.label().bind_text_from(mode, "value", lambda v: MODE_HELP.get(v, "")).classes("text-caption")
            refused = ui.column().classes("w-full")
            shown = ui.column().classes("w-full")
        with ui.dialog() as confirm, ui.card():
            ui.label(
                "Cancel the running load? Its processes end, Spark's JVM with them. A load commits one snapshot or "
                "nothing: the page then says which, as the lake has it."
            )
            with ui.row():
                really = tid(ui.button("Cancel the load", color="negative"), "load-cancel-confirm")
                tid(ui.button("Keep it running", on_click=confirm.close), "load-cancel-keep").props("flat")
        drawn: dict[str, object] = {"seen": None}

        def redraw() -> None:
            job = loads.current() if loads else None
            cancel.set_visibility(job is not None and job.running and not job.cancelled)
            if job is None:
                return
            seen = (job.id, len(job.lines), job.running, job.cancelled)
            if seen == drawn["seen"]:
                return
            drawn["seen"] = seen
            shown.clear()
            with shown:
                _draw(job)

        async def halt() -> None:
            confirm.close()
            cancel.set_visibility(False)
            if loads is not None:
                await run.io_bound(loads.cancel)  # returns at once: the processes end on a thread of their own
            redraw()

        async def go() -> None:
            refused.clear()
            if loads is None:
                with refused:
                    error(
                        "Error: this console cannot load (it has no folder of its own). Try: run `console` again",
                        "load-refused",
                    )
                return
            button.disable()
            try:
                await run.io_bound(loads.start, path.value or "", mode.value or "skip")
            except KitError as exc:
                with refused:
                    error(exc.line(), "load-refused")
            finally:
                button.enable()
            redraw()

        button.on_click(go)
        cancel.on_click(confirm.open)
        really.on_click(halt)
        redraw()
        ui.timer(0.5, redraw)
