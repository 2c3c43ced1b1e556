"""The query at a snapshot's rewrite, without services: which tables get `AT (VERSION => n)` and which do not. That
DuckDB reads the rewritten query at that snapshot is the browser test's (tests/console/test_console.py)."""

from __future__ import annotations

import pytest

from ducklake_kit.console.at_snapshot import at_snapshot
from ducklake_kit.errors import KitError


def test_every_lake_table_read_is_pinned_joins_subqueries_and_ctes_included():
    got = at_snapshot(
        "WITH recent AS (SELECT * FROM trips WHERE id > 3) "
        "SELECT r.id FROM recent r JOIN lake.main.zones AS z ON true WHERE r.id IN (SELECT id FROM s.t)",
        7,
    )
    assert got == (
        "WITH recent AS (SELECT * FROM trips AT (VERSION => 7) WHERE id > 3) SELECT r.id FROM recent AS r "
        "JOIN lake.main.zones AS z AT (VERSION => 7) ON TRUE WHERE r.id IN (SELECT id FROM s.t AT (VERSION => 7))"
    )


def test_functions_worker_local_tables_and_own_versions_are_left_alone():
    got = at_snapshot("SELECT * FROM range(3) r, local.scratch, ducklake_snapshots('lake'), t AT (VERSION => 2), u", 5)
    assert "local.scratch," in got and "t AT (VERSION => 2)" in got and "u AT (VERSION => 5)" in got
    assert "RANGE(0, 3) AS r," in got and "DUCKLAKE_SNAPSHOTS('lake')," in got


@pytest.mark.parametrize(
    ("text", "snapshot", "message"),
    [
        ("DELETE FROM trips", 3, "a query at a snapshot is one SELECT"),
        ("SELECT 1; SELECT 2", 3, "a query at a snapshot is one SELECT"),
        ("SELECT FROM WHERE (", 3, "the query does not parse"),
        ("SELECT 1", -1, "'-1' is not a snapshot id"),
    ],
)
def test_what_is_not_one_query_at_a_snapshot_is_refused_in_one_line(text, snapshot, message):
    with pytest.raises(KitError) as refused:
        at_snapshot(text, snapshot)
    assert refused.value.line().startswith(f"Error: {message}")
