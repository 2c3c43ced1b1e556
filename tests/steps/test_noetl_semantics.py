"""NoETL's policy rules on the real worker plane: a retry after a real transient commit failure lands the step's rows
exactly once (0 lost, 0 duplicated: counted in the lake), a retry that could land a change twice is refused, and
`set:`/`ctx`, `{{ step.data }}`, `continue`, `fail` and `admit` do what NoETL says, on playbooks in its v10 shape.

The failure is real: `retries.set_test_hooks(conflicts=1, disabled=True)` on each worker makes the next commit of a
step's writes lose to another commit made after its transaction began (DuckLake's own retries off for it), with the
worker's own retry of failed commits off, so only the policy can save the step."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.lake import Lake
from ducklake_kit.steps import retries, runner
from ducklake_kit.steps.results import PlaybookRun
from ducklake_kit.workers import WorkerPlane, plane

S = "steps_policy"


@pytest.fixture(scope="module")
def lake(stack):
    """One connection for the module's own reads and writes (each statement reads the newest snapshot): a Lake per
    call attached the lake again each time."""
    with Lake(stack.platform.endpoints()) as lk:
        yield lk


@pytest.fixture(scope="module")
def wp(stack, lake):
    ep = stack.platform.endpoints()
    status = plane.up(stack.state, ep, 2)
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE; CREATE SCHEMA {S}")
    with WorkerPlane(status.address, ep) as p:
        yield p
        p.client.run(retries.set_test_hooks)  # the hooks off again on every worker
    lake.run(f"DROP SCHEMA IF EXISTS {S} CASCADE")


def _table(lake: Lake, name: str) -> None:
    lake.run(f"CREATE OR REPLACE TABLE {S}.{name} (id INTEGER)")


def _run(stack, wp, tmp_path: Path, body: str, overrides: dict | None = None) -> PlaybookRun:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(body))
    return runner.run(runner.load(path, overrides), wp, stack.home, overrides=overrides)


def _why(run: PlaybookRun) -> list[tuple[str, str, list[str]]]:
    return [(s.step, s.error.line(), s.policy) for s in run.steps if s.error]


def _count(lake: Lake, table: str) -> list[tuple]:
    return lake.con.execute(f"SELECT id, count(*) FROM {S}.{table} GROUP BY id ORDER BY id").fetchall()


WRITE = """\
    apiVersion: noetl.io/v2
    kind: Playbook
    metadata: {name: policy_retry}
    workflow:
      - step: write
        tool:
          kind: ducklake
          transaction: TRANSACTION
          command: "INSERT INTO steps_policy.NAME VALUES (1), (2), (3); INSERT INTO steps_policy.NAME VALUES (4)"
          spec:
            policy:
              rules:
                - when: "{{ output.status == 'error' }}"
                  then: {do: retry, attempts: 3, delay: 0.05}
    """


def test_a_retry_rule_lands_a_transaction_once_after_a_transient_conflict(stack, wp, lake, tmp_path):
    _table(lake, "once")
    wp.client.run(retries.set_test_hooks, conflicts=1, disabled=True)
    run = _run(stack, wp, tmp_path, WRITE.replace("NAME", "once").replace("TRANSACTION", "true"))
    step = next(s for s in run.steps if s.step == "write")
    assert run.ok, _why(run)
    # it did fail, for real (once per worker it reached: each worker's hook breaks its next commit), and the lake
    # said each failed attempt committed nothing before it was tried again
    assert 1 <= len(step.attempt.tries) <= 2, step.attempt.tries
    assert all("did not land" in t and "nothing of it committed" in t for t in step.attempt.tries)
    assert any("retry 2 of 3" in p for p in step.policy)
    assert _count(lake, "once") == [(1, 1), (2, 1), (3, 1), (4, 1)]  # 0 lost, 0 duplicated


def test_without_the_policy_the_same_conflict_fails_the_step_and_commits_nothing(stack, wp, lake, tmp_path):
    _table(lake, "none")
    wp.client.run(retries.set_test_hooks, conflicts=1, disabled=True)
    body = WRITE.replace("NAME", "none").replace("TRANSACTION", "true").split("          spec:")[0]
    run = _run(stack, wp, tmp_path, body)
    assert not run.ok
    assert _count(lake, "none") == []  # the conflict was real: the transaction committed nothing
    wp.client.run(retries.set_test_hooks)


def test_statements_that_autocommit_one_by_one_are_not_retried_by_a_policy(stack, wp, lake, tmp_path):
    _table(lake, "auto")
    wp.client.run(retries.set_test_hooks, conflicts=1, disabled=True)
    run = _run(stack, wp, tmp_path, WRITE.replace("NAME", "auto").replace("TRANSACTION", "false"))
    step = next(s for s in run.steps if s.step == "write")
    assert not run.ok
    assert any("not retried" in p and "autocommit one by one" in p for p in step.policy)
    rows = _count(lake, "auto")
    assert all(n == 1 for _, n in rows)  # whatever committed, committed once
    wp.client.run(retries.set_test_hooks)


def test_set_ctx_step_data_continue_fail_and_admit(stack, wp, tmp_path):
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: policy_ctx}
        workload: {enabled: false, limit: 2}
        workflow:
          - step: start
            tool:
              kind: ducklake
              command: "SELECT range AS id FROM range(5)"
              spec:
                policy:
                  rules:
                    - else:
                        then:
                          do: continue
                          set: {ctx.seen: "{{ start.data | length }}", ctx.first: "{{ output.data[0].id }}"}
            next:
              arcs:
                - step: tolerated
                  when: "{{ ctx.seen > limit }}"
                  set: {ctx.route: big}
          - step: tolerated
            tool:
              kind: python
              code: |
                raise ValueError("expected")
              spec:
                policy:
                  rules:
                    - when: "{{ output.status == 'error' }}"
                      then: {do: continue, set: {ctx.error_seen: "{{ output.error }}"}}
            next: {arcs: [{step: gated}]}
          - step: gated
            spec:
              policy:
                admit:
                  rules:
                    - when: "{{ ctx.enabled }}"
                      then: {allow: true}
                    - else:
                        then: {allow: false}
            tool: {kind: noop}
            next: {arcs: [{step: refused}]}
          - step: refused
            tool:
              kind: python
              code: |
                result = {"n": 1}
              spec:
                policy:
                  rules:
                    - when: "{{ output.data.n == 1 }}"
                      then: {do: fail}
        """
    run = _run(stack, wp, tmp_path, body)
    steps = {s.step: s for s in run.steps}
    assert run.ctx == {"seen": 5, "first": 0, "route": "big", "error_seen": "ValueError: expected"}
    assert steps["tolerated"].status == "ok" and any("continued past its error" in p for p in steps["tolerated"].policy)
    assert steps["gated"].status == "skipped" and "admit rule" in steps["gated"].reason
    assert steps["refused"].status == "skipped"  # not reached: the admit skipped the step that leads to it
    assert run.ok, run.as_dict()  # none failed: the python error was continued past, the admit only skipped


