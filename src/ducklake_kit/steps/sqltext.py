"""What the runner does to a rendered command before a worker runs it, with sqlglot (never a regex):

- the seed's documented time travel, `FOR SYSTEM_TIME AS OF SNAPSHOT 5` and `FOR SYSTEM_TIME AS OF '<timestamp>'`,
  does not parse in DuckDB: it is rewritten to DuckLake's `AT (VERSION => 5)` / `AT (TIMESTAMP => ...)`, with a
  warning naming the rewrite;
- `PRIMARY KEY` and `UNIQUE` (NoETL's fixtures use them) are refused before anything runs, with one clear line:
  DuckLake tables support only NOT NULL (`unsupported_constraint`); `drop_constraints` removes them instead (the key
  columns stay NOT NULL), with a warning per table, for a run that asks for it;
- `INSERT ... ON CONFLICT` (and `INSERT OR REPLACE|IGNORE`) needs a key, so it cannot work on DuckLake: it is refused
  with the `MERGE INTO` that does the same written out for that statement (`on_conflict_refusal`);
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
import jinja2
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


# -- what DuckLake cannot do: keys (PRIMARY KEY, UNIQUE) and what needs them (INSERT ... ON CONFLICT)

_MASK = "__dlk_tpl_{}__"  # a template's `{{ ... }}` stands in as this name (or inside its quoted literal) to parse
_JINJA = jinja2.Environment()  # its lexer only: nothing is rendered here


def _masked(sql: str) -> tuple[str, dict[str, str]] | None:
    """`sql` with each `{{ ... }}` replaced by a name sqlglot parses (inside a quoted literal it stays in the literal),
    and the names back to the original text; None when the text holds a block or comment tag (`{% %}`, `{# #}`),
    which only rendering can resolve (the rendered command is checked at run time). Jinja's own lexer finds them."""
    if "{" not in sql:
        return sql, {}
    try:
        tokens = list(_JINJA.lex(sql))
    except jinja2.TemplateSyntaxError:
        return None
    out, names, current = [], {}, None
    for _line, kind, value in tokens:
        if kind in ("block_begin", "comment_begin", "linestatement_begin", "linecomment_begin"):
            return None
        if kind == "variable_begin":
            current = [value]
        elif kind == "variable_end" and current is not None:
            current.append(value)
            name = _MASK.format(len(names))
            names[name] = "".join(current)
            out.append(name)
            current = None
        elif current is not None:
            current.append(value)
        else:
            out.append(value)
    return "".join(out), names


def _unmasked(text: str, names: dict[str, str]) -> str:
    for name, original in names.items():
        text = text.replace(name, original)
    return text


def _statement_spans(sql: str) -> list[tuple[int, int]] | None:
    """[start, end) of each statement of `sql` (split at `;` tokens: a `;` in a string or comment is no separator)."""
    try:
        tokens = DuckDB().tokenize(sql)
    except TokenError:
        return None
    spans, start = [], 0
    for t in tokens:
        if t.token_type == TokenType.SEMICOLON:
            spans.append((start, t.start))
            start = t.end + 1
    spans.append((start, len(sql)))
    return [(a, b) for a, b in spans if sql[a:b].strip()]


def _lake_create_table(statement: exp.Expression | None) -> exp.Table | None:
    """The table a CREATE TABLE of a catalog table makes (not a worker-local one: plain DuckDB keeps keys), or None."""
    if not isinstance(statement, exp.Create) or statement.kind != "TABLE":
        return None
    table = statement.find(exp.Table)
    if table is None or (table.catalog or table.db) == LOCAL_DB:
        return None
    return table


def _keys(statement: exp.Expression) -> bool:
    return statement.find(exp.PrimaryKeyColumnConstraint, exp.PrimaryKey, exp.UniqueColumnConstraint) is not None


@functools.lru_cache(maxsize=1024)
def drop_constraints(sql: str) -> tuple[str, list[str]]:
    """`sql` with every PRIMARY KEY and UNIQUE (column and table constraints, named or not) removed from its CREATE
    TABLEs of catalog tables, and one warning per table. A primary key's columns stay NOT NULL (a key is never NULL,
    and DuckLake does enforce NOT NULL). Only those constraints' text changes: the rest of the statement, the other
    statements and the comments stay as written. Templates (`{{ x }}`) may be in the text; a command with a block tag
    (`{% %}`) is left as it is (its rendered text is what runs)."""
    masked = _masked(sql)
    if masked is None:
        return sql, []
    text, names = masked
    spans = _statement_spans(text)
    if spans is None:
        return sql, []
    edits, warnings = [], []
    for start, end in spans:
        try:
            statement = sqlglot.parse_one(text[start:end], read="duckdb")
        except (ParseError, TokenError):
            continue  # DuckDB will say what does not parse
        table = _lake_create_table(statement)
        if table is None or not _keys(statement):
            continue
        found = _key_edits(text, start, end)
        if found is None:
            continue  # not a column list the tokens can be read from: left for unsupported_constraint to refuse
        mine, removed, kept = found
        edits += mine
        it = "them" if len(removed) > 1 else "it"
        stays = f" ({', '.join(kept)} {'stay' if len(kept) > 1 else 'stays'} NOT NULL)" if kept else ""
        line = f"{table.sql('duckdb')}: {', '.join(removed)} removed: DuckLake cannot enforce {it}{stays}"
        warnings.append(_unmasked(line, names))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return _unmasked(text, names), warnings


