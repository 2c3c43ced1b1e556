"""Reading playbooks, no services: the JSON Schema and the kit's checks give one error with the file's line; NoETL's
v1 and v2 shapes map onto the same model; templates are strict; the seed's time travel is rewritten and PRIMARY KEY
refused, with sqlglot."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.steps import noetl, runner, sqltext, templates
from ducklake_kit.steps.schema import PlaybookError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "steps").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> PlaybookError:
    with pytest.raises(PlaybookError) as info:
        runner.load(write(tmp_path, text))
    return info.value


GOOD = """\
workload:
  ids: [1, 2]
workflow:
  - step: make
    tool: ducklake
    command: CREATE TABLE t (i INTEGER)
  - step: fill
    tool: ducklake
    loop:
      collection: "{{ ids }}"
      element: i
      mode: async
    params:
      i: "{{ i }}"
    command: INSERT INTO t VALUES ($i)
"""


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_playbook_validates(path):
    playbook = runner.load(path)
    assert playbook.steps, path


def test_a_good_playbook_maps_to_the_model(tmp_path):
    p = runner.load(write(tmp_path, GOOD))
    assert list(p.steps) == ["make", "fill"] and p.start == "make" and p.shape == "v1"
    fill = p.steps["fill"]
    assert fill.loop.iterator == "i" and fill.loop.mode == "async" and fill.loop.line == 10
    assert fill.commands == ["INSERT INTO t VALUES ($i)"] and fill.command_lines == [15]
    assert noetl.order(p) == ["make", "fill"]


@pytest.mark.parametrize(
    "text, line, words",
    [
        (GOOD.replace("    command: CREATE", "    comand: CREATE"), 6, "unknown key 'comand'"),
        (GOOD.replace("      mode: async", "      mode: async\n      parallelism: 4"), 13, "unknown key 'parallelism'"),
        (
            GOOD.replace("    tool: ducklake\n    command: CREATE", "    tool: snowflake\n    command: CREATE"),
            5,
            "step 'make' uses tool kind 'snowflake', which the kit's step runner does not run",
        ),
        (
            GOOD.replace("    tool: ducklake\n    command: CREATE", "    tool: python\n    command: CREATE"),
            6,
            "unknown key 'command' in workflow.0",  # NoETL's flat python step takes code, not command
        ),
        (GOOD.replace("- step: fill", "- step: make"), 7, "step 'make' is defined twice (first at line 4)"),
        (
            GOOD.replace(
                "    command: CREATE TABLE t (i INTEGER)",
                "    command: CREATE TABLE t (i INTEGER)\n    commands: [SELECT 1]",
            ),
            4,
            "exactly one of them",
        ),
        (GOOD.replace('"{{ ids }}"', '"{{ idz }}"'), 10, "uses {{ idz }}, which is not defined"),
        (GOOD.replace('"{{ i }}"', '"{{ i }"'), 13, "template syntax error"),
        (GOOD + "    next:\n      - step: nowhere\n", 17, "goes next to 'nowhere'"),
        (
            GOOD.replace("INTEGER)\n", "INTEGER)\n    next: [{step: fill}]\n") + "    next:\n      - step: make\n",
            18,
            "routes form a cycle",
        ),
        (GOOD + "    next:\n      - step: make\n", 7, "no route reaches step 'fill' from 'make'"),
        (GOOD + "    vars:\n      make: x\n", 16, "sets vars.make, but make is a step's name"),
        (GOOD.replace("  ids: [1, 2]", "  ids: [1, 2]\n  ids: [3]"), 3, "the key 'ids' appears twice"),
        (GOOD.replace("      element: i", "      element: i\n     bad: indent"), 12, "not valid YAML"),
        (
            GOOD.replace("    params:", "    transaction: true\n    on_error: continue\n    params:"),
            14,
            "`transaction: true` and `on_error: continue`",
        ),
    ],
)
def test_bad_input_is_one_error_at_its_line(tmp_path, text, line, words):
    err = error_of(tmp_path, text)
    assert err.line_no == line, err.line()
    assert words in err.what, err.what
    assert err.line().startswith(f"Error: {tmp_path / 'p.yaml'}:{line}: ")


def test_v1_and_v2_shapes_map_to_the_same_steps():
    v1, v2 = runner.load(ROOT / "steps/ducklake_test_v1.yaml"), runner.load(ROOT / "steps/ducklake_test_v2.yaml")
    assert (v1.shape, v2.shape) == ("v1", "v2")
    assert list(v1.steps) == list(v2.steps)
    for name in v1.steps:
        a, b = v1.steps[name], v2.steps[name]
        assert (a.commands, a.params, a.catalog, a.tool) == (b.commands, b.params, b.catalog, b.tool), name
        assert (
            (a.loop is None) == (b.loop is None) and noetl.routes(v1)[name][0][0] == noetl.routes(v2)[name][0][0]
            if noetl.routes(v1)[name]
            else True
        )
        if a.loop:
            assert (a.loop.collection, a.loop.iterator, a.loop.mode) == (
                b.loop.collection,
                b.loop.iterator,
                b.loop.mode,
            )
    assert noetl.order(v1) == noetl.order(v2)


def test_a_step_reached_from_two_branches_runs_after_both(tmp_path):
    text = """\
