"""Fixtures the pipeline tests share."""

from __future__ import annotations

import pytest

from ducklake_kit.workers import plane


@pytest.fixture(scope="module")
def workers(stack):
    """The stack's worker plane with two workers, w1 and w2, for a module's pipelines."""
    status = plane.up(stack.state, stack.platform.endpoints(), 2)
    assert [w.name for w in status.workers] == ["w1", "w2"], status
    return status
