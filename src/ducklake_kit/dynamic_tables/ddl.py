"""The dynamic-table language: a small prefix parser over sqlglot's DuckDB tokens (strings, comments and `;`
inside them are sqlglot's business, never a regex's), with the defining query parsed by sqlglot itself.

    CREATE [OR REPLACE] [TRANSIENT] DYNAMIC TABLE [lake.][schema.]name [(column, ...)]
      TARGET_LAG = '<n> seconds|minutes|hours|days' | DOWNSTREAM   -- or LAG = (Snowflake's older spelling)
      [REFRESH_MODE = ADAPTIVE | AUTO | FULL | INCREMENTAL]   -- default ADAPTIVE (AUTO means ADAPTIVE)
      [INITIALIZE = ON_CREATE | ON_SCHEDULE]       -- default ON_CREATE
      [COMMENT = '...']
      [IMMUTABLE WHERE (<condition over the table's columns>)]   -- rows matching it are never recomputed
    AS SELECT ...;

Snowflake's DDL is taken as written: the properties that mean nothing on one DuckLake (WAREHOUSE,
INITIALIZATION_WAREHOUSE, CLUSTER BY (...), DATA_RETENTION_TIME_IN_DAYS, MAX_DATA_EXTENSION_TIME_IN_DAYS, TRANSIENT,
COPY GRANTS, [WITH] TAG (...), REQUIRE USER) are kept in `ignored` and said once at create; the ones whose meaning
the kit would drop (row access and aggregation policies, BACKFILL FROM, column types) are refused in one line.
sqlglot's Snowflake dialect reads most of this head too, but takes any
`KEY = value` as a property and turns IMMUTABLE WHERE into an opaque command: the checks and their messages are ours
(tests compare our reading with sqlglot's).
    ALTER DYNAMIC TABLE name SUSPEND | RESUME | REFRESH | SET TARGET_LAG = ...;
    DROP DYNAMIC TABLE [IF EXISTS] name;
    SHOW DYNAMIC TABLES;
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from ducklake_kit.errors import KitError
from ducklake_kit.lake.connection import LAKE

DIALECT = "duckdb"
MODES = ("ADAPTIVE", "FULL", "INCREMENTAL")
# Snowflake's AUTO now resolves to ADAPTIVE for new tables (2026-11-20): so here, and it is stored as ADAPTIVE
AUTO = "AUTO"
INITIALIZE = ("ON_CREATE", "ON_SCHEDULE")
UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
DOWNSTREAM = "DOWNSTREAM"
# the longest lag: whole days that fit the metadata's `lag_seconds integer` column (PostgreSQL's int4, 2^31 - 1)
MAX_LAG_DAYS = (2**31 - 1) // UNITS["day"]
SYNTAX_FIX = "write e.g. CREATE DYNAMIC TABLE daily TARGET_LAG = '5 minutes' AS SELECT ...; see `dynamic create --help`"


# Functions whose answer differs on every call: no refresh could ever equal the query run again, so `refresh --check`
# would fail forever. Refused at create (sqlglot folds rand() into Rand and gen_random_uuid() into Uuid).
RANDOM_FUNCTIONS = (exp.Rand, exp.Randn, exp.Randstr, exp.Uuid)
RANDOM_NAMES = {"random", "uuid", "gen_random_uuid", "uuidv4", "uuidv7", "random_uuid", "setseed", "nextval"}
# Functions of the clock: a table is right as of its refresh, but its query run later answers differently, so it
# cannot be compared with a full recompute (today() and get_current_time() fold into CurrentDate and CurrentTime).
TIME_FUNCTIONS = (
    exp.CurrentTimestamp,
    exp.CurrentDate,
    exp.CurrentTime,
    exp.CurrentDatetime,
    exp.CurrentTimestampLTZ,
    exp.Localtime,
    exp.Localtimestamp,
    exp.Systimestamp,
)
TIME_NAMES = {
    "now",
    "get_current_timestamp",
    "transaction_timestamp",
    "current_localtimestamp",
    "current_localtime",
    "get_current_time",
    "today",
}


def calls(query: exp.Expression, text: str, classes: tuple, names: set[str]) -> list[str]:
    """The functions of `classes` or `names` anywhere in `query` (subqueries and CTEs included), each named as
    written in `text` (the text sqlglot parsed: its nodes keep their offsets)."""
    found: list[str] = []
    for node in query.walk(bfs=False):  # depth first: in the order they are written
        if isinstance(node, classes) or (isinstance(node, exp.Anonymous) and str(node.this).lower() in names):
            start, end = node.meta.get("start"), node.meta.get("end")
            if start is None or end is None:  # a keyword sqlglot built without its token (CURRENT_TIMESTAMP)
                call = node.sql(DIALECT).lower()
            else:
                written = text[start : end + 1]
                call = f"{written}()" if text[end + 1 :].lstrip().startswith("(") else written
            if call not in found:
                found.append(call)
    return found


def random_calls(query: exp.Expression, text: str) -> list[str]:
    return calls(query, text, RANDOM_FUNCTIONS, RANDOM_NAMES)


def time_calls(query: exp.Expression, text: str) -> list[str]:
    return calls(query, text, TIME_FUNCTIONS, TIME_NAMES)


class DdlError(KitError):
    def __init__(self, what: str, fix: str = SYNTAX_FIX):
        super().__init__(what, fix)


@dataclass(frozen=True)
class Lag:
    """A target lag: seconds, or DOWNSTREAM (refreshed when a dynamic table that reads it refreshes)."""

    seconds: int | None  # None: DOWNSTREAM

    @property
    def downstream(self) -> bool:
        return self.seconds is None

    def __str__(self) -> str:
        if self.seconds is None:
            return DOWNSTREAM
        for unit, size in reversed(UNITS.items()):
            if self.seconds % size == 0:
                n = self.seconds // size
                return f"{n} {unit}{'s' if n != 1 else ''}"
        return f"{self.seconds} seconds"  # unreachable: every whole number of seconds divides by 1


def parse_lag(text: str) -> Lag:
    """'5 minutes' -> Lag(300); 'DOWNSTREAM' -> Lag(None)."""
    if text.strip().upper() == DOWNSTREAM:
        return Lag(None)
    parts = text.split()
    unit = parts[1].lower().rstrip("s") if len(parts) == 2 else ""
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if len(parts) != 2 or not (parts[0].isascii() and parts[0].isdigit()) or unit not in UNITS or int(parts[0]) <= 0:
        raise DdlError(
            f"TARGET_LAG '{text}' is not a lag",
            "give a positive whole number and a unit, "
            "e.g. TARGET_LAG = '30 seconds' | '5 minutes' | '1 hour' | '1 day', or TARGET_LAG = DOWNSTREAM",
        )
    seconds = int(parts[0]) * UNITS[unit]
    if seconds > MAX_LAG_DAYS * UNITS["day"]:
        raise DdlError(
            f"TARGET_LAG '{text}' is too long: the longest lag is {MAX_LAG_DAYS} days",
            f"give at most '{MAX_LAG_DAYS} days', or TARGET_LAG = DOWNSTREAM",
        )
    return Lag(seconds)


@dataclass(frozen=True)
class CreateDynamicTable:
    name: str  # schema.table
    lag: Lag
    query: str  # the defining SELECT, as written
    select: exp.Expression  # the same, parsed by sqlglot
    refresh_mode: str = "ADAPTIVE"
    initialize: str = "ON_CREATE"
    or_replace: bool = False
    text: str = ""  # the whole statement, as written
    comment: str | None = None
    ignored: tuple[str, ...] = ()  # Snowflake's properties that mean nothing here, as written (WAREHOUSE = wh)
    immutable_where: str | None = None  # IMMUTABLE WHERE's condition, as written (DuckDB SQL over the columns)


@dataclass(frozen=True)
class AlterDynamicTable:
    name: str
    action: str  # SUSPEND | RESUME | REFRESH | SET_LAG
    lag: Lag | None = None


@dataclass(frozen=True)
class DropDynamicTable:
    name: str
    if_exists: bool = False


@dataclass(frozen=True)
class ShowDynamicTables:
    pass


Statement = CreateDynamicTable | AlterDynamicTable | DropDynamicTable | ShowDynamicTables


def _tokens(text: str) -> list[Token]:
    try:
        return sqlglot.Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError as exc:
        raise DdlError(f"the SQL does not tokenize ({str(exc).splitlines()[0]})", "check quotes and comments") from None


def split_statements(text: str) -> list[tuple[str, list[Token]]]:
    """(statement text, its tokens) for each statement of `text`, split at sqlglot's `;` tokens."""
    out: list[tuple[str, list[Token]]] = []
    current: list[Token] = []
    for tok in [*_tokens(text), None]:
        if tok is None or tok.token_type == TokenType.SEMICOLON:
            if current:
                out.append((text[current[0].start : current[-1].end + 1], current))
            current = []
        else:
            current.append(tok)
    return out


