"""What the runner does to a rendered command before a worker runs it, with sqlglot (never a regex):

- the seed's documented time travel, `FOR SYSTEM_TIME AS OF SNAPSHOT 5` and `FOR SYSTEM_TIME AS OF '<timestamp>'`,
  does not parse in DuckDB: it is rewritten to DuckLake's `AT (VERSION => 5)` / `AT (TIMESTAMP => ...)`, with a
  warning naming the rewrite;
- `PRIMARY KEY` and `UNIQUE` (NoETL's fixtures use them) are refused before anything runs, with one clear line:
  DuckLake tables support only NOT NULL;
- a value pasted into a command as it is (`'{{ who }}'`, NoETL's way) that changes the statement's structure is
  refused (`pasted_values_refused`): the rendered command's tokens are compared with those of the same command
  rendered with a harmless stand-in for every value;
- what would change the worker's pooled connection for later tasks (ATTACH, DETACH, USE of a database the playbook
  does not declare, SET of a setting of the whole worker) is refused (`session_refused`), as pipelines refuse it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from ducklake_kit.lake.statements import session_statement
from ducklake_kit.steps.templates import Pasted, RenderedSql
from ducklake_kit.workers.config import LOCAL_DB

logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its "falling back to a Command" warning (CALL ...): not ours


@dataclass(frozen=True)
class Rewrite:
    before: str
    after: str

    def warning(self) -> str:
        return f"rewrote `{self.before}` to DuckLake's `{self.after}`"


@functools.lru_cache(maxsize=1024)  # a loop's iterations usually send the same text (values go in as params)
def rewrite_time_travel(sql: str) -> tuple[str, tuple[Rewrite, ...]]:
    """`sql` with every `FOR SYSTEM_TIME AS OF ...` replaced by DuckLake's AT clause, and what was replaced."""
    try:
        tokens = DuckDB().tokenize(sql)
    except TokenError:
        return sql, ()  # DuckDB will report what does not tokenize
    out, rewrites, cursor, i = [], [], 0, 0
    while i < len(tokens):
        found = _system_time_at(tokens, i)
        if found is None:
            i += 1
            continue
        end, clause = found
        start_pos, end_pos = tokens[i].start, tokens[end].end + 1
        out.append(sql[cursor:start_pos])
        out.append(clause)
        rewrites.append(Rewrite(sql[start_pos:end_pos], clause))
        cursor, i = end_pos, end + 1
    out.append(sql[cursor:])
    return "".join(out), tuple(rewrites)


def _word(token, *words: str) -> bool:
    return token.text.upper() in words


def _system_time_at(tokens, i: int) -> tuple[int, str] | None:
    """(index of the clause's last token, the AT clause) when tokens[i:] is FOR SYSTEM_TIME AS OF [SNAPSHOT|VERSION|
    TIMESTAMP] <number|string>."""
    if i + 4 >= len(tokens) or tokens[i].token_type != TokenType.FOR:
        return None
    if not (_word(tokens[i + 1], "SYSTEM_TIME") and _word(tokens[i + 2], "AS") and _word(tokens[i + 3], "OF")):
        return None
    j, kind = i + 4, None
    if _word(tokens[j], "SNAPSHOT", "VERSION"):
        j, kind = j + 1, "VERSION"
    elif _word(tokens[j], "TIMESTAMP"):
        j, kind = j + 1, "TIMESTAMP"
    if j >= len(tokens):
        return None
    value = tokens[j]
    if value.token_type == TokenType.NUMBER and kind in (None, "VERSION"):
        return j, f"AT (VERSION => {value.text})"
    if value.token_type == TokenType.STRING and kind in (None, "TIMESTAMP"):
        literal = "'" + value.text.replace("'", "''") + "'"
        return j, f"AT (TIMESTAMP => TIMESTAMPTZ {literal})"
    return None


UNSUPPORTED_CONSTRAINT = (
    "DuckLake tables support only NOT NULL constraints, not PRIMARY KEY or UNIQUE "
    "(table {table}, line {line} of the command)"
)


@functools.lru_cache(maxsize=1024)
def unsupported_constraint(sql: str) -> str | None:
    """Why `sql` cannot run on DuckLake (a PRIMARY KEY or UNIQUE in a CREATE TABLE of a catalog table), or None.
    Text sqlglot cannot parse is left for DuckDB to judge."""
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except (ParseError, TokenError):
        return None
    for statement in statements:
        if not isinstance(statement, exp.Create) or statement.kind != "TABLE":
            continue
        table = statement.find(exp.Table)
        if table is not None and (table.catalog or table.db) == LOCAL_DB:
            continue  # a worker-local table is plain DuckDB, which has keys
        for node in statement.find_all(exp.PrimaryKeyColumnConstraint, exp.PrimaryKey, exp.UniqueColumnConstraint):
            name = table.sql("duckdb") if table is not None else "?"
            return (
                UNSUPPORTED_CONSTRAINT.format(table=name, line=_line_of(sql, node))
                + ": declare the key column NOT NULL instead"
            )
    return None


