"""NoETL's own playbooks (tests/steps/noetl/, unmodified) through `steps validate`, no services: each maps onto the
kit's model as its YAML says (compared with the YAML read independently), or is refused in one line naming the one
tool kind (or tool list) the kit does not run; and canonical v10 read as NoETL defines it, typos still errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ducklake_kit.steps import checks, model, noetl, schema
from ducklake_kit.steps.schema import PlaybookError

HERE = Path(__file__).resolve().parent / "noetl"
FILES = sorted(HERE.glob("*.yaml"))
# files that name `{{ catalog_connection }}` and never define it (NoETL's run passes it in): given as --set would
SET = {"catalog_connection": "postgresql://example/catalog"}

# the one refusal each file gets: (what, step); what is a tool kind, or "list" for a tool given as several tasks
REFUSED = {
    "e2e_load_test__tooling_non_blocking__tooling_non_blocking.yaml": ("snowflake", "run_snowflake_probe"),
    "e2e_test_gke_lifecycle__test_gke_lifecycle.yaml": ("shell", "start"),
    **{p.name: ("snowflake", "create_sf_database") for p in FILES if "http_to_databases" in p.name},
}


def _expected_kind(raw: dict) -> str | None:
    tool = raw.get("tool", raw.get("type"))
    if isinstance(tool, list) and len(tool) > 1:
        return model.TASKS  # NoETL's tool pipeline: each task checked below
    if isinstance(tool, list):
        tool = tool[0]
    return tool.get("kind") if isinstance(tool, dict) else tool


def _expected_rules(raw: dict) -> list[tuple[str | None, str]]:
    tool = raw.get("tool")
    if isinstance(tool, list) and len(tool) > 1:
        return []  # a pipeline's rules are its tasks'
    tool = tool[0] if isinstance(tool, list) else tool
    policy = ((tool.get("spec") or {}).get("policy") or {}) if isinstance(tool, dict) else {}
    return [(r.get("when"), (r.get("then") or r.get("else", {}).get("then"))["do"]) for r in policy.get("rules", [])]


def _expected_loop(raw: dict) -> tuple[str, str] | None:
    loop = raw.get("loop")
    if loop is None:
        return None
    mode = (loop.get("spec") or {}).get("mode") or loop.get("mode") or "sequential"
    return loop.get("iterator") or loop.get("element"), {"parallel": "async", "cursor": "async"}.get(mode, mode)


def _expected_targets(raw: dict) -> list[str]:
    nxt = raw.get("next")
    if nxt is None:
        return []
    items = nxt["arcs"] if isinstance(nxt, dict) else nxt
    return [t["step"] for item in items for t in ([item] if "step" in item else item.get("then") or item["else"])]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_noetl_playbook_maps_as_written_or_is_refused_for_one_kind(path):
    doc = yaml.safe_load(path.read_text())
    if path.name in REFUSED:
        what, step = REFUSED[path.name]
        with pytest.raises(PlaybookError) as info:
            checks.load(path, SET)
        error = info.value
        said = "gives its tool as a list of" if what == "list" else f"uses tool kind '{what}', which the kit's"
        assert f"step '{step}' {said}" in error.what, error.what
        assert len(error.line().splitlines()) == 1 and error.line_no
        raw = next(s for s in doc["workflow"] if s["step"] == step)
        assert what == "list" or _expected_kind(raw) == what
        return
    playbook = checks.load(path, SET)
    assert list(playbook.steps) == [s["step"] for s in doc["workflow"]]
    for raw in doc["workflow"]:
        step = playbook.steps[raw["step"]]
        assert step.tool == _expected_kind(raw), step.name
        assert step.tool is None or step.tool in (*model.KINDS, model.TASKS)
        if step.tool == model.TASKS:  # each task as its own tool, in order, named by its label
            assert [(t.name, t.tool) for t in step.tasks] == [(t["name"], t["kind"]) for t in raw["tool"]]
            for task, t in zip(step.tasks, raw["tool"]):
                assert [(r.when, r.do) for r in (task.policy.rules if task.policy else [])] == _expected_rules(
                    {"tool": t}
                )
        assert [(r.when, r.do) for r in (step.policy.rules if step.policy else [])] == _expected_rules(raw)
        assert ((step.loop.iterator, step.loop.mode) if step.loop else None) == _expected_loop(raw), step.name
        targets = sorted(t for t, _ in step.next.targets()) if step.next else []
        assert targets == sorted(_expected_targets(raw)), step.name


def _fixture_names(part: str) -> list[Path]:
    return [p for p in FILES if part in p.name]


def test_every_version_of_the_two_ducklake_fixtures_validates_or_is_refused_only_for_a_kind():
    # the Done-when: every version of ducklake_test and http_to_databases
    versions = _fixture_names("ducklake_test") + _fixture_names("http_to_databases")
    valid = 0
    for path in versions:
        try:
            checks.load(path, SET)
            valid += 1
        except PlaybookError as exc:
            assert "uses tool kind 'snowflake'" in exc.what, exc.what
    assert (len(versions), valid) == (20, 6)


def test_the_current_ducklake_test_maps_its_policies_sets_and_parallel_loop():
    p = checks.load(HERE / "e2e_ducklake_test.yaml", SET)
    assert p.shape == "v2" and p.start == "start"
    assert [s.tool for s in p.steps.values()] == ["python"] + ["postgres"] * 2 + ["ducklake"] * 6 + ["python"]
    loop = p.steps["loop_insert_events"].loop
    assert (loop.collection, loop.iterator, loop.mode, loop.line) == ("{{ user_ids }}", "user_id", "async", 130)
    [rule] = p.steps["get_catalog_info"].policy.rules
    assert (rule.when, rule.do, rule.line) == (None, "continue", 191)
    assert rule.set == {
        "ctx.snapshot_count": "{{ get_catalog_info.data[0] | length }}",
        "ctx.table_count": "{{ get_catalog_info.data[1] | length }}",
    }
    db = p.steps["create_catalog_db"]
    assert db.config == {"auth": "noetl_connection", "command": db.commands[0]} and db.command_lines == [40]
    assert [(b.steps, b.when) for b in db.next.branches] == [
        (["create_db_sql"], "{{ create_catalog_db.data | length == 0 }}"),
        (["create_users_table"], "{{ create_catalog_db.data | length > 0 }}"),
    ]
    assert p.steps["create_users_table"].catalog.connection == "{{ catalog_connection }}"


def test_an_undefined_name_in_a_real_playbook_is_still_an_error_without_set():
    with pytest.raises(PlaybookError) as info:
        checks.load(HERE / "e2e_ducklake_test.yaml")
    assert info.value.line_no == 69 and "uses {{ catalog_connection }}, which is not defined" in info.value.what


def test_february_2026s_set_ctx_is_read_as_set():
    p = checks.load(HERE / "noetl_2026-02-05_efacd51f_ducklake_test__playbook.yaml", SET)
    assert p.steps["query_users"].policy.rules[0].set == {"ctx.user_count": "{{ query_users.data | length }}"}


V10 = """\
apiVersion: noetl.io/v2
kind: Playbook
metadata:
  name: v10
  labels: {team: data}
  tags: [demo]