def _word(tok: Token | None) -> str:
    return tok.text.upper() if tok is not None and tok.token_type != TokenType.STRING else ""


def is_dynamic(tokens: list[Token]) -> bool:
    """Whether a statement's tokens are dynamic-table DDL (CREATE [OR REPLACE] DYNAMIC, ALTER/DROP/SHOW DYNAMIC)."""
    words = [_word(t) for t in tokens[:5]]
    if words[:1] == ["CREATE"]:  # CREATE [OR REPLACE] [TRANSIENT] DYNAMIC
        rest = words[3:] if words[1:3] == ["OR", "REPLACE"] else words[1:]
        return rest[: 2 if rest[:1] == ["TRANSIENT"] else 1][-1:] == ["DYNAMIC"]
    return len(words) > 1 and words[0] in ("ALTER", "DROP", "SHOW") and words[1] == "DYNAMIC"


def has_dynamic(text: str) -> bool:
    """Whether `text` holds a dynamic-table statement (False when sqlglot cannot tokenize it: then it is DuckDB's
    alone to read)."""
    try:
        return any(is_dynamic(tokens) for _, tokens in split_statements(text))
    except DdlError:
        return False


class _Reader:
    def __init__(self, text: str, tokens: list[Token]):
        self.text, self.tokens, self.i = text, tokens, 0

    def peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self) -> Token | None:
        tok = self.peek()
        self.i += 1
        return tok

    def accept(self, *words: str) -> bool:
        if all(_word(self.peek(k)) == w for k, w in enumerate(words)):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            got = self.peek()
            raise DdlError(
                f"expected {' '.join(words)} but found {got.text if got else 'the end'!r} in `{self.text[:80]}`"
            )

    def name(self) -> str:
        parts = []
        while True:
            tok = self.take()
            if tok is None or (
                tok.token_type not in (TokenType.VAR, TokenType.IDENTIFIER) and not tok.text.isidentifier()
            ):
                raise DdlError(f"expected a table name ([schema.]name) in `{self.text[:80]}`")
            if "." in tok.text or not tok.text:
                raise DdlError(
                    f"'{tok.text}' is not a dynamic table name",
                    "name it as table or schema.table of the lake, without dots inside a name",
                )
            parts.append(tok.text)
            if _word(self.peek()) != ".":
                break
            self.take()
        if len(parts) == 3 and parts[0].lower() == LAKE:
            parts = parts[1:]  # lake.schema.table: the lake is the only database here
        if len(parts) > 2:
            raise DdlError(
                f"'{'.'.join(parts)}' is not a dynamic table name",
                f"name it as table, schema.table or {LAKE}.schema.table (the lake is the only database here), "
                "e.g. main.daily_revenue",
            )
        return ".".join(parts if len(parts) == 2 else ["main", *parts]).lower()

    def group(self) -> str:
        """A parenthesised group (its brackets balanced, strings being tokens), as written."""
        first = self.peek()
        if _word(first) != "(":
            raise DdlError(f"expected ( but found {first.text if first else 'the end'!r} in `{self.text[:80]}`")
        depth = 0
        while True:
            tok = self.take()
            if tok is None:
                raise DdlError(f"a ( is not closed in `{self.text[:80]}`", "close it with )")
            depth += {"(": 1, ")": -1}.get(_word(tok), 0)
            if depth == 0:
                return self.text[first.start - self.tokens[0].start : tok.end - self.tokens[0].start + 1]

    def value(self) -> Token:
        self.expect("=")
        tok = self.take()
        if tok is None:
            raise DdlError(f"a property has no value in `{self.text[:80]}`")
        return tok

    def end(self) -> None:
        if self.peek() is not None:
            raise DdlError(f"unexpected {self.peek().text!r} in `{self.text[:80]}`")