def _line_of(sql: str, node: exp.Expression) -> int:
    meta = node.meta if hasattr(node, "meta") else {}
    if "line" in meta:
        return int(meta["line"])
    parent = node.parent
    while parent is not None:
        ident = parent.find(exp.Identifier)
        if ident is not None and "line" in ident.meta:
            return int(ident.meta["line"])
        parent = parent.parent
    return 1


# a value pasted inside one of these (a quoted string, a "quoted identifier") must end inside it
_QUOTED = {
    TokenType.STRING,
    TokenType.NATIONAL_STRING,
    TokenType.RAW_STRING,
    TokenType.NATIONAL_RAW_STRING,
    TokenType.HEREDOC_STRING,
    TokenType.UNICODE_STRING,
    TokenType.BIT_STRING,
    TokenType.HEX_STRING,
    TokenType.BYTE_STRING,
    TokenType.IDENTIFIER,
}
# what a value pasted outside quotes may be made of: names (a.b), numbers (-5), lists ([1, 2], a, b), literals
_BARE = {
    TokenType.VAR,
    TokenType.NUMBER,
    TokenType.DOT,
    TokenType.COMMA,
    TokenType.DASH,
    TokenType.TRUE,
    TokenType.FALSE,
    TokenType.NULL,
    TokenType.L_BRACKET,
    TokenType.R_BRACKET,
}
PASTED_FIX = "write {{ value | sql }} (a quoted literal) or bind it as a parameter (params: and $name in the SQL)"


def _overlaps(token, start: int, end: int) -> bool:
    """Whether the token covers any of [start, end), or strictly contains `start` for an empty value ('')."""
    return token.start < end and token.end >= start if end > start else token.start < start <= token.end


def pasted_values_refused(rendered: RenderedSql) -> str | None:
    """Why a command's pasted values change its structure, or None. Numbers, and values that stay inside their quoted
    literal (or comment), pass: NoETL's fixtures paste `{{ user_id }}` into their SQL.

    The command is tokenized twice (sqlglot, DuckDB's dialect): as rendered, and with a stand-in `x` for each value.
    The tokens outside every value must be the same (nothing of the command was swallowed into a literal or a
    comment), and each value must stay where its stand-in was: inside its quoted literal, inside its comment, or, in
    the open, made only of names, numbers and literals (no `;`, keyword or operator)."""
    if not rendered.pasted:
        return None
    try:
        standin = DuckDB().tokenize(rendered.standin)
    except TokenError:
        return None  # the command's own text does not tokenize: DuckDB will say why
    try:
        tokens = DuckDB().tokenize(rendered.text)
    except TokenError:
        return _refusal(rendered, rendered.pasted[0], "opens a quote that never ends")
    spans = [(p.start, p.end) for p in rendered.pasted]
    standin_spans = [(p.standin_start, p.standin_start + 1) for p in rendered.pasted]
    mine = [(t.token_type, t.text) for t in tokens if not any(_overlaps(t, a, b) for a, b in spans)]
    theirs = [(t.token_type, t.text) for t in standin if not any(_overlaps(t, a, b) for a, b in standin_spans)]
    if mine != theirs:
        worst = next((p for p in rendered.pasted if not p.safe), rendered.pasted[0])
        return _refusal(rendered, worst, "changes the SQL around it")
    for p in rendered.pasted:
        where = next((t for t in standin if t.start <= p.standin_start <= t.end), None)
        inside = [t for t in tokens if _overlaps(t, p.start, p.end)]
        if where is None:  # the stand-in is in a comment
            if inside:
                return _refusal(rendered, p, "breaks out of its comment")
        elif where.token_type in _QUOTED and where.start < p.standin_start:
            if not any(t.token_type == where.token_type and t.start < p.start and t.end >= p.end for t in inside):
                return _refusal(rendered, p, "breaks out of its quoted literal")
        elif not p.safe:
            for t in inside:
                whole = t.start >= p.start and t.end < p.end
                if t.token_type not in _BARE and not (t.token_type in _QUOTED and whole):
                    return _refusal(rendered, p, f"adds `{t.text}` to the statement")
    return None