def _key_edits(text: str, start: int, end: int) -> tuple[list[tuple[int, int, str]], list[str], list[str]] | None:
    """The edits (start, end, replacement) that take the keys out of the CREATE TABLE at text[start:end], what
    they removed (`PRIMARY KEY (id)`, `UNIQUE (email)`) and the key columns that stay NOT NULL, found from the statement's tokens: its column list is the
    first parenthesis, each column or table constraint one comma-separated item of it."""
    tokens = list(DuckDB().tokenize(text[start:end]))
    for t in tokens:
        t.start, t.end = t.start + start, t.end + start
    items, depth, current = [], 0, None
    for i, t in enumerate(tokens):
        if t.token_type == TokenType.L_PAREN:
            depth += 1
            if depth == 1 and current is None and not items:
                current = []
                continue
        elif t.token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0 and current is not None:
                items.append(current)
                break
        if current is None:
            continue
        if depth == 1 and t.token_type == TokenType.COMMA:
            items.append(current)
            current = []
        else:
            current.append(i)
    if not items or not all(items):
        return None
    edits, removed, kept, not_null = [], [], [], set()
    columns: dict[str, list[int]] = {}
    for n, item in enumerate(items):
        first = tokens[item[0]]
        kinds = [tokens[i].token_type for i in item]
        if first.token_type in (TokenType.PRIMARY_KEY, TokenType.UNIQUE, TokenType.CONSTRAINT):
            key = TokenType.PRIMARY_KEY if TokenType.PRIMARY_KEY in kinds else TokenType.UNIQUE
            if key not in kinds or (first.token_type == TokenType.CONSTRAINT and kinds[2] not in (key,)):
                continue  # CONSTRAINT name CHECK (...): DuckLake's to judge
            at = kinds.index(key)
            cols = [
                tokens[i].text for i in item[at + 1 :] if tokens[i].token_type in (TokenType.VAR, TokenType.IDENTIFIER)
            ]
            word = "PRIMARY KEY" if key == TokenType.PRIMARY_KEY else "UNIQUE"
            removed.append(f"{word} ({', '.join(cols)})")
            if key == TokenType.PRIMARY_KEY:
                not_null.update(c.lower() for c in cols)
            # the item and one comma beside it: the one before it, or (the first item) the one after it
            if n > 0:
                before = tokens[item[0] - 1]  # the comma
                edits.append((before.start, tokens[item[-1]].end + 1, ""))
            elif len(items) > 1:
                edits.append((first.start, tokens[items[1][0]].start, ""))
            else:
                return None  # a table of constraints only: nothing sensible is left
            continue
        columns[first.text.lower()] = item
        has_not_null = any(
            tokens[i].token_type == TokenType.NOT and tokens[i + 1].token_type == TokenType.NULL for i in item[:-1]
        )
        for j, i in enumerate(item):
            t = tokens[i]
            if t.token_type not in (TokenType.PRIMARY_KEY, TokenType.UNIQUE):
                continue
            lo = i
            if j >= 2 and tokens[item[j - 2]].token_type == TokenType.CONSTRAINT:
                lo = item[j - 2]
            prev_end = tokens[lo - 1].end + 1
            if t.token_type == TokenType.PRIMARY_KEY:
                removed.append(f"PRIMARY KEY ({first.text})")
                kept.append(first.text)
                if not has_not_null:
                    edits.append((prev_end, t.end + 1, " NOT NULL"))
                    has_not_null = True
                    continue
            else:
                removed.append(f"UNIQUE ({first.text})")
            edits.append((prev_end, t.end + 1, ""))
    for name in sorted(not_null):
        item = columns.get(name)
        if item is None:
            continue
        kept.append(tokens[item[0]].text)
        if any(tokens[i].token_type == TokenType.NOT and tokens[i + 1].token_type == TokenType.NULL for i in item[:-1]):
            continue
        if any(e[2] == " NOT NULL" and tokens[item[0]].start <= e[0] <= tokens[item[-1]].end + 1 for e in edits):
            continue
        at = tokens[item[-1]].end + 1
        edits.append((at, at, " NOT NULL"))
    return edits, removed, sorted(set(kept), key=kept.index)


ON_CONFLICT = (
    "{upsert} cannot work on DuckLake: its tables have no PRIMARY KEY or UNIQUE constraint for a row to conflict with "
    "(table {table}); "
)


