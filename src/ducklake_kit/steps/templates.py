"""Jinja2 for playbooks: an undefined name is an error naming it (StrictUndefined), never ''; values go into SQL
through the `sql` filter (a safe SQL literal) or, better, as `params:` (prepared-statement parameters).

A command is rendered by `render_sql`, which marks where each value pasted as it is (no `sql`/`ident` filter) landed,
so that `sqltext.pasted_values_refused` can check that none changed the statement's structure, and stops at
MAX_SQL_BYTES while rendering. `pasted` finds those raw values in a template without rendering it (validate warns).

Templates run in Jinja2's sandbox (no access to Python's internals). Text (SQL, DSNs) renders to a string; a value (a loop's collection, params, vars, `when`) that is exactly one
`{{ expression }}` is that expression's value, so `{{ user_ids }}` stays a list, `{{ count > 0 }}` a boolean and
"007" text."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
import secrets
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment

from ducklake_kit.errors import KitError
from ducklake_kit.lake.sql import quote_ident, quote_literal

# names every template may use besides the workload's keys, the steps' names and the vars; NoETL's v10 adds `ctx`
# (the workload, then what `set:` writes), `iter` (a loop iteration's own), `output` (a task's outcome, in its policy
# rules) and `step` (the current step's result)
BUILTINS = {
    "workload",
    "vars",
    "execution_id",
    "loop",
    "result",
    "catalog_info",
    "event",
    "status",
    "playbook",
    "ctx",
    "iter",
    "output",
    "step",
}


def sql_literal(value: Any) -> str:
    """A value as a DuckDB literal: NULL, TRUE, 42, 1.5, 'it''s', TIMESTAMP '...', DATE '...', [1, 2]."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no SQL literal")
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP {quote_literal(value.isoformat(sep=' '))}"
    if isinstance(value, dt.date):
        return f"DATE {quote_literal(value.isoformat())}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(sql_literal(v) for v in value) + "]"
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    return quote_literal(value)


# The most SQL one command may render to: a worker is sent the text whole (`{{ 'a' * 100000000 }}` sent 95 MiB).
# Larger data goes in through files (read_parquet) or params, not through the statement's text.
MAX_SQL_BYTES = 16 * 2**20
SAFE_FILTERS = ("sql", "ident")  # their output is one SQL literal or identifier, whatever the value


class SqlText(str):
    """Text a safe filter made (`sql`, `ident`): a whole literal or identifier, not checked as a pasted value."""


class TemplateError(KitError):
    """A template that does not parse, names something undefined, or renders too much."""


def _too_big(what: str) -> TemplateError:
    return TemplateError(
        f"{what} more than {MAX_SQL_BYTES // 2**20} MiB",
        "send large data as a file (read_parquet, read_csv) or as params:, not in the statement's text",
    )