workload:
  ids: [1, 2, 3]
  width: 2
keychain:
  - name: pg
    kind: credential
    credential: pg_local
executor:
  profile: distributed
workbook:
  - name: ping
    tool: {kind: http, method: GET, url: "http://127.0.0.1:9/ping"}
workflow:
  - step: start
    set:
      ctx.seen: 0
    tool:
      kind: postgres
      auth: pg
      command: SELECT 1 AS one
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: retry, attempts: 3, backoff: exponential, delay: 0.5}
            - when: "{{ output.data | length == 0 }}"
              then: {do: jump, to: done}
            - else:
                then: {do: continue, set: {ctx.rows: "{{ output.data | length }}"}}
    next:
      spec: {mode: exclusive, on_no_match: quiet}
      arcs:
        - step: fan
          when: "{{ ctx.rows > 0 }}"
          set: {ctx.went: fan}
        - step: done
  - step: fan
    spec:
      policy:
        admit:
          rules:
            - when: "{{ ctx.went == 'fan' }}"
              then: {allow: true}
            - else:
                then: {allow: false}
    loop:
      in: "{{ ids }}"
      iterator: id
      spec: {mode: parallel, max_in_flight: "{{ width }}"}
    tool:
      kind: python
      input: {n: "{{ iter.id }}"}
      code: |
        result = {"n": n, "seen": ctx.get("seen")}
    next:
      arcs:
        - step: call
  - step: call
    tool: {kind: workbook, name: ping}
    next:
      arcs: [{step: done}]
  - step: done
    tool: {kind: noop}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