def _lag(tok: Token) -> Lag:
    if tok.token_type == TokenType.STRING or _word(tok) == DOWNSTREAM:
        return parse_lag(tok.text)
    raise DdlError(
        f"TARGET_LAG = {tok.text} is not a lag", "quote it, e.g. TARGET_LAG = '5 minutes', or write DOWNSTREAM"
    )


def parse_statement(text: str, tokens: list[Token] | None = None) -> Statement:
    """One dynamic-table statement (DdlError, one line, when it is not one)."""
    tokens = tokens if tokens is not None else _tokens(text)
    r = _Reader(text, tokens)
    if r.accept("SHOW", "DYNAMIC", "TABLES"):
        r.end()
        return ShowDynamicTables()
    if r.accept("DROP", "DYNAMIC", "TABLE"):
        if_exists = r.accept("IF", "EXISTS")
        name = r.name()
        r.end()
        return DropDynamicTable(name, if_exists)
    if r.accept("ALTER", "DYNAMIC", "TABLE"):
        name = r.name()
        for action in ("SUSPEND", "RESUME", "REFRESH"):
            if r.accept(action):
                r.end()
                return AlterDynamicTable(name, action)
        r.expect("SET", "TARGET_LAG")
        lag = _lag(r.value())
        r.end()
        return AlterDynamicTable(name, "SET_LAG", lag)
    r.expect("CREATE")
    or_replace = r.accept("OR", "REPLACE")
    ignored = ["TRANSIENT"] if r.accept("TRANSIENT") else []  # Snowflake's Fail-safe: no such thing here
    r.expect("DYNAMIC", "TABLE")
    if r.accept("IF", "NOT", "EXISTS"):
        raise DdlError(
            "CREATE DYNAMIC TABLE IF NOT EXISTS is not supported",
            "write CREATE DYNAMIC TABLE (an error when it exists) or CREATE OR REPLACE DYNAMIC TABLE",
        )
    name = r.name()
    columns = _column_list(r, name) if _word(r.peek()) == "(" else None
    props, comment = _properties(r, name, ignored)
    immutable = _immutable(props.pop("IMMUTABLE", None), name)
    if "TARGET_LAG" not in props:
        raise DdlError(
            f"dynamic table {name} has no TARGET_LAG", "add TARGET_LAG = '5 minutes' (or DOWNSTREAM) before AS SELECT"
        )
    mode = _word(props.get("REFRESH_MODE")) or "ADAPTIVE"
    init = _word(props.get("INITIALIZE")) or "ON_CREATE"
    mode = "ADAPTIVE" if mode == AUTO else mode
    if mode not in MODES:
        raise DdlError(
            f"REFRESH_MODE = {props['REFRESH_MODE'].text} is not a mode", "use ADAPTIVE (or AUTO), FULL or INCREMENTAL"
        )
    if init not in INITIALIZE:
        raise DdlError(f"INITIALIZE = {props['INITIALIZE'].text} is not an option", "use ON_CREATE or ON_SCHEDULE")
    first = r.peek()
    if first is None:
        raise DdlError(f"dynamic table {name} has no query after AS")
    query = text[first.start - tokens[0].start :]  # token offsets count from the start of the text tokenized
    try:
        select = sqlglot.parse_one(query, read=DIALECT)
    except ParseError as exc:
        raise DdlError(
            f"the query of dynamic table {name} does not parse ({str(exc).splitlines()[0]})", "fix the SELECT after AS"
        ) from None
    while isinstance(select, exp.Subquery) and not select.alias:  # AS (SELECT ...)
        select = select.this
    if not isinstance(select, exp.Query):
        raise DdlError(
            f"dynamic table {name} is defined by a {select.key.upper()} statement, not a query", "write AS SELECT ..."
        )
    random = random_calls(select, query)
    if random:
        raise DdlError(
            f"the query of dynamic table {name} calls {', '.join(random)}, which is not deterministic "
            "(a new answer on every run): no refresh could equal the query run in full",
            f"keep {random[0]} out of a dynamic table: store its values in a table the query reads",
        )
    if columns is not None:
        query, select = _named(query.strip(), select, columns, name)
    return CreateDynamicTable(
        name,
        _lag(props["TARGET_LAG"]),
        query.strip(),
        select,
        mode,
        init,
        or_replace,
        text,
        comment,
        tuple(ignored),
        immutable,
    )