def test_an_else_rule_never_hides_a_failure(stack, wp, tmp_path):
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: policy_else}
        workflow:
          - step: broken
            tool:
              kind: ducklake
              command: "SELECT * FROM steps_policy.no_such_table"
              spec:
                policy:
                  rules:
                    - else:
                        then: {do: continue, set: {ctx.n: "{{ broken.data | length }}"}}
        """
    run = _run(stack, wp, tmp_path, body)
    step = run.steps[0]
    assert not run.ok and step.status == "error"
    assert "no_such_table" in step.error.line()
    assert any("`else` rule not applied: the task failed" in p for p in step.policy)
    assert run.ctx == {}


def test_a_sub_playbook_runs_with_its_inputs_and_returns_its_steps_data(stack, wp, lake, tmp_path):
    _table(lake, "sub")
    (tmp_path / "child").mkdir()
    (tmp_path / "child" / "playbook.yaml").write_text(
        textwrap.dedent(
            """\
            apiVersion: noetl.io/v2
            kind: Playbook
            metadata: {name: child}
            workload: {ids: []}
            workflow:
              - step: start
                loop: {in: "{{ ids }}", iterator: id, spec: {mode: parallel}}
                tool: {kind: ducklake, command: "INSERT INTO steps_policy.sub VALUES ({{ id | sql }})"}
                next: {arcs: [{step: total}]}
              - step: total
                tool: {kind: ducklake, command: "SELECT count(*) AS n, sum(id) AS s FROM steps_policy.sub"}
            """
        )
    )
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: parent}
        workload: {wanted: [1, 2, 3]}
        workflow:
          - step: start
            tool: {kind: playbook, path: child, return_step: total, input: {ids: "{{ wanted }}"}}
            next: {arcs: [{step: check, when: "{{ start.data[0].n == 3 }}"}]}
          - step: check
            tool: {kind: python, code: "result = {'ok': True}"}
        """
    run = _run(stack, wp, tmp_path, body)
    steps = {s.step: s for s in run.steps}
    assert run.ok, _why(run)
    assert steps["start"].data == [{"n": 3, "s": 6}]
    assert steps["check"].status == "ok"  # the route read the sub-playbook's data
    assert _count(lake, "sub") == [(1, 1), (2, 1), (3, 1)]
    assert steps["start"].attempt.details["execution_id"] != run.execution_id
    lost = _run(stack, wp, tmp_path, body.replace("path: child, return_step: total", "path: nowhere"))
    assert not lost.ok and "no playbook at nowhere" in lost.steps[0].error.line()