def _refusal(rendered: RenderedSql, p: Pasted, why: str) -> str:
    value = " ".join(rendered.text[p.start : p.end].split())
    value = value if len(value) <= 60 else value[:59] + "…"
    return f"a value pasted into the SQL ({value!r}) {why}, so it was not run; {PASTED_FIX}"


# DuckDB's own databases: always attached, never a step's catalog
DUCKDB_DATABASES = {"memory", "system", "temp"}
# LOCAL settings that choose where unqualified names go, as USE does
_NAME_SETTINGS = {"schema", "search_path"}


@functools.lru_cache(maxsize=256)
def setting_scope(name: str) -> str | None:
    """GLOBAL (the whole DuckDB instance: every task of a worker) or LOCAL (the connection), as DuckDB itself says;
    None for a name plain DuckDB does not know (an extension's setting, or a typo)."""
    with duckdb.connect() as con:  # DuckDB's own settings, without the extensions: only DuckDB knows the scopes
        row = con.execute(
            "SELECT scope FROM duckdb_settings() WHERE lower(name) = lower($1) "
            "OR list_contains(list_transform(aliases, a -> lower(a)), lower($1))",
            [name],
        ).fetchone()
    return row[0] if row else None


@functools.lru_cache(maxsize=1024)  # a loop's iterations usually send the same text: parsed once
def session_refused(sql: str, catalogs: frozenset[str]) -> str | None:
    """Why a step may not run `sql`, or None: ATTACH and DETACH (a step names its catalog with catalog_name and
    auth/catalog_connection), USE of a database other than `catalogs` (those the playbook declares, the lake and
    `local`), and SET/RESET of a setting of the whole worker. Every task on a worker shares its connection: what a
    step changes there, the next task of anyone on that worker would inherit. SET VARIABLE and settings of the
    connection alone (DuckDB's LOCAL ones) are allowed. Text sqlglot cannot parse is left for DuckDB to judge (and
    the worker undoes an ATTACH or USE after every task)."""
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except (ParseError, TokenError):
        return None
    for stmt in statements:
        word = session_statement(stmt)
        if word in ("ATTACH", "DETACH"):
            return (
                f"{word} is refused in a step: every task on a worker shares its connection, so the databases a "
                "step attaches or detaches would change the lake for later tasks; declare another catalog with "
                "catalog_name and auth or catalog_connection"
            )
        if word == "USE":
            table = stmt.this
            database = (table.catalog or table.db) if isinstance(table, exp.Table) and table.db else None
            name = database or (table.name if isinstance(table, exp.Table) else str(table))
            if (database and database not in catalogs) or (not database and name.lower() in DUCKDB_DATABASES):
                return (
                    f"USE {name} is refused in a step: only the catalogs the playbook declares "
                    f"({', '.join(sorted(catalogs))}) may be its default database; declare another catalog with "
                    "catalog_name and auth or catalog_connection"
                )
        if word in ("SET", "RESET"):
            why = _global_setting(stmt)
            if why:
                return why
    return None


def _global_setting(stmt: exp.Expression) -> str | None:
    """Why a SET, PRAGMA name = value or RESET changes more than the connection, or None."""
    if isinstance(stmt, exp.Command):  # RESET [GLOBAL|SESSION|LOCAL|VARIABLE] name
        words = [t.text for t in DuckDB().tokenize(stmt.expression.name if stmt.expression else "")]
        kind = (
            words.pop(0).upper() if words and words[0].upper() in ("GLOBAL", "SESSION", "LOCAL", "VARIABLE") else None
        )
        items = [(kind, words[0] if words else "")]
    elif isinstance(stmt, exp.Pragma):
        items = [(None, stmt.this.this.name)]
    else:
        items = []
        for item in stmt.expressions:
            kind = str(item.args.get("kind") or "").upper() or None
            target = item.this.this if isinstance(item.this, exp.EQ) else item.this
            items.append((kind, target.name if isinstance(target, exp.Expression) else str(target)))
    word = "RESET" if isinstance(stmt, exp.Command) else "SET"
    for kind, name in items:
        if kind == "VARIABLE":
            continue
        if name.lower() in _NAME_SETTINGS:
            return (
                f"{word} {name} is refused in a step: it would choose where unqualified names go for every later task "
                "on the worker; qualify the names, or USE one of the playbook's catalogs"
            )
        scope = setting_scope(name)
        if kind == "GLOBAL" or scope != "LOCAL":
            what = "a setting of the whole worker" if scope else "not a setting DuckDB knows as the connection's own"
            return (
                f"{word} {name} is refused in a step: it is {what}, so it would stay for every later task on the "
                "worker; use the step's memory_limit or threads (they apply to the step only), or SET VARIABLE"
            )
    return None
