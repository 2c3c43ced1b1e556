"""Which catalog or PostgreSQL database a step names (steps/catalogs.py): the credentials file, NoETL's names for
the kit's own, the kit's password filled in on its own server, and the two catalogs a step must not make: the kit's
catalog with its data elsewhere, and another catalog whose files sit inside the kit's lake (where `maintain` deletes
every file the kit's catalog does not know)."""

from __future__ import annotations

import json

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, S3Endpoint
from ducklake_kit.steps import catalogs
from ducklake_kit.steps.model import Catalog

KIT_PG = PgEndpoint("127.0.0.1", 15432, "ducklake", "kit-secret-pw", "ducklake_catalog")
EP = Endpoints(KIT_PG, S3Endpoint("127.0.0.1:19000", "key", "s3-secret"), "s3://lake/")


def _file(tmp_path, entries) -> None:
    path = tmp_path / catalogs.CREDENTIALS_FILE
    path.write_text(json.dumps(entries))
    path.chmod(0o600)


def _resolve(tmp_path, **catalog):
    return catalogs.resolve("step 's'", Catalog(**catalog), endpoints=EP, home=tmp_path)


def test_a_name_may_stand_for_the_kits_own_catalog_and_postgres(tmp_path):
    _file(tmp_path, {"noetl_connection": "kit", "noetl_ducklake_catalog": "kit"})
    assert catalogs.postgres("step 's'", "noetl_connection", endpoints=EP, home=tmp_path) == KIT_PG
    target = _resolve(tmp_path, auth="noetl_ducklake_catalog", name="test_catalog")
    assert (target.kit, target.alias, target.data_path) == (True, "test_catalog", "s3://lake/")


def test_an_alias_to_nothing_is_one_line(tmp_path):
    _file(tmp_path, {"noetl_connection": "nope"})
    with pytest.raises(KitError, match="names 'nope', which is neither `kit` nor a credential"):
        catalogs.postgres("step 's'", "noetl_connection", endpoints=EP, home=tmp_path)


def test_postgres_credentials_in_noetls_fields_or_a_dsn(tmp_path):
    _file(
        tmp_path,
        {
            "pg_local": {"host": "db.example", "port": 6543, "user": "me", "password": "pw", "database": "demo"},
            "pg_dsn": {"connection": "postgresql://you:pw2@db.example:5433/other"},
            "broken": {"host": "db.example"},
        },
    )
    assert catalogs.postgres("s", "pg_local", endpoints=EP, home=tmp_path) == PgEndpoint(
        "db.example", 6543, "me", "pw", "demo"
    )
    assert catalogs.postgres("s", "pg_dsn", endpoints=EP, home=tmp_path).dbname == "other"
    with pytest.raises(KitError, match="has no connection, nor host, user and database") as exc:
        catalogs.postgres("s", "broken", endpoints=EP, home=tmp_path)
    assert "pw" not in str(exc.value)
    with pytest.raises(KitError, match=r"no credential named 'missing' \(known: broken, kit, pg_dsn, pg_local\)"):
        catalogs.postgres("s", "missing", endpoints=EP, home=tmp_path)


def test_the_kits_password_fills_a_dsn_on_its_own_server_only(tmp_path):
    mine = _resolve(
        tmp_path, connection="postgresql://ducklake@127.0.0.1:15432/noetl_lake", data_path="s3://raw/n/", name="n"
    )
    assert (mine.pg.password, mine.pg.dbname) == ("kit-secret-pw", "noetl_lake")
    for other in ("postgresql://ducklake@10.0.0.9:15432/x", "postgresql://someone@127.0.0.1:15432/x"):
        target = _resolve(tmp_path, connection=other, data_path="s3://raw/n/", name="n")
        assert target.pg.password == ""  # another server or another user never gets the kit's password


def test_a_dsn_naming_the_kits_own_catalog_database_is_the_kits_catalog(tmp_path):
    same = _resolve(tmp_path, connection="postgresql://ducklake@127.0.0.1:15432/ducklake_catalog", name="test_catalog")
    assert (same.kit, same.alias, same.data_path) == (True, "test_catalog", "s3://lake/")
    with pytest.raises(KitError, match=r"the kit's own catalog database \(ducklake_catalog\), whose data is at"):
        _resolve(
            tmp_path,
            connection="postgresql://ducklake@127.0.0.1:15432/ducklake_catalog",
            data_path="/opt/noetl/data/ducklake",
            name="test_catalog",
        )


@pytest.mark.parametrize("inside", ["s3://lake/analytics/", "s3://lake/", "s3://lake"])
def test_another_catalogs_files_inside_the_kits_lake_are_refused(tmp_path, inside):
    with pytest.raises(KitError, match="where `maintain` deletes the files the kit's catalog does not know"):
        _resolve(tmp_path, connection="postgresql://u:p@db.example/x", data_path=inside, name="analytics")
    outside = _resolve(tmp_path, connection="postgresql://u:p@db.example/x", data_path="s3://lakehouse/a/", name="a")
    assert outside.data_path == "s3://lakehouse/a/"  # a bucket whose name merely starts with the lake's is another


def test_a_catalog_connection_may_be_a_credentials_name(tmp_path):
    _file(
        tmp_path, {"analytics_pg": {"catalog_connection": "postgresql://u:p@db.example/a", "data_path": "s3://raw/a/"}}
    )
    kit = _resolve(tmp_path, connection="kit", name="test_catalog", data_path="s3://lake/")
    assert (kit.kit, kit.alias) == (True, "test_catalog")
    other = _resolve(tmp_path, connection="analytics_pg", name="a")
    assert (other.pg.dbname, other.data_path) == ("a", "s3://raw/a/")
    with pytest.raises(KitError, match="no credential named 'typo'"):
        _resolve(tmp_path, connection="typo", name="a")


def test_keychain_entries_are_the_credentials_of_their_names(tmp_path):
    _file(tmp_path, {"amadeus": {"client_id": "abc", "client_secret": "s3cr3t"}, "pg": "kit"})
    chain = catalogs.keychain(
        [{"name": "amadeus", "kind": "secret_manager", "provider": "gcp"}, {"name": "pg"}], endpoints=EP, home=tmp_path
    )
    assert chain["amadeus"] == {"client_id": "abc", "client_secret": "s3cr3t"}
    assert (chain["pg"]["user"], chain["pg"]["password"], chain["pg"]["database"]) == (
        "ducklake",
        "kit-secret-pw",
        "ducklake_catalog",
    )
    with pytest.raises(KitError, match="keychain entry 'openai_token' has no credential of that name") as exc:
        catalogs.keychain([{"name": "openai_token"}], endpoints=EP, home=tmp_path)
    assert "s3cr3t" not in str(exc.value)
