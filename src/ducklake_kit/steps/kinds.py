"""The tool kinds real NoETL playbooks use beside `ducklake`, with NoETL's semantics:

- `postgres`: the command on a PostgreSQL server named by `auth` (psycopg). The command's text goes as one query, so
  PostgreSQL runs its statements as one implicit transaction (all or nothing, which makes a retry safe); a lone
  `CREATE DATABASE` runs as it must, outside a transaction block.
- `duckdb`: the commands in a DuckDB database of the run's own (NoETL: one file per execution, so a table a step
  creates is there for the next), or the file `database:` names.
- `python`: `code` run on a worker of the plane, with the step's `input` (or `args`) and `ctx` as names; its `result`
  (or what its `main(...)` returns) is the step's data.
- `http`: one request with the standard library (`method`, `url`, `headers`, `params`, `payload`/`data`/`json`,
  `timeout`); a JSON body is the step's data.
- `noop`: nothing, successfully.

Each returns a `KindResult`: `status` in NoETL's words ("success" or "error", what policy rules test as
`output.status`), the `data` NoETL's templates read as `{{ step.data }}`, and the kit's detail (each statement, the HTTP
status). The runner renders every template before calling these: they receive plain values.
"""

from __future__ import annotations

import inspect
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from ducklake_kit.errors import first_line
from ducklake_kit.platforms.base import PgEndpoint
from ducklake_kit.steps.task import StatementRun

SUCCESS, FAILED = "success", "error"  # NoETL's output.status
HTTP_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 16 * 2**20  # a response larger than this is an error, not a step's data


@dataclass
class KindResult:
    status: str = SUCCESS
    data: Any = None
    error: str | None = None
    statements: list[StatementRun] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # http: status_code, url, elapsed; python: the worker
    worker: str = "runner"  # where it ran: the runner's own process, or a worker of the plane (python)
    started_at: float = 0.0
    finished_at: float = 0.0
    seconds: float = 0.0

    def fail(self, why: str) -> KindResult:
        self.status, self.error = FAILED, why
        return self


def _timed(fn):
    """Stamp a kind's result with when it ran and how long it took."""

    def wrapper(*args, **kwargs) -> KindResult:
        started, clock = time.time(), time.perf_counter()
        out: KindResult = fn(*args, **kwargs)
        out.started_at, out.finished_at = started, time.time()
        out.seconds = round(time.perf_counter() - clock, 6)
        return out

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


def _rows(columns: list[str], rows: list[tuple]) -> list[dict[str, Any]]:
    return [dict(zip(columns, r)) for r in rows]


def sql_data(statements: list[StatementRun], commands: int) -> Any:
    """NoETL's `data` of a SQL step: the rows (as objects) of each command's last statement that returned rows (an
    empty list when none did); one command gives that list, several a list of them (`data[0]`, `data[1]`)."""
    per = [[] for _ in range(max(commands, 1))]
    for s in statements:
        if s.columns and 0 <= s.command < len(per):
            per[s.command] = _rows(s.columns, s.rows)
    return per[0] if commands <= 1 else per


# -- postgres --------------------------------------------------------------------------------------------------
@_timed
def run_postgres(pg: PgEndpoint, commands: list[str]) -> KindResult:
    """Each command as one query on `pg`, in order; the first that fails stops the task."""
    import psycopg

    out = KindResult()
    try:
        conn = psycopg.connect(pg.libpq(), autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        where = f"postgresql://{pg.user}@{pg.host}:{pg.port}/{pg.dbname}"  # never the password
        return out.fail(f"cannot connect to {where}: {first_line(exc)}")
    with conn:
        for i, text in enumerate(commands):
            if not _postgres_command(conn, i, text, out):
                return out.fail(out.statements[-1].error or "failed")
    out.data = sql_data(out.statements, len(commands))
    return out


def _postgres_command(conn, i: int, text: str, out: KindResult) -> bool:
    import psycopg

    clock = time.perf_counter()
    with conn.cursor() as cur:
        try:
            cur.execute(text.encode())  # bytes: no client-side placeholders, the text goes as written
        except psycopg.Error as exc:
            out.statements.append(StatementRun(i, 0, text.strip(), None, error=first_line(exc)))
            return False
        n = 0
        while True:  # one result per statement of the text
            columns = [c.name for c in cur.description] if cur.description else []
            out.statements.append(
                StatementRun(
                    i,
                    n,
                    text.strip() if n == 0 else "",
                    cur.statusmessage.split()[0] if cur.statusmessage else None,
                    columns=columns,
                    rows=[tuple(r) for r in cur.fetchall()] if columns else [],
                    affected_rows=cur.rowcount if not columns and cur.rowcount >= 0 else None,
                    seconds=round(time.perf_counter() - clock, 6),
                )
            )
            n += 1
            if not cur.nextset():
                return True


# -- duckdb ----------------------------------------------------------------------------------------------------
@_timed
def run_duckdb(database: Path | str, commands: list[str]) -> KindResult:
    """Each command's statements, in order, in the DuckDB database `database` (a file, created when missing)."""
    out = KindResult()
    if str(database) != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(database)) as con:
        for i, text in enumerate(commands):
            try:
                statements = duckdb.extract_statements(text)
            except duckdb.Error as exc:
                return out.fail(f"command {i} does not parse: {first_line(exc)}")
            for n, stmt in enumerate(statements):
                clock = time.perf_counter()
                run = StatementRun(i, n, stmt.query.strip(), stmt.type.name)
                out.statements.append(run)
                try:
                    rel = con.execute(stmt.query)
                    if rel.description:
                        run.columns = [d[0] for d in rel.description]
                        run.rows = rel.fetchall()
                except duckdb.Error as exc:
                    run.error = first_line(exc)
                    return out.fail(run.error)
                finally:
                    run.seconds = round(time.perf_counter() - clock, 6)
    out.data = sql_data(out.statements, len(commands))
    return out