workflow:
  - step: start
    next:
      - when: "{{ workload.x }}"
        then: [{step: b}]
      - else: [{step: a}]
  - step: join
  - step: a
    next: [{step: join}]
  - step: b
    next: [{step: join}]
workload: {x: true}
"""
    assert noetl.order(runner.load(write(tmp_path, text))) == ["start", "a", "b", "join"]


def test_templates_are_strict_and_values_keep_their_types():
    ctx = {"ids": [1, 2], "name": "O'Brien", "when": dt.date(2025, 1, 6)}
    with pytest.raises(templates.TemplateError, match="'missing' is undefined"):
        templates.render_text("SELECT {{ missing }}", ctx)
    with pytest.raises(templates.TemplateError, match="has no attribute 'nope'"):
        templates.render_text("{{ name.nope }}", ctx)
    assert templates.render_value("{{ ids }}", ctx) == [1, 2]
    assert templates.render_value({"a": "{{ ids[1] }}", "b": "plain"}, ctx) == {"a": 2, "b": "plain"}
    assert (
        templates.render_text("WHERE n = {{ name | sql }} AND d = {{ when | sql }}", ctx)
        == "WHERE n = 'O''Brien' AND d = DATE '2025-01-06'"
    )
    assert (
        templates.render_text("{{ [1, none, true, 'x'] | sql }} {{ 'a\"b' | ident }}", ctx)
        == '[1, NULL, TRUE, \'x\'] "a""b"'
    )
    assert templates.condition("{{ ids | length == 2 }}", ctx) is True
    assert templates.condition("ids | length > 5", ctx) is False


def test_the_seeds_time_travel_is_rewritten_outside_strings_only():
    sql = (
        "SELECT count(*) FROM sales FOR SYSTEM_TIME AS OF SNAPSHOT 5 WHERE note <> 'FOR SYSTEM_TIME AS OF 3';\n"
        "SELECT * FROM sales FOR SYSTEM_TIME AS OF '2025-01-06 10:00:00+00' s"
    )
    out, rewrites = sqltext.rewrite_time_travel(sql)
    assert out == (
        "SELECT count(*) FROM sales AT (VERSION => 5) WHERE note <> 'FOR SYSTEM_TIME AS OF 3';\n"
        "SELECT * FROM sales AT (TIMESTAMP => TIMESTAMPTZ '2025-01-06 10:00:00+00') s"
    )
    assert [r.before for r in rewrites] == [
        "FOR SYSTEM_TIME AS OF SNAPSHOT 5",
        "FOR SYSTEM_TIME AS OF '2025-01-06 10:00:00+00'",
    ]
    assert sqltext.rewrite_time_travel("SELECT 1 -- FOR SYSTEM_TIME AS OF SNAPSHOT 5") == (
        "SELECT 1 -- FOR SYSTEM_TIME AS OF SNAPSHOT 5",
        (),
    )


def test_primary_key_and_unique_are_refused_on_lake_tables_only():
    why = sqltext.unsupported_constraint("CREATE TABLE users (\n  id INTEGER PRIMARY KEY,\n  name VARCHAR);")
    assert why and "only NOT NULL" in why and "users" in why and "line 2" in why
    assert sqltext.unsupported_constraint("CREATE TABLE u (a INT, b INT, UNIQUE (a, b))")
    assert sqltext.unsupported_constraint("CREATE TABLE u (id INTEGER NOT NULL)") is None
    assert sqltext.unsupported_constraint("CREATE TABLE local.u (id INTEGER PRIMARY KEY)") is None
    assert sqltext.unsupported_constraint("SELECT 'PRIMARY KEY'") is None


def test_set_overrides_read_values_as_yaml():
    assert runner.parse_overrides(["ids=[1, 2]", "n=3", "name=eu-west", "empty="]) == {
        "ids": [1, 2],
        "n": 3,
        "name": "eu-west",
        "empty": "",
    }
    with pytest.raises(KitError, match="not name=value"):
        runner.parse_overrides(["no-equals"])


def test_a_lone_undefined_value_fails_instead_of_rendering_nothing():
    with pytest.raises(templates.TemplateError, match="has no attribute 'nope'"):
        templates.render_value("{{ row.nope }}", {"row": {"a": 1}})


def test_validate_on_the_command_line_is_one_line_and_exit_3_for_bad_input(cli, tmp_path):
    env = {"DUCKLAKE_HOME": str(tmp_path / "home")}  # validate asks no service
    good = cli(env, "steps", "validate", str(ROOT / "steps/ducklake_test_v2.yaml"))
    assert good.exit_code == 0, good.output
    assert "valid (v2 shape), playbook ducklake_test, 8 step(s) from 'start'" in good.output
    bad = write(tmp_path, GOOD.replace("    command: CREATE", "    comand: CREATE"))
    result = cli(env, "steps", "validate", str(bad))
    assert result.exit_code == 3
    assert result.output.strip().splitlines() == [
        f"Error: {bad}:6: unknown key 'comand' in workflow.0. Try: use one of: auth, catalog_connection, catalog_name, "
        "command, commands, create_catalog, data_path, desc, loop, memory_limit, next, on_error, params, step, "
        "threads, tool, transaction, use_catalog, vars (or check its indentation)."
    ]
    missing = cli(env, "steps", "run", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 3 and "no playbook file" in missing.output


def test_templates_cannot_reach_pythons_internals():
    with pytest.raises(templates.TemplateError, match="unsafe"):
        templates.render_text("{{ name.__class__.__mro__ }}", {"name": "x"})
    with pytest.raises(templates.TemplateError, match="unsafe"):
        templates.render_value("{{ name.__class__ }}", {"name": "x"})


def test_a_value_that_is_one_expression_keeps_its_type_and_text_stays_text():
    # Jinja's native mode re-read text as a Python literal: "007" became 7, "None" None, "True" True
    ctx = {"code": "007", "word": "None", "ids": [1, 2]}
    assert templates.render_value("{{ code }}", ctx) == "007" and templates.render_value("{{ word }}", ctx) == "None"
    assert (
        templates.render_value("{{ ids }}", ctx) == [1, 2] and templates.render_value("id-{{ code }}", ctx) == "id-007"
    )


def laughs(levels: int, refs: int) -> str:
    """`levels` anchors, each `refs` references to the one before: refs**levels nodes once expanded."""
    lines = ["workload:", "  l0: &l0 [lol]"]
    for i in range(1, levels + 1):
        lines.append(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * refs)}]")
    return "\n".join(lines) + "\nworkflow:\n  - step: only\n"


def test_aliases_that_expand_past_the_bound_are_refused_at_once(tmp_path):
    # 10**6 nodes: today's main builds them all and calls the file valid; 9 x 9 ("billion laughs", 9**9 nodes) grew
    # `steps validate` to 5.27 GB
    import time

    for levels, refs in ((6, 10), (9, 9)):
        start = time.perf_counter()
        error = error_of(tmp_path, laughs(levels, refs))
        assert time.perf_counter() - start < 2
        assert (
            error.what
            == f"{tmp_path / 'p.yaml'}: the YAML expands to more than 100,000 nodes once its aliases (*name) are expanded"
        )
    with pytest.raises(PlaybookError, match="expands to more than"):
        runner.parse_overrides(["x=" + laughs(9, 9)])  # --set values are YAML too
    recursive = error_of(tmp_path, "workload:\n  a: &a [1, *a]\nworkflow:\n  - step: only\n")
    assert "refers to a node that contains it" in recursive.what


def test_small_anchors_and_merge_keys_still_work(tmp_path):
    p = runner.load(
        write(
            tmp_path,
            """\
