"""Jinja2 for playbooks: an undefined name is an error naming it (StrictUndefined), never ''; values go into SQL
through the `sql` filter (a safe SQL literal) or, better, as `params:` (prepared-statement parameters).

Templates run in Jinja2's sandbox (no access to Python's internals). Text (SQL, DSNs) renders to a string; a value (a loop's collection, params, vars, `when`) that is exactly one
`{{ expression }}` is that expression's value, so `{{ user_ids }}` stays a list, `{{ count > 0 }}` a boolean and
"007" text."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import SandboxedEnvironment

from ducklake_kit.errors import KitError
from ducklake_kit.lake.sql import quote_ident, quote_literal

# names every template may use besides the workload's keys, the steps' names and the vars
BUILTINS = {"workload", "vars", "execution_id", "loop", "result", "catalog_info", "event", "status", "playbook"}


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


def _configure(env: jinja2.Environment) -> jinja2.Environment:
    env.filters["sql"] = sql_literal
    env.filters["ident"] = quote_ident
    return env


# sandboxed: a playbook is input, and one from elsewhere must not reach Python's internals ({{ x.__class__ }})
_TEXT = _configure(SandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True))


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
    if len(body) != 1 or not isinstance(body[0], jinja2.nodes.Output) or len(body[0].nodes) != 1 \
            or isinstance(body[0].nodes[0], jinja2.nodes.TemplateData):
        return None
    return _TEXT.compile_expression(text[2:-2], undefined_to_none=False)


class TemplateError(KitError):
    """A template that does not parse, or names something undefined."""


def _explain(template: str, exc: Exception) -> TemplateError:
    if isinstance(exc, jinja2.UndefinedError):
        return TemplateError(f"{exc.message} in {template.strip()[:80]!r}",
                             "define it under `workload:` (or `--set name=value`), or check the spelling")
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return TemplateError(f"template syntax error ({exc.message}) in {template.strip()[:80]!r}", "fix the {{ ... }}")
    return TemplateError(f"{type(exc).__name__}: {exc} in {template.strip()[:80]!r}", "fix the template")


def render_text(template: str, context: dict[str, Any]) -> str:
    try:
        return _text_template(template).render(context)
    except Exception as exc:  # noqa: BLE001 - any failure in a user's template is that template's error
        raise _explain(template, exc) from None


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
