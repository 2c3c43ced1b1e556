"""What a statement costs in catalog round trips: the statements DuckDB's postgres extension sends to the
catalog while it runs (`pg_debug_show_queries`, one printed block per round trip)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import duckdb


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send this process's file descriptor 2 to `path` (where DuckDB's postgres extension prints its debug output)."""
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)  # C stdio buffers (where DuckDB printed) go to `path`, not the terminal
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)


def catalog_statements(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> tuple[list[str], float]:
    """Run `sql` once with `pg_debug_show_queries` on: the statements it sent to the catalog (one per round trip),
    and its seconds (printing them costs a little)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "queries.txt"
        with _stderr_to(log):
            con.execute("SET pg_debug_show_queries = true")
            t = time.perf_counter()
            try:
                con.execute(sql, params or []).fetchall()
            finally:
                seconds = time.perf_counter() - t
                con.execute("SET pg_debug_show_queries = false")
        text = log.read_text(errors="replace")
    return [chunk.strip() for chunk in text.split("\n\n") if chunk.strip()], seconds