def test_canonical_v10_maps_onto_the_model(tmp_path):
    p = checks.load(write(tmp_path, V10))
    assert p.labels == {"team": "data", "tags": ["demo"]} and p.executor == {"profile": "distributed"}
    assert p.keychain == [{"name": "pg", "kind": "credential", "credential": "pg_local"}]
    assert p.workbook["ping"].tool == "http" and p.workbook["ping"].config["url"] == "http://127.0.0.1:9/ping"
    start = p.steps["start"]
    assert start.set == {"ctx.seen": 0} and start.commands == ["SELECT 1 AS one"]
    retry, jump, orelse = start.policy.rules
    assert (retry.do, retry.attempts, retry.backoff, retry.delay, retry.line) == ("retry", 3, "exponential", 0.5, 30)
    assert (jump.do, jump.to) == ("jump", "done")
    assert (orelse.when, orelse.set) == (None, {"ctx.rows": "{{ output.data | length }}"})
    assert start.next.on_no_match == "quiet" and start.next.branches[0].set == {"ctx.went": "fan"}
    fan = p.steps["fan"]
    assert fan.admit.rules == [("{{ ctx.went == 'fan' }}", True, 48), (None, False, 50)]
    assert (fan.loop.mode, fan.loop.max_in_flight, fan.input) == ("async", "{{ width }}", {"n": "{{ iter.id }}"})
    assert fan.config == {"code": 'result = {"n": n, "seen": ctx.get("seen")}\n'}
    assert (p.steps["call"].tool, p.steps["call"].config) == ("workbook", {"name": "ping"})
    assert p.steps["done"].tool == "noop" and noetl.order(p) == ["start", "fan", "call", "done"]


CURSOR = V10.replace(
    '      in: "{{ ids }}"\n',
    "      cursor: {kind: postgres, auth: pg, claim: UPDATE q SET taken = true RETURNING id}\n",
).replace("mode: parallel", "mode: cursor")


def test_a_cursor_loop_maps_with_its_claim(tmp_path):
    loop = checks.load(write(tmp_path, CURSOR)).steps["fan"].loop
    assert loop.collection is None and loop.cursor["claim"].startswith("UPDATE q") and loop.mode == "async"


