"""The reporter: where long work says what it is doing. Like sqlmesh's console, it is injected with a no-op default,
so library code reports without knowing who listens:

    kit.reporter.say("landing raw files in s3://raw")             # one line of progress
    with kit.reporter.progress("loading files", total=3, unit="files") as bar:
        for f in files: ...; bar.advance()                          # a bar with its rate and ETA in a terminal

`Reporter` says nothing (a notebook's or a test's default); `CallbackReporter` hands each line to a function
(`print`, `list.append`); `LineReporter` prints each `say` as a line
(`• ...`, what the CLI printed as `on_step` before) and draws no bar: the output of a pipe, a log or CI, and of
`--json`, where the lines go to stderr so stdout carries only the envelope; `BarReporter` prints the same lines and
draws Rich progress bars (bar, count, rate, ETA) while work runs, when stdout is a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

T = TypeVar("T")


class Bar:
    """One piece of work's progress; the no-op one counts nothing."""

    def advance(self, n: float = 1) -> None:
        pass

    def close(self) -> None:
        """The work is over (a finished bar stays on screen; the display ends with the last open bar)."""


class Reporter:
    """Says nothing: the default wherever no one listens."""

    def say(self, message: str) -> None:
        pass

    def open(self, what: str, total: float | None = None, unit: str = "") -> Bar:
        """A bar for `what` (`total` items of `unit`; None: unknown, drawn as a pulse), for work reported through
        callbacks; `close` it."""
        return Bar()

    @contextmanager
    def progress(self, what: str, total: float | None = None, unit: str = "") -> Iterator[Bar]:
        """A bar for `what` while the block runs."""
        bar = self.open(what, total, unit)
        try:
            yield bar
        finally:
            bar.close()

    def track(self, items: Iterable[T], what: str, unit: str = "") -> Iterator[T]:
        """Each of `items`, advancing a bar for `what` as each is done."""
        items = list(items)
        with self.progress(what, len(items), unit) as bar:
            for item in items:
                yield item
                bar.advance()


class CallbackReporter(Reporter):
    """Each `say` handed to a function (`print`, `list.append`): a notebook's or a test's listener; no bars."""

    def __init__(self, fn: Callable[[str], object]) -> None:
        self.fn = fn

    def say(self, message: str) -> None:
        self.fn(message)


class LineReporter(Reporter):
    """Each `say` as a line on `console` (`• message`); no bars, so a pipe or a log reads as before."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def say(self, message: str) -> None:
        self.console.print(f"[dim]•[/] {message}", markup=True, highlight=False)


class _Rate(ProgressColumn):
    """Items per second in the bar's own unit: `1,234 rows/s`."""

    def render(self, task: Task) -> Text:
        speed, unit = task.finished_speed or task.speed, task.fields.get("unit", "")
        return Text(f"{speed:,.1f} {unit}/s" if speed else f"- {unit}/s", style="progress.data.speed")


class _RichBar(Bar):
    def __init__(self, owner: BarReporter, task_id: int) -> None:
        self.owner, self.task_id, self.closed = owner, task_id, False

    def advance(self, n: float = 1) -> None:
        self.owner.live.advance(self.task_id, n)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.closed()


class BarReporter(LineReporter):
    """Lines as LineReporter, and a Rich progress bar (bar, count, rate, ETA) for each piece of work while it runs;
    a finished bar stays on screen as a record of how long it took. Bars open at once share one display."""

    def __init__(self, console: Console) -> None:
        super().__init__(console)
        self.live: Progress | None = None
        self.open_bars = 0

    def open(self, what: str, total: float | None = None, unit: str = "") -> Bar:
        if self.live is None:
            self.live = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                _Rate(),
                TextColumn("elapsed"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.live.start()
        self.open_bars += 1
        return _RichBar(self, self.live.add_task(what, total=total, unit=unit))

    def closed(self) -> None:
        self.open_bars -= 1
        if self.open_bars == 0 and self.live is not None:
            self.live.stop()
            self.live = None

    # `say` is LineReporter's: while a bar is drawn, the display's console prints the line above it


def reporter_for(console: Console) -> Reporter:
    """Bars when `console` writes to a terminal, plain lines otherwise."""
    return BarReporter(console) if console.is_terminal else LineReporter(console)