def _immutable(group: str | None, name: str) -> str | None:
    """IMMUTABLE WHERE's condition (the group after WHERE, brackets included) checked: one expression, over columns
    of the table (no table names, no subquery), deterministic; returned as written. The clock is allowed (Snowflake's
    own example freezes the rows older than a day), a random function is not."""
    if group is None:
        return None
    fix = "write IMMUTABLE WHERE (a condition over the dynamic table's columns), e.g. IMMUTABLE WHERE (day < '2024-01-01')"
    try:
        cond = sqlglot.parse_one(group, read=DIALECT)
    except ParseError as exc:
        raise DdlError(
            f"the IMMUTABLE WHERE of dynamic table {name} does not parse ({str(exc).splitlines()[0]})", fix
        ) from None
    if any(isinstance(n, (exp.Select, exp.Subquery, exp.AggFunc, exp.Window)) for n in cond.walk()) or any(
        c.table for c in cond.find_all(exp.Column)
    ):
        raise DdlError(
            f"the IMMUTABLE WHERE of dynamic table {name} must read only the table's own columns (no table name, "
            "subquery, aggregate or window)",
            fix,
        )
    random = random_calls(cond, group)
    if random:
        raise DdlError(f"the IMMUTABLE WHERE of dynamic table {name} calls {', '.join(random)}", fix)
    return group


