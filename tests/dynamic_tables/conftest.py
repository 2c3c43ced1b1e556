"""The fixture the oracle's modules share: each module's own `Env` on the session's stack."""

from __future__ import annotations

import pytest

from tests.dynamic_tables.oracle import schema_env


@pytest.fixture(scope="module")
def env(stack):
    """An `Env` of the module (`oracle.schema_env`): the test schema made, everything dropped before and after.
    test_refresh.py has its own."""
    with schema_env(stack) as e:
        yield e
