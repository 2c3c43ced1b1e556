"""Snowflake's CREATE DYNAMIC TABLE as its documentation and users write it: accepted as written (the properties
that mean nothing here kept as ignored), or refused in one line where the kit would drop a meaning. Our reading of
each accepted head is compared with sqlglot's Snowflake dialect, an independent parser."""

from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from ducklake_kit.dynamic_tables import ddl

# (statement, name, lag, mode, comment, ignored); the queries are DuckDB SQL (they run here)
ACCEPTED = [
    (  # the reference page's example
        "CREATE OR REPLACE DYNAMIC TABLE product\n  TARGET_LAG = '20 minutes'\n  WAREHOUSE = mywh\n"
        "  REFRESH_MODE = auto\n  INITIALIZE = on_create\n  AS\n    SELECT product_id, product_name FROM staging_table",
        "main.product",
        "20 minutes",
        "ADAPTIVE",  # AUTO resolves to ADAPTIVE for new tables, as Snowflake's does since 2026-11-20
        None,
        ("WAREHOUSE = mywh",),
    ),
    (  # the older spelling of the lag, DOWNSTREAM quoted, no spaces around =
        "CREATE OR REPLACE DYNAMIC TABLE customer_sales_data_history\n    LAG='DOWNSTREAM'\n"
        "    WAREHOUSE=DYNAMIC_TABLE_WH\nAS\nselect s.custid as customer_id, c.cname as customer_name\n"
        "from cust_info c inner join salesdata s on c.custid = s.custid",
        "main.customer_sales_data_history",
        "DOWNSTREAM",
        "ADAPTIVE",
        None,
        ("WAREHOUSE=DYNAMIC_TABLE_WH",),
    ),
    (  # the best-practice pages' shape: INCREMENTAL, clustering, a comment, retention, grants
        "CREATE OR REPLACE TRANSIENT DYNAMIC TABLE lake.marts.daily_sales\n  TARGET_LAG = '1 hour'\n"
        "  WAREHOUSE = transform_wh\n  REFRESH_MODE = INCREMENTAL\n  CLUSTER BY (sale_date, region)\n"
        "  DATA_RETENTION_TIME_IN_DAYS = 7\n  COMMENT = 'daily sales per region'\n  COPY GRANTS\n"
        "  WITH TAG (cost_center = 'finance')\nAS SELECT sale_date, region, sum(amount) AS total FROM sales "
        "GROUP BY sale_date, region",
        "marts.daily_sales",
        "1 hour",
        "INCREMENTAL",
        "daily sales per region",
        (
            "TRANSIENT",
            "WAREHOUSE = transform_wh",
            "CLUSTER BY (sale_date, region)",
            "DATA_RETENTION_TIME_IN_DAYS = 7",
            "COPY GRANTS",
            "TAG (cost_center = 'finance')",
        ),
    ),
    (  # ADAPTIVE written out
        "CREATE DYNAMIC TABLE orders_by_day TARGET_LAG = '5 minutes' WAREHOUSE = wh REFRESH_MODE = ADAPTIVE\n"
        "AS SELECT order_date, count(*) AS n FROM orders GROUP BY order_date",
        "main.orders_by_day",
        "5 minutes",
        "ADAPTIVE",
        None,
        ("WAREHOUSE = wh",),
    ),
]


@pytest.mark.parametrize("text, name, lag, mode, comment, ignored", ACCEPTED)
def test_snowflake_statements_are_taken_as_written(text, name, lag, mode, comment, ignored):
    [s] = ddl.parse(text)
    assert (s.name, str(s.lag), s.refresh_mode, s.comment, s.ignored) == (name, lag, mode, comment, ignored)
    assert isinstance(s.select, exp.Select) and s.query.lower().startswith("select")


@pytest.mark.parametrize("text", [a[0] for a in ACCEPTED])
def test_our_reading_of_the_head_agrees_with_sqlglots_snowflake_dialect(text):
    [s] = ddl.parse(text)
    tree = sqlglot.parse_one(text.split("\nAS")[0].split("  AS\n")[0] + " AS SELECT 1", read="snowflake")
    assert isinstance(tree, exp.Create)
    props = {
        p.name.upper(): p.args["value"].name for p in tree.args["properties"].expressions if type(p) is exp.Property
    }
    lag = props.get("TARGET_LAG") or props.get("LAG")
    assert ddl.parse_lag(lag) == s.lag
    assert any(i.replace(" ", "").upper() == f"WAREHOUSE={props['WAREHOUSE']}".upper() for i in s.ignored)
    written = (props.get("REFRESH_MODE") or "ADAPTIVE").upper()
    assert {"AUTO": "ADAPTIVE"}.get(written, written) == s.refresh_mode  # AUTO resolves to ADAPTIVE, as Snowflake's
    comments = [p.this.name for p in tree.find_all(exp.SchemaCommentProperty)]
    assert comments == ([s.comment] if s.comment else [])