workload:
  ids: &ids [1, 2, 3]
  again: *ids
workflow:
  - step: make
    tool: ducklake
    <<: &tool {use_catalog: true}
    command: CREATE TABLE t (i INTEGER)
  - step: fill
    tool: ducklake
    <<: *tool
    loop: {collection: "{{ again }}", element: i}
    params: {i: "{{ i }}"}
    command: INSERT INTO t VALUES ($i)
""",
        )
    )
    assert p.workload == {"ids": [1, 2, 3], "again": [1, 2, 3]} and p.steps["fill"].catalog.use is True
    assert runner.parse_overrides(["x=[&a [1, 2], *a]"]) == {"x": [[1, 2], [1, 2]]}


INJECTION = """\
workload:
  who: nobody
workflow:
  - step: greet
    tool: ducklake
    command: "SELECT '{{ who }}' AS x"
"""


def test_a_value_pasted_into_sql_is_flagged_at_validate(cli, tmp_path):
    env = {"DUCKLAKE_HOME": str(tmp_path / "home")}
    path = write(tmp_path, INJECTION)
    result = cli(env, "steps", "validate", str(path), "--set", "who=x' AS x; DROP TABLE victim; SELECT 'y")
    assert result.exit_code == 0, result.output
    assert (
        f"warning: {path}:6: step 'greet', command 0 pastes {{{{ who }}}} into its SQL as it is: write "
        "{{ who | sql }} for a quoted literal, or bind it as a parameter (params: and $name in the SQL)"
        in result.output
    )
    quoted = write(tmp_path, INJECTION.replace("'{{ who }}'", "{{ who | sql }}"))
    assert "warning" not in cli(env, "steps", "validate", str(quoted)).output
    assert all(runner.paste_warnings(runner.load(p)) == [] for p in SHIPPED)


@pytest.mark.parametrize(
    "template, value, why",
    [
        ("SELECT '{{ v }}' AS x", "x' AS x; DROP TABLE victim; SELECT 'y", "breaks out of its quoted literal"),
        ("SELECT '{{ v }}' AS x", "O'Brien", "opens a quote that never ends"),
        ('SELECT "{{ v }}" FROM t', 'a" FROM t; DROP TABLE victim; SELECT "b', "breaks out of its quoted literal"),
        ("SELECT * FROM t WHERE id = {{ v }}", "1; DROP TABLE victim", "adds `;` to the statement"),
        ("SELECT * FROM t WHERE id = {{ v }}", "1 OR 1 = 1", "adds `OR` to the statement"),
        ("SELECT * FROM t WHERE id = {{ v }} AND tenant = 7", "1 --", "changes the SQL around it"),
        ("SELECT 1 -- {{ v }}\n, 2", "note\nDROP TABLE victim", "breaks out of its comment"),
        (
            "{% set q %}'{{ v }}'{% endset %}SELECT {{ q }}",
            "x'; DROP TABLE victim; --",
            "breaks out of its quoted literal",
        ),
    ],
)
def test_a_value_that_changes_the_statement_is_refused(template, value, why):
    refused = sqltext.pasted_values_refused(templates.render_sql(template, {"v": value}))
    assert refused is not None and why in refused and "{{ value | sql }}" in refused


@pytest.mark.parametrize(
    "template, value, sql",
    [
        (
            "INSERT INTO e VALUES ({{ v }}, 'x')",
            42,
            "INSERT INTO e VALUES (42, 'x')",
        ),  # NoETL's fixtures paste {{ user_id }}
        ("INSERT INTO e VALUES ({{ v }}, 'x')", "42", "INSERT INTO e VALUES (42, 'x')"),
        ("SELECT '{{ v }}' AS x", "hello; world -- it is /* fine */", "SELECT 'hello; world -- it is /* fine */' AS x"),
        ("SELECT 't_{{ v }}', '{{ v }}'", "", "SELECT 't_', ''"),
        ("SELECT * FROM {{ v }}", "steps_tests.t", "SELECT * FROM steps_tests.t"),
        ("SELECT {{ v }}", [1, -2], "SELECT [1, -2]"),
        ("SELECT {{ v | sql }}, {{ v | ident }}", 'it\'s "x"', 'SELECT \'it\'\'s "x"\', "it\'s ""x"""'),
        ("SELECT 1 -- {{ v }}\n", "a note", "SELECT 1 -- a note\n"),
        (
            "{% for i in v %}INSERT INTO e VALUES ({{ i }});{% endfor %}",
            [1, 2],
            "INSERT INTO e VALUES (1);INSERT INTO e VALUES (2);",
        ),
    ],
)
def test_numbers_and_values_that_stay_in_their_literal_run_as_pasted(template, value, sql):
    rendered = templates.render_sql(template, {"v": value})
    assert rendered.text == sql and sqltext.pasted_values_refused(rendered) is None