# Snowflake's properties that mean nothing on one DuckLake: kept as written, said once at create
IGNORED = {"WAREHOUSE", "INITIALIZATION_WAREHOUSE", "DATA_RETENTION_TIME_IN_DAYS", "MAX_DATA_EXTENSION_TIME_IN_DAYS"}
# ... and the ones whose meaning the kit would drop without a word: refused, with why
REFUSED = {
    "BACKFILL": "BACKFILL FROM is not supported (a dynamic table is filled from its query)",
    "ROW": "row access policies are not supported: the kit would show every row",
    "AGGREGATION": "aggregation policies are not supported: the kit would not enforce them",
    "MASKING": "masking policies are not supported: the kit would not mask",
    "EXECUTE": "EXECUTE AS USER is not supported: refreshes run as the kit's own catalog user",
}


def _properties(r: _Reader, name: str, ignored: list[str]) -> tuple[dict[str, Token], str | None]:
    """The properties up to AS: TARGET_LAG (or LAG), REFRESH_MODE, INITIALIZE, COMMENT; Snowflake's others are
    appended to `ignored` as written, or refused (see REFUSED)."""
    props: dict[str, Token] = {}
    comment = None
    while not r.accept("AS"):
        start, tok = r.peek(), r.take()
        key = {"LAG": "TARGET_LAG"}.get(_word(tok), _word(tok))
        if key == "WITH" and _word(r.peek()) in ("TAG", "ROW", "AGGREGATION", "MASKING"):
            key = _word(r.take())
        if key in REFUSED:
            raise DdlError(
                f"{REFUSED[key]}: dynamic table {name}", "leave it out of the statement (and say so to its readers)"
            )
        if key == "IMMUTABLE":
            r.expect("WHERE")
            if "IMMUTABLE" in props:
                raise DdlError(f"IMMUTABLE WHERE is given twice for dynamic table {name}")
            props[key] = r.group()  # type: ignore[assignment]  # a text, popped by the caller
        elif key in ("CLUSTER", "CLUSTER BY"):  # sqlglot's tokenizer reads CLUSTER BY as one token
            if key == "CLUSTER":
                r.expect("BY")
            ignored.append(f"CLUSTER BY {r.group()}")
        elif key == "TAG":
            ignored.append(f"TAG {r.group()}")
        elif (key == "COPY" and r.accept("GRANTS")) or (key == "REQUIRE" and r.accept("USER")):
            ignored.append(_written(r, start))
        elif key in IGNORED:
            r.value()
            ignored.append(_written(r, start))
        elif key == "COMMENT":
            value = r.value()
            if value.token_type != TokenType.STRING:
                raise DdlError(f"COMMENT = {value.text} is not a string", "quote it: COMMENT = 'what it holds'")
            comment = value.text
        elif key in ("TARGET_LAG", "REFRESH_MODE", "INITIALIZE"):
            if key in props:
                raise DdlError(f"{key} is given twice for dynamic table {name}")
            props[key] = r.value()
        else:
            raise DdlError(
                f"unknown property {tok.text if tok else 'nothing'!r} of dynamic table {name} (expected "
                "TARGET_LAG, REFRESH_MODE, INITIALIZE, COMMENT, one of Snowflake's or AS SELECT ...)"
            )
    return props, comment