class _Sandbox(SandboxedEnvironment):
    """Jinja's sandbox, which also refuses `*` and `**` whose result would pass MAX_SQL_BYTES before computing it
    (rendering stops at that size too, but one `'a' * 10**9` would fill the memory in one step)."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (
                    isinstance(seq, (str, list, tuple))
                    and isinstance(n, int)
                    and not isinstance(n, bool)
                    and len(seq) * n > MAX_SQL_BYTES
                ):
                    raise _too_big("a template's `*` makes")
        if (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right > 0
            and right * math.log2(abs(left)) > 8 * MAX_SQL_BYTES
        ):
            raise _too_big("a template's `**` makes a number of")
        return super().call_binop(context, operator, left, right)


def _configure(env: jinja2.Environment) -> jinja2.Environment:
    env.filters["sql"] = lambda value: SqlText(sql_literal(value))
    env.filters["ident"] = lambda name: SqlText(quote_ident(name))
    return env


# sandboxed: a playbook is input, and one from elsewhere must not reach Python's internals ({{ x.__class__ }})
_TEXT = _configure(_Sandbox(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True))

# Where a command's values landed: each `{{ }}` output that is text is put between two markers while rendering
# (Jinja's `finalize` sees every output, after its filters). The nonce is this process's own, made of digits and NUL,
# which no filter changes and no value can guess. Numbers, booleans and None are pasted as they are: one token.
_NONCE = "\x00" + "".join(secrets.choice("0123456789") for _ in range(20))
_RAW, _SAFE, _END = _NONCE + "r\x00", _NONCE + "s\x00", _NONCE + "e\x00"


def _mark(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, decimal.Decimal)):
        return value
    if isinstance(value, jinja2.Undefined):
        value._fail_with_undefined_error()
    text = str(value)
    if _NONCE in text:  # a block captured with its marks already (`{% set x %}...{% endset %}`)
        return text
    return (_SAFE if isinstance(value, SqlText) else _RAW) + text + _END


_SQL = _configure(
    _Sandbox(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True, finalize=_mark)
)


@functools.lru_cache(maxsize=1024)
def _text_template(source: str) -> jinja2.Template:
    return _TEXT.from_string(source)  # compiled once: a loop renders the same template per iteration


@functools.lru_cache(maxsize=1024)
def _expression(source: str):
    """The expression of a template that is exactly one `{{ ... }}` (None otherwise), compiled: its value is kept as
    it is ("007" stays text, [1, 2] a list), where Jinja's native mode would re-read any text as a Python literal."""
    text = source.strip()
    if not (text.startswith("{{") and text.endswith("}}")):
        return None
    body = _TEXT.parse(text).body
    if (
        len(body) != 1
        or not isinstance(body[0], jinja2.nodes.Output)
        or len(body[0].nodes) != 1
        or isinstance(body[0].nodes[0], jinja2.nodes.TemplateData)
    ):
        return None
    return _TEXT.compile_expression(text[2:-2], undefined_to_none=False)


def _explain(template: str, exc: Exception) -> TemplateError:
    if isinstance(exc, jinja2.UndefinedError):
        return TemplateError(
            f"{exc.message} in {template.strip()[:80]!r}",
            "define it under `workload:` (or `--set name=value`), or check the spelling",
        )
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return TemplateError(f"template syntax error ({exc.message}) in {template.strip()[:80]!r}", "fix the {{ ... }}")
    return TemplateError(f"{type(exc).__name__}: {exc} in {template.strip()[:80]!r}", "fix the template")


def render_text(template: str, context: dict[str, Any]) -> str:
    try:
        return _text_template(template).render(context)
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure in a user's template is that template's error
        raise _explain(template, exc) from None


@dataclass(frozen=True)
class Pasted:
    """A value pasted into a command: where it is in the rendered text and in the stand-in text (the same command
    with every value rendered as `x`), and whether a safe filter (`sql`, `ident`) made it."""

    start: int
    end: int
    standin_start: int
    safe: bool


@dataclass(frozen=True)
class RenderedSql:
    text: str
    standin: str  # the command with every value, raw or filtered, rendered as the stand-in `x`
    pasted: tuple[Pasted, ...]


STANDIN = "x"


@functools.lru_cache(maxsize=1024)
def _sql_template(source: str) -> jinja2.Template:
    return _SQL.from_string(source)


def render_sql(template: str, context: dict[str, Any]) -> RenderedSql:
    """A command rendered, with where each value landed; TemplateError past MAX_SQL_BYTES (stopped while rendering)."""
    if "{{" not in template and "{%" not in template:
        return RenderedSql(template, template, ())
    parts, size = [], 0
    try:
        for chunk in _sql_template(template).generate(context):
            size += len(chunk)  # characters: at most the bytes, checked exactly below
            if size > MAX_SQL_BYTES:
                raise _too_big("the command renders to")
            parts.append(chunk)
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure in a user's template is that template's error
        raise _explain(template, exc) from None
    marked = "".join(parts)
    text, standin, pasted = _unmark(marked, template)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SQL_BYTES:
        raise _too_big("the command renders to")
    return RenderedSql(text, standin, tuple(pasted))


