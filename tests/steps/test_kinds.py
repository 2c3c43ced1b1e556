"""The tool kinds beside ducklake (steps/kinds.py) and NoETL's policy rules (steps/policy.py), each against the real
thing: a DuckDB file, an HTTP server on loopback, the stack's PostgreSQL. The runner's use of them is tested with whole
playbooks in test_noetl_run.py."""

from __future__ import annotations

import http.server
import json
import threading
from typing import ClassVar

import duckdb
import pytest

from ducklake_kit.steps import kinds, policy
from ducklake_kit.steps.model import Admit, Policy, Rule


# -- duckdb ----------------------------------------------------------------------------------------------------
def test_duckdb_keeps_its_database_between_calls_and_returns_rows_as_objects(tmp_path):
    db = tmp_path / "run.duckdb"
    made = kinds.run_duckdb(db, ["CREATE TABLE t (id INTEGER, name VARCHAR); INSERT INTO t VALUES (1, 'a'), (2, NULL)"])
    assert made.status == kinds.SUCCESS, made.error
    read = kinds.run_duckdb(db, ["SELECT * FROM t ORDER BY id"])
    assert read.data == [{"id": 1, "name": "a"}, {"id": 2, "name": None}]
    with duckdb.connect(str(db)) as con:  # the file itself, read independently
        assert con.execute("SELECT count(*) FROM t").fetchone() == (2,)


def test_duckdb_with_several_commands_gives_one_row_list_per_command(tmp_path):
    out = kinds.run_duckdb(
        tmp_path / "x.duckdb", ["SELECT 1 AS a", "SELECT 2 AS b UNION ALL SELECT 3", "CREATE TABLE z (i INT)"]
    )
    assert out.data == [[{"a": 1}], [{"b": 2}, {"b": 3}], []]


def test_duckdb_stops_at_the_first_failing_statement_with_duckdbs_error(tmp_path):
    db = tmp_path / "f.duckdb"
    out = kinds.run_duckdb(db, ["CREATE TABLE t (i INT); INSERT INTO nope VALUES (1); INSERT INTO t VALUES (1)"])
    assert out.status == kinds.FAILED
    assert "nope" in out.error
    assert [s.error is not None for s in out.statements] == [False, True]  # the third never ran
    assert kinds.run_duckdb(db, ["SELECT count(*) AS n FROM t"]).data == [{"n": 0}]