def test_a_command_past_the_size_limit_is_refused_while_rendering():
    import time

    start = time.perf_counter()
    with pytest.raises(templates.TemplateError, match=r"`\*` makes more than 16 MiB"):
        templates.render_sql("SELECT '{{ 'a' * 100000000 }}'", {})
    with pytest.raises(templates.TemplateError, match="the command renders to more than 16 MiB"):
        templates.render_sql("SELECT 1{% for i in range(100000) %}, '{{ big }}'{% endfor %}", {"big": "b" * 1000})
    assert time.perf_counter() - start < 2  # stopped at the limit, not after building 100 MB
    assert templates.MAX_SQL_BYTES == 16 * 2**20


@pytest.mark.parametrize(
    "command, words",
    [
        ("ATTACH '/tmp/x.duckdb' AS evil", "ATTACH is refused in a step"),
        ("USE memory; DETACH lake", "USE memory is refused in a step"),
        ("DETACH DATABASE IF EXISTS lake", "DETACH is refused in a step"),
        ("USE other.main", "USE other is refused in a step"),
        ("SET threads = 8", "SET threads is refused in a step: it is a setting of the whole worker"),
        ("SET GLOBAL enable_progress_bar = true", "SET enable_progress_bar is refused"),
        ("RESET memory_limit", "RESET memory_limit is refused"),
        ("SET search_path = 'memory.main'", "SET search_path is refused"),
    ],
)
def test_what_would_change_the_workers_connection_is_refused_at_its_line(tmp_path, command, words):
    error = error_of(tmp_path, GOOD.replace("command: CREATE TABLE t (i INTEGER)", f'command: "SELECT 1; {command}"'))
    assert error.line_no == 6 and f"step 'make', command 0: {words}" in error.what


def test_a_declared_catalog_variables_and_the_connections_own_settings_are_allowed(tmp_path):
    ok = GOOD.replace(
        "command: CREATE TABLE t (i INTEGER)",
        "catalog_name: analytics\n    commands:\n"
        "      - USE analytics\n      - USE lake.main\n      - USE local\n      - USE marts\n"
        "      - SET VARIABLE seen = 1\n      - SET enable_progress_bar = false\n      - BEGIN\n      - COMMIT",
    )
    assert runner.load(write(tmp_path, ok)).steps["make"].commands[0] == "USE analytics"
