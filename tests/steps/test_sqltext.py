"""What DuckLake cannot do, said once and early (steps/sqltext.py): PRIMARY KEY / UNIQUE removed from CREATE TABLE
with a warning per table (`drop_constraints`), and INSERT ... ON CONFLICT refused with the MERGE INTO that does the
same (`on_conflict_refusal`). The oracle is plain DuckDB: the MERGE printed must do to a table without keys what
DuckDB's own ON CONFLICT does to the same table with its key; the table left after dropping the keys must have
exactly the columns, types and NOT NULLs of the original, and no key."""

from __future__ import annotations

from pathlib import Path

import duckdb
import jinja2
import pytest
import yaml

from ducklake_kit.steps import sqltext

NOETL = Path(__file__).parent / "noetl"


def _merge_of(refusal: str) -> str:
    merge = refusal.split("write it as: ", 1)[1]
    return merge.split(" (it assumes", 1)[0]


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    return con.execute(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns WHERE table_name = ? "
        "ORDER BY ordinal_position",
        [table],
    ).fetchall()


def _keys(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "SELECT constraint_type FROM duckdb_constraints() WHERE table_name = ? AND constraint_type <> 'NOT NULL'",
            [table],
        ).fetchall()
    ]


UPSERTS = [
    # (table with its key, rows already there, the upsert)
    (
        "CREATE TABLE u (id INTEGER PRIMARY KEY, name VARCHAR, n INTEGER)",
        "INSERT INTO u VALUES (1, 'a', 10), (2, 'b', 20)",
        "INSERT INTO u (id, name, n) VALUES (2, 'B', 5), (3, 'c', 30) "
        "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, n = u.n + excluded.n",
    ),
    (
        "CREATE TABLE u (id INTEGER PRIMARY KEY, name VARCHAR, n INTEGER)",
        "INSERT INTO u VALUES (1, 'a', 10), (2, 'b', 20)",
        "INSERT INTO u (id, name, n) VALUES (2, 'B', 5), (3, 'c', 30) ON CONFLICT (id) DO NOTHING",
    ),
    (
        "CREATE TABLE u (id INTEGER PRIMARY KEY, name VARCHAR, n INTEGER)",
        "INSERT INTO u VALUES (1, 'a', 10), (2, 'b', 20)",
        "INSERT INTO u (id, name, n) SELECT i, 'x' || i, i FROM range(1, 4) t(i) "
        "ON CONFLICT (id) DO UPDATE SET n = excluded.n * 100 WHERE n > 15",
    ),
    (
        "CREATE TABLE u (k1 INTEGER, k2 VARCHAR, v INTEGER, PRIMARY KEY (k1, k2))",
        "INSERT INTO u VALUES (1, 'a', 1), (1, 'b', 2)",
        "INSERT INTO u (k1, k2, v) VALUES (1, 'b', 20), (2, 'a', 3) ON CONFLICT (k1, k2) DO UPDATE SET v = excluded.v",
    ),
    (  # no key named: the MERGE says it assumes the first column (true here)
        "CREATE TABLE u (id INTEGER PRIMARY KEY, name VARCHAR, n INTEGER)",
        "INSERT INTO u VALUES (1, 'a', 10), (2, 'b', 20)",
        "INSERT OR REPLACE INTO u (id, name, n) VALUES (2, 'B', 5), (3, 'c', 30)",
    ),
]


@pytest.mark.parametrize("create, before, upsert", UPSERTS)
def test_the_merge_printed_for_an_upsert_does_what_duckdb_on_conflict_does(create, before, upsert):
    why = sqltext.on_conflict_refusal(upsert)
    assert why is not None and "\n" not in why and "no PRIMARY KEY or UNIQUE" in why, why
    merge = _merge_of(why)
    assert merge.startswith("MERGE INTO u AS target USING (") and "WHEN NOT MATCHED THEN INSERT" in merge, merge
    with duckdb.connect() as keyed, duckdb.connect() as lake_like:
        keyed.execute(create)
        keyed.execute(before)
        keyed.execute(upsert)  # DuckDB's own ON CONFLICT, on the table with its key
        dropped, warnings = sqltext.drop_constraints(create)
        assert len(warnings) == 1 and not _keys(lake_like.execute(dropped), "u")
        lake_like.execute(before)
        lake_like.execute(merge)  # the MERGE, on the same table without a key
        expected = keyed.execute("SELECT * FROM u ORDER BY ALL").fetchall()
        assert lake_like.execute("SELECT * FROM u ORDER BY ALL").fetchall() == expected