@pytest.mark.parametrize(
    "old, new, line, words",
    [
        ("      command: SELECT 1", "      comand: SELECT 1", 26, "unknown key 'comand' in workflow.0.tool"),
        ("{do: jump, to: done}", "{do: jump, to: nowhere}", 32, "jumps to 'nowhere', which is not a step"),
        ("{do: jump, to: done}", "{do: jump}", 32, "a `do: jump` rule without `to:`"),
        ("{do: retry, attempts: 3", "{do: retyr, attempts: 3", 31, "'retyr' is not one of"),
        ("{ctx.went: fan}", "{ctx.wnet: fan}", 48, "reads {{ ctx.went }}, but nothing sets ctx.went"),
        ("name: ping}", "name: pong}", 65, "names workbook task 'pong'"),
        ("kind: noop}", "kind: snowflake, bogus: 1}", 69, "step 'done' uses tool kind 'snowflake'"),
        ("mode: parallel,", "mode: paralel,", 55, "(NoETL's playbook schema)"),
        ("      iterator: id\n", "", 52, "'iterator' is a required property"),
        ("            - else:\n                then: {allow: false}\n", "", None, None),
        ("then: {allow: true}", "then: {allow: true}\n            - when: x\n", 50, "a rule without `then:`"),
        ("  - step: fan\n    spec:", "  - step: fan\n    bogus: 1\n    spec:", 44, "unknown key 'bogus' in workflow.1"),
        ("keychain:", "keychian:", 10, "unknown key 'keychian'"),
        (
            "  - step: call\n    tool:",
            "  - step: call\n    when: '{{ ctx.rows }}'\n    tool:",
            65,
            "(NoETL's canonical v10 admits a step",
        ),
        ("kind: python", "kind: pyhton", 57, "step 'fan' uses tool kind 'pyhton', which neither NoETL nor the kit"),
        ("      ctx.seen: 0", "      ctx.seen: '{{ iter.id }}'", 21, "reads {{ iter }}, but it has no loop"),
        ("profile: distributed", "profile: everywhere", 15, "(NoETL's playbook schema)"),
    ],
)
def test_v10_mistakes_are_one_line_at_their_line(tmp_path, old, new, line, words):
    assert old in V10
    path = write(tmp_path, V10.replace(old, new))
    if words is None:  # a change that stays valid
        checks.load(path)
        return
    with pytest.raises(PlaybookError) as info:
        checks.load(path)
    assert info.value.line_no == line and words in info.value.what, info.value.line()
    assert len(info.value.line().splitlines()) == 1


def test_the_vendored_schema_is_noetls_canonical_v10():
    import json

    root = json.loads(schema.NOETL_SCHEMA.read_text())
    assert root["title"] == "NoETL Playbook (canonical v10)" and "ToolSpec" in root["$defs"]
    # every kind the kit runs is one NoETL defines
    assert set(model.KINDS) <= set(root["$defs"]["ToolSpec"]["properties"]["kind"]["enum"])


def test_an_upsert_into_a_lake_table_is_refused_at_validate_with_its_merge(tmp_path):
    text = """\
workflow:
  - step: upsert
    tool:
      kind: ducklake
      command: |
        INSERT INTO users (id, name) VALUES (1, 'a')
        ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name
"""
    with pytest.raises(PlaybookError) as info:
        checks.load(write(tmp_path, text))
    assert info.value.line_no == 5 and "step 'upsert', command 0: INSERT ... ON CONFLICT" in info.value.what
    assert "MERGE INTO users" in info.value.what
    pg = text.replace("kind: ducklake", "kind: postgres\n      auth: pg")  # PostgreSQL has keys: fine there
    assert checks.load(write(tmp_path, pg)).steps["upsert"].tool == "postgres"


def test_older_flat_steps_of_other_kinds_map_their_keys(tmp_path):
    text = """\
workflow:
  - step: get
    type: http
    method: GET
    url: http://127.0.0.1:9/x
    next: [{step: shape}]
  - step: shape
    tool: python
    code: "def main(input_data): return input_data"
    data: {rows: "{{ get.data }}"}
"""
    p = checks.load(write(tmp_path, text))
    assert (p.steps["get"].tool, p.steps["get"].config) == ("http", {"method": "GET", "url": "http://127.0.0.1:9/x"})
    assert p.steps["shape"].config["data"] == {"rows": "{{ get.data }}"} and p.shape == "v1"
    with pytest.raises(PlaybookError, match="step 'x' uses tool kind 'iterator'") as info:
        checks.load(write(tmp_path, "workflow:\n  - step: x\n    type: iterator\n    collection: []\n"))
    assert info.value.line_no == 3 and "a step with `loop: {in, iterator}`" in info.value.line()


def test_older_v2_spellings_and_a_step_reached_only_by_a_jump(tmp_path):
    text = """\
workload: {ids: [1, 2]}
workflow:
  - step: start
    loop: {in: "{{ ids }}", iterator: i, mode: parallel}
    tool:
      kind: duckdb
      query: SELECT {{ i }}
      spec:
        policy:
          rules:
            - when: "{{ output.status == 'error' }}"
              then: {do: jump, to: recover}
    next:
      - step: done
        when: "{{ start.status == 'ok' }}"
  - step: recover
    tool: {kind: noop}
    next: [{step: done}]
  - step: done
"""
    p = checks.load(write(tmp_path, text))
    start = p.steps["start"]
    assert (start.loop.mode, start.commands, start.command_lines) == ("async", ["SELECT {{ i }}"], [7])
    assert [(b.steps, b.when) for b in start.next.branches] == [(["done"], "{{ start.status == 'ok' }}")]
    assert p.steps["recover"].tool == "noop"  # reached only by the jump: not "no route reaches step 'recover'"


