"""Fixtures the pipeline tests share."""

from __future__ import annotations

import pytest

from ducklake_kit.lake import Lake
from ducklake_kit.workers import plane


@pytest.fixture(scope="module")
def workers(stack):
    """The stack's worker plane with two workers, w1 and w2, for a module's pipelines."""
    status = plane.up(stack.state, stack.platform.endpoints(), 2)
    assert [w.name for w in status.workers] == ["w1", "w2"], status
    return status


@pytest.fixture(scope="module")
def lake(stack):
    """One connection to the stack's lake for a module's own reads and writes: each statement reads the newest
    snapshot (DuckLake takes it per transaction), and a Lake per statement would attach the lake again each time
    (three extension loads and the ATTACH, ~0.2 s of CPU)."""
    with Lake(stack.platform.endpoints()) as lake:
        yield lake