def test_noetl_http_to_databases_upsert_is_refused_with_its_merge_templates_as_written():
    doc = yaml.safe_load((NOETL / "e2e_http_to_databases.yaml").read_text())
    upserts = [
        s["tool"]["command"]
        for s in doc["workflow"]
        if isinstance(s.get("tool"), dict) and "ON CONFLICT" in str(s["tool"].get("command", ""))
    ]
    assert upserts
    for template in upserts:
        why = sqltext.on_conflict_refusal(template)
        table = template.split("INSERT INTO ", 1)[1].split()[0]
        assert why is not None and f"(table {table});" in why, why
        merge = _merge_of(why)
        assert "{{ user.id }}" in merge and "'{{ user.name }}'" in merge, merge
        assert "ON target.id = source.id" in merge and "SET name = source.name" in merge, merge
        user = {"id": 7, "name": "Ann", "username": "ann", "email": "a@x", "phone": "1", "website": "w"}
        user |= {"company_name": "C", "city": "Oslo"}
        rendered = jinja2.Environment().from_string(merge).render(user=user)
        assert len(duckdb.extract_statements(rendered)) == 1  # DuckDB 1.5.5's own parser takes it


def test_what_is_not_an_upsert_into_the_lake_is_not_refused():
    assert sqltext.on_conflict_refusal("INSERT INTO t (a) VALUES (1)") is None
    assert sqltext.on_conflict_refusal("INSERT INTO local.t (a) VALUES (1) ON CONFLICT DO NOTHING") is None
    assert sqltext.on_conflict_refusal("SELECT 'ON CONFLICT (id) DO NOTHING'") is None
    assert (
        sqltext.on_conflict_refusal("{% for i in x %}INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING{% endfor %}")
        is None
    )
    no_columns = sqltext.on_conflict_refusal("INSERT OR IGNORE INTO t VALUES (1, 2)")
    assert (
        no_columns.startswith("INSERT OR IGNORE cannot work on DuckLake") and "name the INSERT's columns" in no_columns
    )
    guessed = sqltext.on_conflict_refusal("INSERT INTO t (a, b) VALUES (1, 2) ON CONFLICT DO NOTHING")
    assert guessed.endswith("(it assumes the key is a: put your key columns in ON)"), guessed


def test_noetl_ducklake_test_users_table_loses_its_key_and_nothing_else():
    doc = yaml.safe_load((NOETL / "e2e_ducklake_test.yaml").read_text())
    create = next(s for s in doc["workflow"] if s["step"] == "create_users_table")["tool"]["command"]
    assert sqltext.unsupported_constraint(create)
    text = f"-- users; PRIMARY KEY in a comment\n{create}\nSELECT 'id INTEGER PRIMARY KEY' AS s; -- kept\n"
    dropped, warnings = sqltext.drop_constraints(text)
    assert warnings == ["users: PRIMARY KEY (id) removed: DuckLake cannot enforce it (id stays NOT NULL)"]
    assert sqltext.unsupported_constraint(dropped) is None
    assert dropped == text.replace("id INTEGER PRIMARY KEY,", "id INTEGER NOT NULL,")  # the rest as written
    with duckdb.connect() as with_key, duckdb.connect() as without:
        with_key.execute(create)
        without.execute(dropped)
        assert _columns(without, "users") == _columns(with_key, "users")  # names, types, NOT NULL (id)
        assert _keys(with_key, "users") == ["PRIMARY KEY"] and _keys(without, "users") == []