def test_past_its_snowflake_steps_http_to_databases_says_only_what_the_kit_would_refuse(monkeypatch):
    # What a user who deleted the snowflake steps would meet next, the checks pinned one by one: the kit's route check
    # (NoETL's `cleanup` step is reached by no arc since November 2025) and the upsert into a lake table (with its
    # MERGE INTO); iterator versions are refused for that kind. Nothing else in any version is unread.
    monkeypatch.setattr(model, "KINDS", (*model.KINDS, "snowflake"))
    monkeypatch.setitem(schema.KIND_KEYS, "snowflake", {"auth": {}, "command": {}, "query": {}})
    monkeypatch.setitem(schema.FLAT_KEYS, "snowflake", schema.KIND_KEYS["snowflake"])
    said = set()
    for path in _fixture_names("http_to_databases"):
        for skip in ((), ("check_routes",), ("check_routes", "check_upserts")):
            with monkeypatch.context() as m:
                for name in skip:
                    m.setattr(noetl if name == "check_routes" else checks, name, lambda p: None)
                try:
                    checks.load(path, SET)
                except PlaybookError as exc:
                    said.add(exc.what.split(": ", 1)[1][:60])
    assert said == {
        "step 'insert_to_postgres' uses tool kind 'iterator', which t",
        "no route reaches step 'cleanup' from 'start': in a playbook ",
        "step 'insert_to_ducklake', command 0: INSERT ... ON CONFLICT",  # ... with its MERGE INTO
    }


def test_validate_on_the_command_line_reads_a_real_playbook_and_refuses_another_in_one_line(cli, tmp_path):
    env = {"DUCKLAKE_HOME": str(tmp_path / "home")}  # validate asks no service
    ducklake = HERE / "e2e_ducklake_test.yaml"
    good = cli(env, "steps", "validate", str(ducklake), "--set", "catalog_connection=postgresql://example/catalog")
    assert good.exit_code == 0 and "playbook ducklake_test, 10 step(s) from 'start'" in good.output, good.output
    http = HERE / "e2e_http_to_databases.yaml"
    bad = cli(env, "steps", "validate", str(http))
    assert bad.exit_code == 3
    assert bad.output.strip().splitlines() == [
        f"Error: {http}:45: step 'create_sf_database' uses tool kind 'snowflake', which the kit's step runner does "
        "not run. Try: run it with NoETL, or remove the step."
    ]


WORKBOOK = """\
workload: {ids: [1, 2]}
workbook:
  - name: add
    tool:
      kind: ducklake
      command: INSERT INTO t VALUES ({{ id | sql }})
workflow:
  - step: start
    loop: {in: "{{ ids }}", iterator: id}
    tool: {kind: workbook, name: add}
"""


def test_a_workbook_task_is_checked_as_the_step_that_runs_it(tmp_path):
    p = checks.load(write(tmp_path, WORKBOOK))  # {{ id }} is the calling step's loop element
    assert p.workbook["add"].commands == ["INSERT INTO t VALUES ({{ id | sql }})"]
    upsert = WORKBOOK.replace("VALUES ({{ id | sql }})", "VALUES ({{ id | sql }}) ON CONFLICT DO NOTHING")
    with pytest.raises(PlaybookError, match="step 'add', command 0: INSERT ... ON CONFLICT") as info:
        checks.load(write(tmp_path, upsert))
    assert info.value.line_no == 6
    with pytest.raises(PlaybookError, match=r"step 'add' uses \{\{ idd \}\}") as info:
        checks.load(write(tmp_path, WORKBOOK.replace("{{ id | sql }}", "{{ idd | sql }}")))
