"""What every command shares: the app, the context (the Kit: platform, state folder, worker plane), the error edge (one line on
stderr or a JSON error envelope, and its exit code), `--json`, and the progress printer."""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any

import duckdb
import typer

from ducklake_kit.cli.output import console, print_json
from ducklake_kit.errors import KitError, first_line
from ducklake_kit.platforms.kit import Kit as Kit  # ctx.obj: what the global options built
from ducklake_kit.platforms.report import LineReporter, Reporter, reporter_for

app = typer.Typer(
    help="ducklake-kit: a DuckLake learning lab (DuckDB engine, PostgreSQL catalog, Parquet on S3).\n\n"
    "Exit codes: 0 ok, 1 a check failed, 2 usage error, 3 bad input, an environment problem or a declined confirmation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = Annotated[bool, typer.Option("--json", help='Print {"status", "result", "catalog_info"} as JSON.')]


def command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn KitError into one line on stderr (or a JSON error envelope) and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KitError as exc:
            _fail(exc, kwargs.get("as_json") is True)
        except _service_errors() as exc:
            # a service failed in a place without its own explanation: still one line, not a traceback
            first = first_line(exc)
            _fail(
                KitError(f"{type(exc).__name__}: {first}", "run `status` to see whether the services answer"),
                kwargs.get("as_json") is True,
            )
        except OSError as exc:
            if exc.errno not in _CANNOT_WRITE or exc.filename is None:
                raise
            _fail(_cannot_write(exc, args, kwargs), kwargs.get("as_json") is True)

    return wrapper


def _service_errors() -> tuple[type[BaseException], ...]:
    """The libraries' errors the edge turns into one line. psycopg's and botocore's only once imported (a command that
    opened no PostgreSQL connection or S3 client cannot raise them), so the commands that use neither import neither."""
    pg, boto = sys.modules.get("psycopg"), sys.modules.get("botocore.exceptions")
    return (duckdb.Error, *((pg.Error,) if pg else ()), *((boto.BotoCoreError, boto.ClientError) if boto else ()))


# a file or folder the command had to create or write, and could not: one line, not a traceback
_CANNOT_WRITE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.ENOSPC, errno.EDQUOT}


def _cannot_write(exc: OSError, args: tuple, kwargs: dict) -> KitError:
    ctx = kwargs.get("ctx") or next((a for a in args if isinstance(a, typer.Context)), None)
    home = getattr(getattr(getattr(ctx, "obj", None), "state", None), "home", None)
    path = str(exc.filename)
    if home is not None and path.startswith(str(home)):
        return KitError(
            f"cannot use the state folder {home} ({exc.strerror}: {path})",
            "point DUCKLAKE_HOME (or --home) at a folder you can write, or make this one writable",
        )
    return KitError(f"cannot use {path} ({exc.strerror})", "check the path and its permissions")


def _fail(exc: KitError, as_json: bool) -> None:
    if as_json:
        print_json("error", {"error": exc.line(), "detail": exc.detail})
    else:
        typer.echo(exc.line(), err=True)  # one line, never wrapped
        if exc.detail:
            typer.echo(exc.detail, err=True)
    raise typer.Exit(exc.exit_code)


def reporter(as_json: bool) -> Reporter:
    """Where a command's progress goes: bars and lines when stdout is a terminal, lines in a pipe; under `--json`
    lines on stderr, so stdout carries only the envelope."""
    return LineReporter(console(stderr=True)) if as_json else reporter_for(console())
