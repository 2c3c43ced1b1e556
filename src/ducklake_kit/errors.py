"""Domain errors: one clear line at the edge, `Error: <what>. Try: <fix>`, and a stable exit code."""

from __future__ import annotations

# Stable exit codes (documented in docs/harness.md and `--help`).
EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # the command ran, but a computed check did not hold
EXIT_USAGE = 2  # typer/click usage errors (bad option, missing argument)
EXIT_ERROR = 3  # bad input or an environment problem: a busy port, a wrong password, a missing tool


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (DuckDB and Spark add hints and stack lines below it),
    or its type name when the message is empty."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class KitError(Exception):
    """An error the user can act on. `what` says what went wrong, `fix` how to fix it."""

    def __init__(self, what: str, fix: str = "", *, detail: str = "", exit_code: int = EXIT_ERROR):
        super().__init__(what)
        self.what = what.rstrip(".")
        self.fix = fix.rstrip(".")
        self.detail = detail  # optional context printed after the line, e.g. the tail of a service log
        self.exit_code = exit_code

    def line(self) -> str:
        return f"Error: {self.what}." + (f" Try: {self.fix}." if self.fix else "")