def test_a_cursor_loop_claims_rows_until_none_is_left_each_landing_once(stack, wp, lake, tmp_path):
    import psycopg

    _table(lake, "cur")
    pg = stack.platform.endpoints().pg
    with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
        con.execute("DROP DATABASE IF EXISTS steps_tasks WITH (FORCE)")
        con.execute("CREATE DATABASE steps_tasks")
    with psycopg.connect(pg.libpq("steps_tasks"), autocommit=True) as con:
        con.execute("CREATE TABLE tasks (id int PRIMARY KEY, status text)")
        con.execute("INSERT INTO tasks SELECT g, 'pending' FROM generate_series(1, 6) g")
    creds = stack.home / "steps-credentials.json"
    before = creds.read_text() if creds.exists() else None
    creds.write_text(
        json.dumps({"pg_tasks": {"connection": f"postgresql://{pg.user}@{pg.host}:{pg.port}/steps_tasks"}})
    )
    creds.chmod(0o600)
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: cursor}
        workflow:
          - step: start
            loop:
              cursor:
                kind: postgres
                auth: pg_tasks
                claim: |
                  UPDATE tasks SET status = 'claimed'
                  WHERE id = (SELECT id FROM tasks WHERE status = 'pending' ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1)
                  RETURNING id;
              iterator: task
              spec: {mode: cursor, max_in_flight: 4}
            tool: {kind: ducklake, command: "INSERT INTO steps_policy.cur VALUES ({{ task.id | sql }})"}
        """
    try:
        run = _run(stack, wp, tmp_path, body)
        assert run.ok, _why(run)
        assert [it.element for it in run.steps[0].iterations] == [{"id": i} for i in range(1, 7)]
        assert _count(lake, "cur") == [(i, 1) for i in range(1, 7)]  # each claimed row landed once
        with psycopg.connect(pg.libpq("steps_tasks"), autocommit=True) as con:
            assert con.execute("SELECT count(*) FROM tasks WHERE status = 'pending'").fetchone() == (0,)
    finally:
        creds.unlink() if before is None else creds.write_text(before)
        with psycopg.connect(pg.libpq("postgres"), autocommit=True) as con:
            con.execute("DROP DATABASE IF EXISTS steps_tasks WITH (FORCE)")


def test_a_tool_pipeline_runs_its_tasks_in_order_with_jumps_for_pages(stack, wp, lake, tmp_path):
    _table(lake, "pages")
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: pipeline}
        workflow:
          - step: start
            tool:
              - name: page
                kind: python
                libs: {dt: {from: datetime, import: date}}
                input: {n: "{{ iter.page | default(1) }}"}
                code: |
                  result = {"page": n, "more": n < 3, "year": dt(2026, 1, 1).year}
                spec:
                  policy:
                    rules:
                      - when: "{{ output.data.more }}"
                        then: {do: jump, to: page, set: {iter.page: "{{ output.data.page + 1 }}", ctx.pages: "{{ output.data.page }}"}}
                      - else: {then: {do: continue}}
              - name: store
                kind: ducklake
                command: "INSERT INTO steps_policy.pages VALUES ({{ page.page | sql }}), ({{ page.year | sql }})"
            next: {arcs: [{step: broken}]}
          - step: broken
            tool:
              - {name: fine, kind: noop}
              - {name: bad, kind: python, code: "raise RuntimeError('no')"}
              - {name: never, kind: ducklake, command: "INSERT INTO steps_policy.pages VALUES (-1)"}
        """
    run = _run(stack, wp, tmp_path, body)
    steps = {s.step: s for s in run.steps}
    assert steps["start"].status == "ok", _why(run)
    assert steps["start"].attempt.details["tasks"] == {"page": "ok", "store": "ok"}
    assert run.ctx == {"pages": 2}  # the pages before the last one jumped on
    assert _count(lake, "pages") == [(3, 1), (2026, 1)]  # the last page, stored once
    assert steps["broken"].status == "error" and steps["broken"].error.line().startswith("task bad: RuntimeError")
    assert steps["broken"].attempt.details["tasks"] == {"fine": "ok", "bad": "error"}  # `never` did not run