@functools.lru_cache(maxsize=1024)
def on_conflict_refusal(sql: str) -> str | None:
    """Why `sql` cannot run on DuckLake when it upserts (`INSERT ... ON CONFLICT ... DO UPDATE|DO NOTHING`, DuckDB's
    `INSERT OR REPLACE|IGNORE`) into a catalog table, with the `MERGE INTO` that does the same written out for it;
    None otherwise. Templates (`{{ x }}`) stay as written in the MERGE."""
    masked = _masked(sql)
    if masked is None:
        return None
    text, names = masked
    try:
        statements = sqlglot.parse(text, read="duckdb")
    except (ParseError, TokenError):
        return None
    for stmt in statements:
        if not isinstance(stmt, exp.Insert):
            continue
        conflict, alternative = stmt.args.get("conflict"), str(stmt.args.get("alternative") or "").upper()
        if conflict is None and alternative not in ("REPLACE", "IGNORE"):
            continue
        target = stmt.this.this if isinstance(stmt.this, exp.Schema) else stmt.this
        if not isinstance(target, exp.Table) or (target.catalog or target.db) == LOCAL_DB:
            continue  # a worker-local table is plain DuckDB, which has keys
        upsert = f"INSERT OR {alternative}" if conflict is None else "INSERT ... ON CONFLICT"
        why = ON_CONFLICT.format(upsert=upsert, table=target.sql("duckdb"))
        return _unmasked(why + _merge_advice(stmt, target, conflict, alternative), names)
    return None


def _merge_advice(stmt: exp.Insert, target: exp.Table, conflict: exp.OnConflict | None, alternative: str) -> str:
    """`write it as: MERGE INTO ...` for the upsert `stmt`, built from its tree."""
    if not isinstance(stmt.this, exp.Schema) or not stmt.this.expressions:
        return (
            "write it as a MERGE INTO (name the INSERT's columns, INSERT INTO t (a, b) ..., and this line shows the "
            "MERGE for it)"
        )
    columns = [c.name for c in stmt.this.expressions]
    keys = [o.this.name for o in (conflict.args.get("conflict_keys") or [])] if conflict is not None else []
    assumed = not keys
    keys = keys or columns[:1]
    update = conflict is not None and str(conflict.args["action"].this).upper() == "DO UPDATE"
    update = update or alternative == "REPLACE"
    merge = exp.Merge(
        this=_aliased(target, "target"),
        using=_source(stmt.expression, columns),
        on=exp.and_(*(exp.EQ(this=exp.column(k, "target"), expression=exp.column(k, "source")) for k in keys)),
        whens=exp.Whens(expressions=_whens(conflict, columns, keys, update, target.name)),
    )
    note = f" (it assumes the key is {keys[0]}: put your key columns in ON)" if assumed else ""
    return f"write it as: {merge.sql('duckdb')}{note}"


def _aliased(table: exp.Table, alias: str) -> exp.Table:
    out = table.copy()
    out.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    return out


def _source(query: exp.Expression, columns: list[str]) -> exp.Expression:
    """The INSERT's rows (VALUES or a query) as `(...) AS source(columns)`."""
    alias = exp.TableAlias(this=exp.to_identifier("source"), columns=[exp.to_identifier(c) for c in columns])
    rows = query.copy()
    if isinstance(rows, exp.Values):
        rows.set("alias", alias)
        return rows
    return exp.Subquery(this=rows, alias=alias)


def _whens(
    conflict: exp.OnConflict | None, columns: list[str], keys: list[str], update: bool, table: str
) -> list[exp.When]:
    whens = []
    if update:
        if conflict is not None and conflict.expressions:
            sets = [_from_excluded(e.copy(), table) for e in conflict.expressions]
        else:  # INSERT OR REPLACE: every column but the key, from the new row
            lowered = {k.lower() for k in keys}
            sets = [
                exp.EQ(this=exp.column(c), expression=exp.column(c, "source"))
                for c in columns
                if c.lower() not in lowered
            ]
        where = conflict.args.get("where") if conflict is not None else None
        condition = _from_excluded(where.this.copy(), table) if where is not None else None
        whens.append(exp.When(matched=True, condition=condition, then=exp.Update(expressions=sets)))
    whens.append(
        exp.When(
            matched=False,
            then=exp.Insert(
                this=exp.Tuple(expressions=[exp.column(c) for c in columns]),
                expression=exp.Tuple(expressions=[exp.column(c, "source") for c in columns]),
            ),
        )
    )
    return whens


def _from_excluded(node: exp.Expression, table: str) -> exp.Expression:
    """An ON CONFLICT expression in MERGE's names: `excluded.x` is `source.x`; `x` and `<table>.x` on the right of
    a SET, or in its WHERE, are the row already there, `target.x` (the SET's left side stays a bare column)."""
    left = node.this if isinstance(node, exp.EQ) and node.parent is None and isinstance(node.this, exp.Column) else None
    for column in list(node.find_all(exp.Column)):
        if column is left:
            continue
        qualifier = column.table.lower()
        if qualifier == "excluded":
            column.set("table", exp.to_identifier("source"))
        elif not qualifier or qualifier == table.lower():
            column.set("table", exp.to_identifier("target"))
    return node
