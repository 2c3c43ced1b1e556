"""The one way into the lake: the connection, transactions with commit messages, the change feed, inventory and
fingerprints, the catalog's advisory locks, and SQL quoting. Everything above (taxi, lessons, bench, cli) uses
these instead of writing its own."""

from ducklake_kit.lake.connection import (
    DUCKLAKE_GAVE_UP,
    EXTENSIONS,
    LAKE,
    RETRY_SETTINGS,
    SMALL_WRITER_SETTINGS,
    Lake,
    StatementFailed,
    StatementResult,
    attach_statement,
    connect_config,
    execute_retrying,
    extension_path,
    load_statements,
    secret_statements,
    setup_statements,
)

__all__ = [
    "DUCKLAKE_GAVE_UP",
    "EXTENSIONS",
    "LAKE",
    "RETRY_SETTINGS",
    "SMALL_WRITER_SETTINGS",
    "Lake",
    "StatementFailed",
    "StatementResult",
    "attach_statement",
    "connect_config",
    "execute_retrying",
    "extension_path",
    "load_statements",
    "secret_statements",
    "setup_statements",
]
