"""How the console draws an answer, without a browser: the chart chosen by the columns' types, the table's cells."""

from __future__ import annotations

import datetime as dt
import decimal

from ducklake_kit.console import shapes


def test_a_category_beside_numbers_is_a_bar_chart_with_a_series_per_number():
    spec = shapes.chart_spec(["BIGINT", "VARCHAR", "DOUBLE", "DECIMAL(18,2)"])
    assert (spec.kind, spec.x, spec.ys) == ("bar", 1, [0, 2, 3])


def test_time_or_numbers_alone_make_a_line():
    assert shapes.chart_spec(["DATE", "BIGINT"]).kind == "line"
    assert shapes.chart_spec(["TIMESTAMP WITH TIME ZONE", "DOUBLE"]).kind == "line"
    spec = shapes.chart_spec(["INTEGER", "BIGINT"])
    assert (spec.kind, spec.x, spec.ys) == ("line", 0, [1])


def test_nothing_to_draw_is_no_chart():
    assert shapes.chart_spec(["VARCHAR", "DATE"]) is None  # no number
    assert shapes.chart_spec(["BIGINT"]) is None  # one column
    assert shapes.chart_spec([]) is None


def test_the_options_carry_the_drawn_rows():
    spec = shapes.chart_spec(["VARCHAR", "BIGINT"])
    opts = shapes.chart_options(spec, ["zone", "trips"], [("a", 3), ("b", None)])
    assert opts["xAxis"]["data"] == ["a", "b"]
    assert opts["series"] == [{"name": "trips", "type": "bar", "data": [3.0, None]}]


def test_cells_keep_numbers_and_say_null():
    assert [shapes.cell(v) for v in (None, 3, 2.5, True, decimal.Decimal("1.10"), 2**60)] == [
        "NULL",
        3,
        2.5,
        "true",
        "1.10",
        str(2**60),  # a browser's number would round it
    ]
    assert shapes.cell(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02 03:04:05"
    assert shapes.cell(dt.date(2024, 1, 2)) == "2024-01-02"
    rows = shapes.table_rows([("x.y", None)])
    assert rows == [{"_row": 0, "c0": "x.y", "c1": "NULL"}]
    assert shapes.table_columns(["a.b", "a.b"])[1] == {"name": "c1", "label": "a.b", "field": "c1", "align": "left"}
