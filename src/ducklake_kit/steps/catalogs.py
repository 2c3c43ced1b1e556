"""Which catalog a step means: `auth` (a credential name) or `catalog_connection` (a PostgreSQL DSN), resolved on
the client into a `task.Target` the worker attaches.

`auth: kit` (the default when a step names neither) is the kit's own catalog and lake. Other credential names
come from `steps-credentials.json` in the state folder (0600, never in the repo); a name may also stand for another,
as `{"noetl_connection": "kit"}` gives NoETL's name to the kit's own. A `catalog_connection` that is a name, not a
DSN, is such a credential name (`--set catalog_connection=kit`: the kit's own catalog):

    {"analytics_pg": {"catalog_connection": "postgresql://user:password@host:5432/dbname",
                      "data_path": "s3://raw/analytics/"}}

The kit's S3 secret applies to every catalog. Passwords are never printed: errors name user, host and database.
A `catalog_connection` without a password, on the kit's own PostgreSQL server as the kit's user, gets the kit's
password: `--set catalog_connection=postgresql://USER@HOST:PORT/other_db` keeps the secret out of argv.

A `postgres` step's `auth` names a PostgreSQL database the same way: `kit` is the kit's catalog database, any other
name an entry of the credentials file, with a `connection` (a DSN) or NoETL's fields (`host`, `port`, `user`,
`password`, `database`):

    {"pg_local": {"connection": "postgresql://user:password@host:5432/dbname"},
     "noetl_connection": {"host": "127.0.0.1", "port": 5432, "user": "me", "password": "...", "database": "noetl"}}
"""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from pathlib import Path

import psycopg.conninfo

from ducklake_kit.errors import KitError
from ducklake_kit.lake import LAKE
from ducklake_kit.platforms.base import Endpoints, PgEndpoint
from ducklake_kit.steps.model import KIT_AUTH, Catalog
from ducklake_kit.steps.task import Target
from ducklake_kit.workers.config import LOCAL_DB

CREDENTIALS_FILE = "steps-credentials.json"
RESERVED = {LOCAL_DB, "memory", "system", "temp"}  # DuckDB's own databases and the workers' local one


def credentials(home: Path) -> dict[str, dict[str, str]]:
    path = home / CREDENTIALS_FILE
    if not path.exists():
        return {}
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KitError(f"{path} holds passwords but others may read it", f"chmod 600 {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KitError(
            f"{path} is not valid JSON ({exc})", 'fix the file: {"name": {"catalog_connection": ...}}'
        ) from None
    if not isinstance(data, dict) or not all(isinstance(v, (dict, str)) for v in data.values()):
        raise KitError(
            f'{path} must map each credential name to {{"catalog_connection": ..., "data_path": ...}} (or to the '
            'name of another, e.g. "kit")',
            "fix the file",
        )
    aliases = {k: v for k, v in data.items() if isinstance(v, str)}
    for name, target in aliases.items():  # a name for another credential, e.g. NoETL's names for the kit's own
        if target != KIT_AUTH and not isinstance(data.get(target), dict):
            raise KitError(
                f"{path}: credential '{name}' names '{target}', which is neither `kit` nor a credential of the file",
                "point it at kit or at an entry with a connection",
            )
    return data


def _is_kit(known: dict, auth: str | None) -> bool:
    """`auth` names the kit's own catalog: `kit` itself, or a name the credentials file gives it."""
    return auth is None or auth == KIT_AUTH or known.get(auth) == KIT_AUTH


def _entry(known: dict, auth: str) -> dict:
    value = known[auth]
    return known[value] if isinstance(value, str) else value