def _unmark(marked: str, template: str) -> tuple[str, str, list[Pasted]]:
    text, standin, pasted, i = [], [], [], 0
    pos = spos = 0
    while True:
        start = marked.find(_NONCE, i)
        if start < 0:
            break
        kind = marked[start : start + len(_RAW)]
        end = marked.find(_END, start + len(_RAW))
        nested = marked.find(_NONCE, start + len(_RAW))
        if kind not in (_RAW, _SAFE) or end < 0 or nested != end:
            # a value's marks cut or reordered by a filter over a captured block: nothing can be told about it
            raise TemplateError(
                f"cannot tell where the values of {template.strip()[:80]!r} land in its SQL",
                "pass the values as params: ($name), or through the sql filter outside any block",
            )
        before = marked[i:start]
        value = marked[start + len(_RAW) : end]
        text.append(before)
        standin.append(before)
        pos, spos = pos + len(before), spos + len(before)
        pasted.append(Pasted(pos, pos + len(value), spos, kind == _SAFE))
        text.append(value)
        standin.append(STANDIN)
        pos, spos = pos + len(value), spos + len(STANDIN)
        i = end + len(_END)
    text.append(marked[i:])
    standin.append(marked[i:])
    return "".join(text), "".join(standin), pasted


def pasted(template: str) -> list[tuple[str, int]]:
    """The values a command template pastes as they are (no `sql` or `ident` filter, not a number written in the
    template): (the expression, its line within the template). TemplateError when it does not parse."""
    try:
        tree = _TEXT.parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise _explain(template, exc) from None
    out = []
    for output in tree.find_all(jinja2.nodes.Output):
        for node in output.nodes:
            if isinstance(node, jinja2.nodes.TemplateData):
                continue
            if isinstance(node, jinja2.nodes.Filter) and node.name in SAFE_FILTERS:
                continue
            if isinstance(node, jinja2.nodes.Const) and isinstance(node.value, (int, float)):
                continue
            out.append((_expression_text(node), node.lineno))
    return out


def _expression_text(node: jinja2.nodes.Node) -> str:
    """`who`, `row.id`, `ids[0]`: the expression as a user wrote it, as far as names and attributes go."""
    if isinstance(node, jinja2.nodes.Name):
        return node.name
    if isinstance(node, jinja2.nodes.Getattr):
        return f"{_expression_text(node.node)}.{node.attr}"
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Const):
        return f"{_expression_text(node.node)}[{node.arg.value!r}]"
    if isinstance(node, jinja2.nodes.Filter) and node.node is not None:
        return f"{_expression_text(node.node)} | {node.name}"
    return "an expression"


def render_value(value: Any, context: dict[str, Any]) -> Any:
    """A string renders natively ('{{ ids }}' -> the list); lists and mappings are rendered item by item."""
    try:
        if isinstance(value, str):
            if "{{" not in value and "{%" not in value:
                return value
            expression = _expression(value)
            if expression is None:  # text around it, or a {% %} block: text
                return _text_template(value).render(context)
            out = expression(context)
            if isinstance(out, jinja2.Undefined):  # {{ row.nope }} comes back as the Undefined itself: make it fail
                out._fail_with_undefined_error()
            return out
        if isinstance(value, list):
            return [render_value(v, context) for v in value]
        if isinstance(value, dict):
            return {k: render_value(v, context) for k, v in value.items()}
        return value
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _explain(str(value), exc) from None


def condition(template: str, context: dict[str, Any]) -> bool:
    """A `when`: '{{ expr }}' or a bare expression, true or false."""
    text = template.strip()
    try:
        if "{{" in text or "{%" in text:
            value = render_value(text, context)
        else:
            value = _TEXT.compile_expression(text, undefined_to_none=False)(context)
            if isinstance(value, jinja2.Undefined):
                value._fail_with_undefined_error()
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise _explain(text, exc) from None
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "0", "none", "no")
    return bool(value)


def names_used(template: Any) -> set[str]:
    """The top-level names a template (or every string in a list/mapping) reads; TemplateError when it does not parse."""
    if isinstance(template, list):
        return set().union(*(names_used(v) for v in template)) if template else set()
    if isinstance(template, dict):
        return set().union(*(names_used(v) for v in template.values())) if template else set()
    if not isinstance(template, str):
        return set()
    try:
        return set(jinja2.meta.find_undeclared_variables(_TEXT.parse(template)))
    except jinja2.TemplateSyntaxError as exc:
        raise _explain(template, exc) from None


def condition_names(template: str) -> set[str]:
    """The names a `when` reads ('{{ expr }}' or a bare expression)."""
    text = template.strip()
    return names_used(text if ("{{" in text or "{%" in text) else "{{ " + text + " }}")