def test_a_parallel_loop_of_python_runs_its_iterations_at_once_on_the_plane(stack, wp, tmp_path):
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: parallel_python}
        workload: {items: [1, 2, 3, 4, 5, 6]}
        workflow:
          - step: start
            loop: {in: "{{ items }}", iterator: n, spec: {mode: parallel, max_in_flight: 3}}
            tool:
              kind: python
              input: {n: "{{ n }}"}
              code: |
                import time
                started = time.time()
                time.sleep(0.4)
                result = {"n": n * n, "started": started, "ended": time.time()}
        """
    run = _run(stack, wp, tmp_path, body)
    its = run.steps[0].iterations
    assert run.ok, _why(run)
    assert [it.index for it in its] == list(range(6)) and [it.data["n"] for it in its] == [1, 4, 9, 16, 25, 36]
    spans = sorted((it.data["started"], it.data["ended"]) for it in its)
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)  # iterations running at one moment
    assert 2 <= most <= 3, spans  # at once, never more than max_in_flight


def test_resume_never_runs_a_step_whose_earlier_fate_cannot_be_known(stack, wp, tmp_path):
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: resumed}
        workflow:
          - step: start
            tool: {kind: postgres, auth: kit, command: "SELECT 1 AS one"}
        """
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(body))
    fresh = runner.run(runner.load(path), wp, stack.home)
    assert fresh.ok, _why(fresh)
    again = runner.run(runner.load(path), wp, stack.home, resume=fresh.execution_id)
    assert not again.ok
    assert "not run again by --resume" in again.steps[0].error.line()


def test_the_step_scope_lives_through_its_retries_and_tasks(stack, wp, tmp_path):
    # NoETL's `set: {step.x: ...}` (its assignment spec's own example counts retries with it): what one attempt or
    # task writes, the next reads. Before the scope was kept, each write went to a dict nobody read, so `step.tries`
    # stayed 0 and every attempt failed
    body = """\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: step_scope}
        workflow:
          - step: start
            tool:
              - name: flaky
                kind: python
                input: {tries: "{{ step.tries | default(0) }}"}
                code: |
                  if tries < 2:
                      raise RuntimeError(f"not yet ({tries})")
                  result = {"tries": tries, "cursor": "c-42"}
                spec:
                  policy:
                    rules:
                      - when: "{{ output.status == 'error' }}"
                        then: {do: retry, attempts: 5, delay: 0.01, set: {step.tries: "{{ (step.tries | default(0)) + 1 }}"}}
                      - else: {then: {do: continue, set: {step.cursor: "{{ output.data.cursor }}"}}}
              - name: after
                kind: python
                input: {cursor: "{{ step.cursor }}", tries: "{{ step.tries }}"}
                code: |
                  result = {"seen": f"{cursor}/{tries}"}
        """
    run = _run(stack, wp, tmp_path, body)
    start = run.steps[0]
    assert start.status == "ok", _why(run)
    assert start.data == {"seen": "c-42/2"}  # the second task read what the first task's rules wrote
    assert start.scope == {"tries": 2, "cursor": "c-42"}
    assert start.as_dict()["scope"] == {"tries": 2, "cursor": "c-42"}  # steps run --json shows it
    assert sum("retry" in line for line in start.policy) == 2  # two retries, each counted once


def test_a_set_of_the_steps_own_outcome_is_refused_at_validate(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent("""\
        apiVersion: noetl.io/v2
        kind: Playbook
        metadata: {name: step_scope}
        workflow:
          - step: start
            tool:
              kind: python
              code: "result = 1"
              spec:
                policy:
                  rules:
                    - else: {then: {do: continue, set: {step.data: "{{ output.data }}"}}}
        """)
    )
    with pytest.raises(
        KitError, match=r"p.yaml:\d+: step 'start': `set: step.data` names a field of the step's outcome"
    ):
        runner.load(path)