def test_the_immutability_pages_example_is_taken_as_written():
    # Snowflake's "Use immutability constraints" page, "Prevent recomputation when a dimension table changes"
    [s] = ddl.parse(
        "CREATE DYNAMIC TABLE joined_data\nTARGET_LAG = '1 minute'\nWAREHOUSE = mywh\n"
        "IMMUTABLE WHERE (timestamp_col < CURRENT_TIMESTAMP() - INTERVAL '1 day')\nAS\n"
        "SELECT F.primary_key primary_key, F.timestamp_col timestamp_col, D.value dim_value\n"
        "FROM fact_table F\nLEFT OUTER JOIN dimension_table D USING (primary_key);"
    )
    assert s.immutable_where == "(timestamp_col < CURRENT_TIMESTAMP() - INTERVAL '1 day')"
    assert (s.name, s.ignored, s.query.split()[0]) == ("main.joined_data", ("WAREHOUSE = mywh",), "SELECT")


def test_a_column_list_of_names_renames_the_querys_columns_in_order():
    # a Snowflake quickstart's shape: the database's name where the lake's is, and the columns listed after the name
    [s] = ddl.parse(
        "create or replace dynamic table lake.player_360.retention(\n\tUSER_ID,\n\tFIRST_LOGIN_DATE,\n\tTOTAL_LOGINS)\n"
        "target_lag = '1 day' warehouse = wh\nas select user_id, min(login_date), count(*) from logins group by user_id"
    )
    assert s.name == "player_360.retention"
    assert s.select.named_selects == ["USER_ID", "FIRST_LOGIN_DATE", "TOTAL_LOGINS"]
    # the query keeps its shape (still an aggregate by user_id), only its output names change
    assert s.select.args["group"].sql() == "GROUP BY user_id" and "count(*) as" in s.query.lower()


@pytest.mark.parametrize(
    "text, message",
    [
        ("... ROW ACCESS POLICY rap ON (region)", "row access policies are not supported"),
        ("... WITH ROW ACCESS POLICY rap ON (region)", "row access policies are not supported"),
        ("... IMMUTABLE WHERE (t.day < '2024-01-01')", "must read only the table's own columns"),
        ("... IMMUTABLE WHERE (day < (SELECT max(day) FROM s))", "must read only the table's own columns"),
        ("... IMMUTABLE WHERE (day < random())", "IMMUTABLE WHERE of dynamic table main.t calls random()"),
        ("... COMMENT = 42", "COMMENT = 42 is not a string"),
        ("... CLUSTER BY (a", "a ( is not closed"),
    ],
)
def test_what_would_lose_a_meaning_is_refused_in_one_line(text, message):
    head = "CREATE DYNAMIC TABLE t TARGET_LAG = '1 hour' WAREHOUSE = w "
    with pytest.raises(ddl.DdlError) as info:
        ddl.parse(head + text.removeprefix("... ") + " AS SELECT a FROM s")
    line = info.value.line()
    assert message in line and "Try:" in line and "\n" not in line


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "CREATE DYNAMIC TABLE IF NOT EXISTS t TARGET_LAG = '1 hour' WAREHOUSE = w AS SELECT a FROM s",
            "IF NOT EXISTS is not supported",
        ),
        ("CREATE DYNAMIC TABLE t (a INT) TARGET_LAG = '1 hour' AS SELECT a FROM s", "is not a list of names"),
        ("CREATE DYNAMIC TABLE t (a, b) TARGET_LAG = '1 hour' AS SELECT a FROM s", "has 2 names for 1 columns"),
        ("CREATE DYNAMIC TABLE t (a) TARGET_LAG = '1 hour' AS SELECT * FROM s", "not a plain SELECT"),
    ],
)
def test_forms_the_kit_cannot_honour_are_refused_in_one_line(text, message):
    with pytest.raises(ddl.DdlError) as info:
        ddl.parse(text)
    assert message in info.value.line() and "\n" not in info.value.line()
