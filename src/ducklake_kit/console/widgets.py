"""What every page of the console shares: the header with the pages' links, an error line, a table, and the
`data-testid` the browser tests read."""

from __future__ import annotations

from nicegui import ui

from ducklake_kit.console import shapes

PAGES = [
    ("Query", "/"),
    ("Lake", "/lake"),
    ("Dynamic tables", "/dynamic"),
    ("Lineage", "/lineage"),
    ("Workers", "/workers"),
]


def tid(element, name: str):
    return element.props(f'data-testid="{name}"')


def frame(title: str) -> None:
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
