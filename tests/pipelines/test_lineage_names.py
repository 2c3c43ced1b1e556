"""Column lineage of real-world column names, through the CLI against the real lake and worker plane: Jena-climate
columns (Sord's sample data) have dots inside quotes and upper case, which the lineage table must keep as spelled."""

from __future__ import annotations

import json

S = "lineage_names"


def _rows(cli, env, sql: str) -> list[list]:
    result = cli(env, "sql", sql, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["result"]["statements"][-1]["rows"]


def test_lineage_columns_records_quoted_names_as_the_tables_spell_them(stack, cli, tmp_path):
    assert cli(stack.env, "up").exit_code == 0
    _rows(
        cli,
        stack.env,
        f'DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}; CREATE TABLE {S}.climate AS SELECT 1.5 AS "max. wv (m/s)", '
        f'-3.2 AS "T (degC)", \'01.01.2009 00:10:00\' AS "Date Time"',
    )
    path = tmp_path / "climate.sql"
    path.write_text(
        f"-- id: copy\n-- NOTE: Sord's pipelines carry prose comments like this one\n"
        f"CREATE TABLE {S}.t AS SELECT * FROM {S}.climate;\n"
        f'-- id: kelvin\nCREATE TABLE {S}.k AS SELECT "T (degC)" + 273.15 AS "T (K)" FROM {S}.t;\n'
    )
    run = cli(stack.env, "pipeline", "run", str(path))
    assert run.exit_code == 0, run.output
    got = _rows(
        cli,
        stack.env,
        "SELECT node_id, child_column, parent_column FROM lineage_columns WHERE pipeline = 'climate' ORDER BY ALL",
    )
    assert got == [
        ["copy", "Date Time", "Date Time"],
        ["copy", "T (degC)", "T (degC)"],
        ["copy", "max. wv (m/s)", "max. wv (m/s)"],
        ["kelvin", "T (K)", "T (degC)"],
    ]
    # each name is a column of its table, as DuckDB spells it
    columns = _rows(
        cli, stack.env, f"SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = '{S}'"
    )
    assert {c for _t, c in columns} >= {"Date Time", "T (degC)", "max. wv (m/s)", "T (K)"}