# -- http ------------------------------------------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

    def _reply(self, code: int, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self.seen.append({"method": "GET", "path": self.path, "auth": self.headers.get("Authorization")})
        if self.path.startswith("/missing"):
            self._reply(404, {"error": "no such thing"})
        else:
            self._reply(200, [{"id": 1, "name": "Leanne"}, {"id": 2, "name": "Ervin"}])

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.seen.append({"method": "POST", "body": json.loads(self.rfile.read(length))})
        self._reply(201, {"created": True})

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_http_get_returns_the_json_body_as_data_with_params_and_headers(server):
    _Handler.seen.clear()
    out = kinds.run_http({"url": f"{server}/users", "params": {"page": 2}, "headers": {"Authorization": "Bearer t"}})
    assert out.status == kinds.SUCCESS, out.error
    assert out.data[1]["name"] == "Ervin"
    assert out.details["status"] == 200
    assert _Handler.seen == [{"method": "GET", "path": "/users?page=2", "auth": "Bearer t"}]


def test_http_post_sends_a_mapping_payload_as_json(server):
    _Handler.seen.clear()
    out = kinds.run_http({"method": "post", "url": f"{server}/users", "payload": {"name": "x", "ids": [1, 2]}})
    assert (out.status, out.details["status"], out.data) == (kinds.SUCCESS, 201, {"created": True})
    assert _Handler.seen == [{"method": "POST", "body": {"name": "x", "ids": [1, 2]}}]


def test_http_error_status_is_an_error_whose_code_policies_can_read(server):
    out = kinds.run_http({"url": f"{server}/missing"})
    assert out.status == kinds.FAILED
    assert "HTTP 404" in out.error
    assert policy.output(False, out.data, out.error, out.details)["http"] == {"status": 404}


def test_http_refuses_a_url_that_is_not_http_and_reports_a_closed_port():
    assert "is not http" in kinds.run_http({"url": "file:///etc/passwd"}).error
    import socket

    with socket.socket() as s:  # a port nothing listens on: asked of the OS, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = kinds.run_http({"url": f"http://127.0.0.1:{port}/", "timeout": 2})
    assert out.status == kinds.FAILED and "refused" in out.error.lower()


# -- policies --------------------------------------------------------------------------------------------------
def test_the_first_matching_rule_wins_and_else_holds_only_when_none_did():
    rules = Policy(
        [
            Rule("{{ output.status == 'error' and output.http.status in [429, 503] }}", "retry", attempts=5, line=1),
            Rule("{{ output.status == 'error' }}", "fail", line=2),
            Rule(None, "continue", set={"ctx.n": "{{ output.data | length }}"}, line=3),
        ]
    )
    busy = {"output": policy.output(False, None, "HTTP 503", {"status": 503})}
    assert [r.line for r in policy.matching(rules, busy)] == [1]
    gone = {"output": policy.output(False, None, "HTTP 404", {"status": 404})}
    assert [r.line for r in policy.matching(rules, gone)] == [2]
    fine = {"output": policy.output(True, [1, 2], None, None)}
    assert [r.line for r in policy.matching(rules, fine)] == [3]


def test_inclusive_mode_applies_every_rule_that_holds():
    rules = Policy([Rule("{{ true }}", "continue", line=1), Rule("{{ 1 > 0 }}", "continue", line=2)], mode="inclusive")
    assert [r.line for r in policy.matching(rules, {})] == [1, 2]


def test_backoff_grows_as_named_and_is_capped():
    assert [policy.delay_s(Rule(None, "retry", delay=0.5, backoff="exponential"), n) for n in (1, 2, 3)] == [0.5, 1, 2]
    assert [policy.delay_s(Rule(None, "retry", delay=1, backoff="linear"), n) for n in (1, 2, 3)] == [1, 2, 3]
    assert policy.delay_s(Rule(None, "retry", delay=10, backoff="exponential"), 20) == policy.MAX_DELAY_S
    assert policy.attempts_of(Rule(None, "retry")) == 3


def test_set_writes_where_its_name_says():
    scopes = {"ctx": {"a": 1}, "iter": {}, "step": {}}
    written = policy.apply_set(
        {"ctx.count": "{{ output.data | length }}", "iter.page": "{{ 2 + 1 }}", "plain": "x"},
        {"output": {"data": [1, 2, 3]}},
        scopes,
    )
    assert scopes["ctx"] == {"a": 1, "count": 3, "plain": "x"}
    assert scopes["iter"] == {"page": 3}
    assert written == {"ctx.count": 3, "iter.page": 3, "plain": "x"}


def test_admit_rules_decide_whether_a_step_runs():
    admit = Admit([("{{ ctx.enabled }}", True, 4), (None, False, 5)])
    assert policy.admitted(admit, {"ctx": {"enabled": True}}) == (True, 4)
    assert policy.admitted(admit, {"ctx": {"enabled": False}}) == (False, 5)
    assert policy.admitted(None, {}) == (True, None)


# -- postgres (the stack's own server) -------------------------------------------------------------------------
def test_postgres_runs_a_command_as_one_transaction_and_returns_its_rows(stack):
    pg = stack.platform.endpoints().pg
    ok = kinds.run_postgres(
        pg, ["CREATE TEMP TABLE k (id int); INSERT INTO k VALUES (1), (2); SELECT id FROM k ORDER BY id"]
    )
    assert ok.status == kinds.SUCCESS, ok.error
    assert ok.data == [{"id": 1}, {"id": 2}]
    assert [s.statement_type for s in ok.statements] == ["CREATE", "INSERT", "SELECT"]
    # a failing statement rolls back the ones before it in the same command: a retry is safe
    kinds.run_postgres(pg, ["DROP TABLE IF EXISTS kinds_probe; CREATE TABLE kinds_probe (id int)"])
    bad = kinds.run_postgres(pg, ["INSERT INTO kinds_probe VALUES (1); SELECT 1/0"])
    assert bad.status == kinds.FAILED and "division by zero" in bad.error
    after = kinds.run_postgres(pg, ["SELECT count(*) AS n FROM kinds_probe; DROP TABLE kinds_probe"])
    assert after.statements[0].rows == [(0,)]


def test_postgres_never_prints_the_password_of_a_refused_connection(stack):
    from dataclasses import replace

    pg = replace(stack.platform.endpoints().pg, password="wrong-secret-123")
    out = kinds.run_postgres(pg, ["SELECT 1"])
    assert out.status == kinds.FAILED
    assert "wrong-secret-123" not in out.error and pg.user in out.error


def test_the_runs_duckdb_files_live_in_a_folder_only_the_kits_user_reads(tmp_path):
    from ducklake_kit.steps import calls
    from ducklake_kit.steps.model import Step

    env = calls.CallEnv(None, None, None, tmp_path, "abc123")
    path = calls.duckdb_file(Step("s", 1, tool="duckdb"), {}, env)
    assert path == tmp_path / calls.DUCKDB_FOLDER / "abc123.duckdb"
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    kinds.run_duckdb(path, ["CREATE TABLE t AS SELECT 1 AS i"])
    assert (path.parent.stat().st_mode & 0o777) == 0o700
