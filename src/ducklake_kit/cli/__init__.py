"""The harness (`python ducklake_test.py`): one module per command group, each command thin (parse, call one
library function, render)."""

from ducklake_kit.cli.app import app, main

__all__ = ["app", "main"]