def _written(r: _Reader, start: Token) -> str:
    """The text from `start` to the last token taken, as written."""
    last = r.tokens[r.i - 1]
    return r.text[start.start - r.tokens[0].start : last.end - r.tokens[0].start + 1]


def _column_list(r: _Reader, name: str) -> list[str]:
    """Snowflake's column list after the name: names only (the query's columns renamed in order)."""
    text = r.group()
    try:
        names = sqlglot.parse_one(f"SELECT * FROM t AS t{text}", read=DIALECT).find(exp.TableAlias).columns
    except ParseError:
        names = None
    if not names or any(not isinstance(c, exp.Identifier) for c in names):
        raise DdlError(
            f"the column list of dynamic table {name} is not a list of names ({text[:60]})",
            "give names only, e.g. (day, revenue), or name the columns in the SELECT with AS (types come from the query)",
        )
    return [c.name for c in names]


def _named(query: str, select: exp.Expression, columns: list[str], name: str) -> tuple[str, exp.Expression]:
    """The query with its output columns named as the column list says, each projection aliased in place (the
    query keeps its shape, so it refreshes as incrementally as it would without the list)."""
    if not isinstance(select, exp.Select) or any(isinstance(e, exp.Star) for e in select.expressions):
        raise DdlError(
            f"the column list of dynamic table {name} names the columns of a query that is not a plain SELECT of "
            "listed columns",
            "name the columns in the SELECT with AS instead of the list after the table name",
        )
    if len(columns) != len(select.expressions):
        raise DdlError(
            f"the column list of dynamic table {name} has {len(columns)} names for {len(select.expressions)} columns",
            "give one name per column of the SELECT",
        )
    named = select.copy()
    named.set(
        "expressions",
        [
            exp.alias_(e.unalias() if isinstance(e, exp.Alias) else e, c, quoted=True)
            for e, c in zip(named.expressions, columns)
        ],
    )
    return named.sql(DIALECT), named


def parse(text: str) -> list[Statement]:
    """Every statement of `text`; each must be dynamic-table DDL."""
    parsed = []
    for stmt_text, tokens in split_statements(text):
        if not is_dynamic(tokens):
            raise DdlError(
                f"`{stmt_text[:60]}` is not a dynamic-table statement",
                "run other SQL with `sql`; a file for `dynamic create` holds CREATE DYNAMIC TABLE statements",
            )
        parsed.append(parse_statement(stmt_text, tokens))
    if not parsed:
        raise DdlError("no statement given", SYNTAX_FIX)
    return parsed