def parse_dsn(dsn: str, where: str) -> PgEndpoint:
    """A PostgreSQL DSN (URI or key=value) as the catalog's endpoint."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise KitError(
            f"{where}: the catalog connection is not a PostgreSQL DSN ({str(exc).splitlines()[0]})",
            "write it as postgresql://user:password@host:5432/dbname",
        ) from None
    missing = [k for k in ("host", "user", "dbname") if not parts.get(k)]
    if missing:
        raise KitError(
            f"{where}: the catalog connection names no {', '.join(missing)}",
            "write it as postgresql://user:password@host:5432/dbname",
        )
    try:
        port = int(parts.get("port") or 5432)
    except ValueError:
        raise KitError(f"{where}: the catalog connection's port is not a number", "e.g. host:5432") from None
    return PgEndpoint(
        str(parts["host"]), port, str(parts["user"]), str(parts.get("password") or ""), str(parts["dbname"])
    )


def resolve(where: str, catalog: Catalog, *, endpoints: Endpoints, home: Path) -> Target:
    """The step's catalog (its templates already rendered) as a Target; KitError (one line naming `where`) when it
    cannot be."""
    auth, connection, name, data_path = catalog.auth, catalog.connection, catalog.name, catalog.data_path
    create, use = catalog.create, catalog.use
    if not name.replace("_", "").isalnum() or name[0].isdigit():
        raise KitError(
            f"{where}: catalog_name '{name}' is not a plain name", "use letters, digits and _ (e.g. analytics)"
        )
    if name in RESERVED:
        raise KitError(f"{where}: catalog_name '{name}' is taken on the workers", "choose another name, e.g. analytics")
    if connection is not None and "://" not in connection and "=" not in connection:
        auth, connection = connection, None  # a credential's name where a DSN goes: `--set catalog_connection=kit`
    known = credentials(home) if connection is None and auth not in (None, KIT_AUTH) else {}
    if connection is None and _is_kit(known, auth):
        if data_path is not None and data_path.rstrip("/") != endpoints.data_path.rstrip("/"):
            raise KitError(
                f"{where}: the kit's catalog keeps its data at {endpoints.data_path}, not {data_path}",
                "drop data_path (or give the kit's), or use another catalog with `auth`/`catalog_connection`",
            )
        return Target(name, None, endpoints.data_path, create, use)
    if name == LAKE:
        raise KitError(
            f"{where}: catalog_name '{LAKE}' is the kit's own catalog on every worker",
            "give this catalog another catalog_name",
        )
    if connection is None:
        if auth not in known:
            names = ", ".join(sorted([KIT_AUTH, *known]))
            raise KitError(
                f"{where}: no credential named '{auth}' (known: {names})",
                f"add it to {home / CREDENTIALS_FILE}, or use auth: {KIT_AUTH} for the kit's own catalog",
            )
        entry = _entry(known, auth)
        connection = entry.get("catalog_connection")
        data_path = data_path or entry.get("data_path")
        if not connection:
            raise KitError(
                f"{where}: credential '{auth}' has no catalog_connection", f"add it in {home / CREDENTIALS_FILE}"
            )
    pg = with_kit_password(parse_dsn(connection, where), endpoints)
    if (pg.host, pg.port, pg.dbname) == (endpoints.pg.host, endpoints.pg.port, endpoints.pg.dbname):
        return _kit_catalog_again(where, name, data_path, create, use, endpoints)
    if not data_path:
        raise KitError(
            f"{where}: a catalog other than the kit's needs a data_path", "e.g. data_path: s3://raw/analytics/"
        )
    kit = endpoints.data_path.rstrip("/") + "/"
    if (data_path.rstrip("/") + "/").startswith(kit):
        # DuckLake's orphan cleanup (`maintain`) deletes every file under the kit's data path its catalog does not know
        raise KitError(
            f"{where}: data_path {data_path} is inside the kit's lake ({kit}), where `maintain` deletes the files the "
            "kit's catalog does not know: this catalog's files would be lost",
            "give it a path outside the lake, e.g. s3://raw/" + name + "/ or a bucket of its own",
        )
    return Target(name, pg, data_path, create, use)


def _kit_catalog_again(where: str, name: str, data_path: str | None, create: bool, use: bool, endpoints) -> Target:
    """A DSN naming the kit's own catalog database is the kit's catalog (under the step's alias): its data stays
    where the kit keeps it. NoETL's own playbooks name `ducklake_catalog`, the kit's database's name too."""
    kit = endpoints.data_path
    if data_path is not None and data_path.rstrip("/") != kit.rstrip("/"):
        raise KitError(
            f"{where}: the catalog connection names the kit's own catalog database ({endpoints.pg.dbname}), whose "
            f"data is at {kit}, not {data_path}",
            f"use another database for this catalog (the kit creates it), e.g. .../{endpoints.pg.dbname}_noetl, or "
            f"set data_path to {kit}",
        )
    return Target(name, None, kit, create, use)


def with_kit_password(pg: PgEndpoint, endpoints: Endpoints) -> PgEndpoint:
    """A DSN without a password on the kit's own server, as the kit's user, gets the kit's password."""
    kit = endpoints.pg
    if not pg.password and (pg.host, pg.port, pg.user) == (kit.host, kit.port, kit.user):
        return replace(pg, password=kit.password)
    return pg


def postgres(where: str, auth: str | None, *, endpoints: Endpoints, home: Path) -> PgEndpoint:
    """The PostgreSQL database a `postgres` step's `auth` names (rendered); KitError naming `where` when none."""
    known = credentials(home) if auth not in (None, "", KIT_AUTH) else {}
    if not auth or _is_kit(known, auth):
        return endpoints.pg
    if auth not in known:
        names = ", ".join(sorted([KIT_AUTH, *known]))
        raise KitError(
            f"{where}: no credential named '{auth}' (known: {names})",
            f'add it to {home / CREDENTIALS_FILE} as {{"{auth}": {{"connection": "postgresql://..."}}}}, '
            f"or use auth: {KIT_AUTH} for the kit's own PostgreSQL",
        )
    entry = _entry(known, auth)
    dsn = entry.get("connection") or entry.get("dsn") or entry.get("catalog_connection")
    if dsn:
        return with_kit_password(parse_dsn(str(dsn), where), endpoints)
    missing = [k for k in ("host", "user") if not entry.get(k)]
    if missing or not (entry.get("database") or entry.get("dbname")):
        raise KitError(
            f"{where}: credential '{auth}' has no connection, nor host, user and database",
            f'add "connection": "postgresql://user:password@host:5432/dbname" to it in {home / CREDENTIALS_FILE}',
        )
    try:
        port = int(entry.get("port") or 5432)
    except (TypeError, ValueError):
        raise KitError(f"{where}: credential '{auth}' has a port that is not a number", "e.g. 5432") from None
    pg = PgEndpoint(
        str(entry["host"]),
        port,
        str(entry["user"]),
        str(entry.get("password") or ""),
        str(entry.get("database") or entry.get("dbname")),
    )
    return with_kit_password(pg, endpoints)


def keychain(entries: list[dict], *, endpoints: Endpoints, home: Path) -> dict[str, dict]:
    """NoETL's top-level `keychain:` as templates read it (`{{ keychain.NAME.field }}`): each entry's credential of
    the same name in the credentials file, its fields as written (`kit`: the kit's PostgreSQL as host, port, user,
    password, database). NoETL fetches them from a secret manager; the kit reads its own file. KitError naming the
    first entry without a credential, before anything runs."""
    known = credentials(home)
    out: dict[str, dict] = {}
    for entry in entries:
        name = str(entry.get("name") or "")
        if name != KIT_AUTH and name not in known:
            raise KitError(
                f"keychain entry '{name}' has no credential of that name in {home / CREDENTIALS_FILE}",
                f'add it there with the fields the playbook reads, e.g. {{"{name}": {{"api_key": "..."}}}}',
            )
        if _is_kit(known, name):
            pg = endpoints.pg
            out[name] = {
                "host": pg.host,
                "port": pg.port,
                "user": pg.user,
                "password": pg.password,
                "database": pg.dbname,
            }
        else:
            out[name] = dict(_entry(known, name))
    return out
