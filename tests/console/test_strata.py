"""A table's files as strata, without services: the snapshots on the x axis and each layer's rows alive at each. The
browser test compares the drawn chart with the catalog's own rows (tests/console/test_console.py)."""

from __future__ import annotations

from ducklake_kit.console.strata import DataFile, chart_options, strata_of


def test_a_compaction_ends_lower_layers_and_lays_a_new_one():
    files = [
        DataFile(0, "a.parquet", 30, 1, begin_snapshot=1, end_snapshot=None),
        DataFile(1, "b.parquet", 50, 1, begin_snapshot=3, end_snapshot=6),
        DataFile(2, "c.parquet", 20, 1, begin_snapshot=3, end_snapshot=6),
        DataFile(3, "d.parquet", 70, 1, begin_snapshot=6, end_snapshot=None),  # b and c merged
    ]
    got = strata_of("main.t", files, latest=9)
    assert got.snapshots == [1, 3, 6, 9]
    assert got.layers == {1: [30, 30, 30, 30], 3: [0, 70, 0, 0], 6: [0, 0, 70, 70]}
    options = chart_options(got)
    assert options["xAxis"]["data"] == ["1", "3", "6", "9"]
    assert [(s["name"], s["stack"], s["data"]) for s in options["series"]] == [
        ("added at 1", "files", [30, 30, 30, 30]),
        ("added at 3", "files", [0, 70, 0, 0]),
        ("added at 6", "files", [0, 0, 70, 70]),
    ]


def test_a_table_without_files_has_no_strata():
    got = strata_of("main.t", [], latest=4)
    assert (got.snapshots, got.layers) == ([], {})
