"""What every page of the console shares: the header with the pages' links, an error line, a table, a section drawn
from what a select picks, and the `data-testid` the browser tests read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nicegui import __version__, run, ui

from ducklake_kit.console import shapes
from ducklake_kit.errors import KitError

PAGES = [
    ("Query", "/"),
    ("Lake", "/lake"),
    ("Load", "/load"),
    ("Dynamic tables", "/dynamic"),
    ("Lineage", "/lineage"),
    ("Workers", "/workers"),
]


async def connected() -> bool:
    """Wait for the page's websocket; False when the page went away first (a closed tab, or `console`'s own warm-up
    request, which never connects): the page's function then stops instead of drawing into a deleted client."""
    client = ui.context.client
    await client.connected()
    return not client.is_deleted


def tid(element, name: str):
    return element.props(f'data-testid="{name}"')


def frame(title: str) -> None:
    # the table's component comes with the page, not at the first answer (one more round trip then, per page)
    ui.add_head_html(f'<link rel="modulepreload" href="/_nicegui/{__version__}/components/{ui.table.component.key}">')
    with ui.header().classes("items-center gap-6 bg-blue-grey-9"):
        ui.label("ducklake-kit console").classes("text-lg font-bold")
        for name, path in PAGES:
            ui.link(name, path).classes("text-white")
        ui.label(title).classes("opacity-60")


def error(text: str, testid: str = "error") -> None:
    tid(ui.label(text).classes("text-negative font-mono whitespace-pre-wrap"), testid)


def table(columns: list[str], rows: list[tuple], testid: str):
    return tid(
        ui.table(columns=shapes.table_columns(columns), rows=shapes.table_rows(rows), row_key="_row").props(
            "dense flat bordered"
        ),
        testid,
    ).classes("w-full")


def on_pick(picked, fetch: Callable[[Any], Any], draw: Callable[[Any], None], error_testid: str):
    """Below `picked` (a select), what `fetch(value)` answers, drawn by `draw` each time the choice changes: fetched
    on a thread (a slow catalog never holds the page's event loop), a KitError shown as its one line."""
    shown = ui.column().classes("w-full")

    async def show(_: Any = None) -> None:
        shown.clear()
        if not picked.value:
            return
        try:
            got = await run.io_bound(fetch, picked.value)
        except KitError as exc:
            with shown:
                error(exc.line(), error_testid)
            return
        with shown:
            draw(got)

    picked.on_value_change(show)
