"""A console started as a user starts it, for the console tests' fixtures (tests/console/conftest.py and the modules
with a lake of their own)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from typer.testing import CliRunner

from ducklake_kit.cli import app
from ducklake_kit.platforms import console as console_mod
from ducklake_kit.workers import plane


@contextmanager
def console_of(s, workers: int) -> Iterator[dict]:
    """The console of stack `s`, started as a user starts it (after `up` of a plane of `workers`: its TLS files),
    its `--json` result; stopped on the way out."""
    plane.up(s.state, s.platform.endpoints(), workers)
    made = CliRunner().invoke(app, ["console", "--json"], env={**s.env, "COLUMNS": "200"})
    try:
        assert made.exit_code == 0, made.output
        yield json.loads(made.stdout)["result"]
    finally:
        console_mod.stop(s.state)
