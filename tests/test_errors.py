"""errors: one line, what and how to fix it."""

from __future__ import annotations

from ducklake_kit.errors import KitError


def test_error_line_is_one_line_with_what_and_fix():
    assert KitError("port 5 is busy.", "use --pg-port").line() == "Error: port 5 is busy. Try: use --pg-port."
    assert KitError("boom").line() == "Error: boom."