# -- http ------------------------------------------------------------------------------------------------------
@_timed
def run_http(config: dict[str, Any]) -> KindResult:
    """One request. A status of 400 or more is an error (its code in `output.http.status`, as NoETL's policies read
    it); a JSON body is parsed, any other body is text."""
    out = KindResult()
    method = str(config.get("method") or "GET").upper()
    url = str(config.get("url") or config.get("endpoint") or "")
    if not url.startswith(("http://", "https://")):
        return out.fail(f"the url {url!r} is not http:// or https://")
    params = config.get("params") or {}
    if params:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params, doseq=True)
    headers = {str(k): str(v) for k, v in (config.get("headers") or {}).items()}
    body = _body(config, headers)
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    out.details = {"method": method, "url": url}
    try:
        with urllib.request.urlopen(request, timeout=float(config.get("timeout") or HTTP_TIMEOUT_S)) as response:
            code, raw, kind = response.status, response.read(MAX_BODY_BYTES + 1), response.headers.get_content_type()
    except urllib.error.HTTPError as exc:
        code, raw, kind = exc.code, exc.read(MAX_BODY_BYTES + 1), exc.headers.get_content_type()
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        return out.fail(f"{method} {url}: {first_line(getattr(exc, 'reason', exc))}")
    if len(raw) > MAX_BODY_BYTES:
        return out.fail(f"{method} {url}: the response is larger than {MAX_BODY_BYTES // 2**20} MiB")
    out.details.update(status=code, content_type=kind)
    out.data = _decoded(raw, kind)
    if code >= 400:
        return out.fail(f"{method} {url}: HTTP {code}")
    return out


def _body(config: dict[str, Any], headers: dict[str, str]) -> bytes | None:
    for key in ("json", "payload", "data", "body"):
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, (dict, list)):
            headers.setdefault("Content-Type", "application/json")
            return json.dumps(value, default=str).encode()
        return str(value).encode()
    return None


def _decoded(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if content_type.endswith("json") or text[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


# -- python (on a worker) --------------------------------------------------------------------------------------
def run_python(
    plugin: str, code: str, names: dict[str, Any], libs: dict[str, Any] | None = None, *, token: str | None = None
) -> KindResult:
    """Run on a worker of the plane (submitted by `WorkerPlane.submit_call`): `code` with `names` bound, and NoETL's
    `libs` imported first (`{alias: module}` or `{alias: {from: module, import: name}}`). NoETL's two forms: code
    that sets `result`, or code that defines `main(...)`, called with the names its parameters ask for."""
    from distributed import get_worker

    started, clock = time.time(), time.perf_counter()
    out = KindResult(worker=str(get_worker().name))
    scope: dict[str, Any] = {"__name__": "__noetl_step__", **names}
    try:
        scope.update(_imports(libs or {}))
        exec(compile(code, "<step code>", "exec"), scope)  # the playbook's own code, run as it asks
        main = scope.get("main")
        if callable(main):
            wanted = inspect.signature(main).parameters
            takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in wanted.values())
            out.data = main(**(names if takes_all else {k: names[k] for k in wanted if k in names}))
        else:
            out.data = scope.get("result")
        json.dumps(out.data, default=str)  # what crosses back to the runner and into templates is plain data
    except Exception as exc:  # noqa: BLE001 - the step's code failed: its error is the step's
        out.fail(f"{type(exc).__name__}: {first_line(exc)}")
    out.started_at, out.finished_at = started, time.time()
    out.seconds = round(time.perf_counter() - clock, 6)
    return out


def _imports(libs: dict[str, Any]) -> dict[str, Any]:
    import importlib

    out = {}
    for alias, spec in libs.items():
        if isinstance(spec, dict):
            module = importlib.import_module(str(spec.get("from") or spec.get("module") or alias))
            out[str(alias)] = getattr(module, str(spec["import"])) if spec.get("import") else module
        else:
            out[str(alias)] = importlib.import_module(str(spec or alias))
    return out