@pytest.mark.parametrize(
    "sql, expected, warning",
    [
        (
            "CREATE TABLE s.t (a INT, b DECIMAL(10, 2), c INT NOT NULL, CONSTRAINT pk PRIMARY KEY (a, c), UNIQUE (b))",
            "CREATE TABLE s.t (a INT NOT NULL, b DECIMAL(10, 2), c INT NOT NULL)",
            "s.t: PRIMARY KEY (a, c), UNIQUE (b) removed: DuckLake cannot enforce them (a, c stay NOT NULL)",
        ),
        (
            "CREATE TABLE t (PRIMARY KEY (a), a INT, b INT CONSTRAINT u UNIQUE)",
            "CREATE TABLE t (a INT NOT NULL, b INT)",
            "t: PRIMARY KEY (a), UNIQUE (b) removed: DuckLake cannot enforce them (a stays NOT NULL)",
        ),
        (
            "CREATE TABLE IF NOT EXISTS {{ t }} (a INT NOT NULL PRIMARY KEY, n VARCHAR DEFAULT '{{ who }}' UNIQUE)",
            "CREATE TABLE IF NOT EXISTS {{ t }} (a INT NOT NULL, n VARCHAR DEFAULT '{{ who }}')",
            "{{ t }}: PRIMARY KEY (a), UNIQUE (n) removed: DuckLake cannot enforce them (a stays NOT NULL)",
        ),
    ],
)
def test_keys_are_removed_from_the_tokens_they_were_written_with(sql, expected, warning):
    assert sqltext.drop_constraints(sql) == (expected, [warning])


def test_what_holds_no_key_of_a_catalog_table_is_left_as_written():
    for sql in [
        "CREATE TABLE local.t (a INT PRIMARY KEY)",  # worker-local: plain DuckDB has keys
        "CREATE TABLE t (a INT NOT NULL, CHECK (a > 0))",
        "SELECT 'PRIMARY KEY'",
        "{% if x %}CREATE TABLE t (a INT PRIMARY KEY){% endif %}",  # only its rendered text can be judged
        "CREATE TABLE t (a INT PRIMARY KEY",  # does not parse: DuckDB says why
    ]:
        assert sqltext.drop_constraints(sql) == (sql, []), sql


def test_the_merge_printed_for_noetl_upsert_runs_on_a_ducklake_table(stack):
    """DuckLake 1.5.5 itself runs the MERGE (first a new row, then the same id again: updated, not doubled)."""
    from ducklake_kit.lake import Lake

    doc = yaml.safe_load((NOETL / "e2e_http_to_databases.yaml").read_text())
    template = next(
        s["tool"]["command"]
        for s in doc["workflow"]
        if isinstance(s.get("tool"), dict) and "ON CONFLICT" in str(s["tool"].get("command", ""))
    )
    table = template.split("INSERT INTO ", 1)[1].split()[0]
    merge = _merge_of(sqltext.on_conflict_refusal(template)).replace(f"MERGE INTO {table} ", "MERGE INTO sqltext_t.u ")
    columns = "id INTEGER NOT NULL, name VARCHAR, username VARCHAR, email VARCHAR, phone VARCHAR, website VARCHAR"
    with Lake(stack.platform.endpoints()) as lake:
        lake.run(
            f"DROP SCHEMA IF EXISTS sqltext_t CASCADE; CREATE SCHEMA sqltext_t; CREATE TABLE sqltext_t.u ({columns}, company_name VARCHAR, city VARCHAR)"
        )
        try:
            for name, city in [("Ann", "Oslo"), ("Ann B", "Bergen")]:
                user = {"id": 7, "name": name, "username": "ann", "email": "a@x", "phone": "1", "website": "w"}
                lake.run(
                    jinja2.Environment().from_string(merge).render(user={**user, "company_name": "C", "city": city})
                )
            assert lake.con.execute("SELECT id, name, city FROM sqltext_t.u").fetchall() == [(7, "Ann B", "Bergen")]
        finally:
            lake.run("DROP SCHEMA IF EXISTS sqltext_t CASCADE")
