"""What the runner does to a rendered command before a worker runs it, with sqlglot (never a regex):

- the seed's documented time travel, `FOR SYSTEM_TIME AS OF SNAPSHOT 5` and `FOR SYSTEM_TIME AS OF '<timestamp>'`,
  does not parse in DuckDB: it is rewritten to DuckLake's `AT (VERSION => 5)` / `AT (TIMESTAMP => ...)`, with a
  warning naming the rewrite;
- `PRIMARY KEY` and `UNIQUE` (NoETL's fixtures use them) are refused before anything runs, with one clear line:
  DuckLake tables support only NOT NULL.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

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


UNSUPPORTED_CONSTRAINT = ("DuckLake tables support only NOT NULL constraints, not PRIMARY KEY or UNIQUE "
                          "(table {table}, line {line} of the command)")


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
        if table is not None and LOCAL_DB == (table.catalog or table.db):
            continue  # a worker-local table is plain DuckDB, which has keys
        for node in statement.find_all(exp.PrimaryKeyColumnConstraint, exp.PrimaryKey, exp.UniqueColumnConstraint):
            name = table.sql("duckdb") if table is not None else "?"
            return UNSUPPORTED_CONSTRAINT.format(table=name, line=_line_of(sql, node)) + \
                ": declare the key column NOT NULL instead"
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
