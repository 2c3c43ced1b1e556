"""The external platform: endpoints from the user's DSN and S3 settings."""

from __future__ import annotations

import pytest

from ducklake_kit.errors import KitError
from ducklake_kit.platforms.external import parse_endpoints


def test_external_dsn_url_and_keyvalue_forms():
    ep = parse_endpoints(
        {
            "pg_dsn": "postgresql://me:secret@db.example:6543/cat",
            "s3_endpoint": "https://s3.example:9443",
            "s3_key_id": "k",
            "s3_secret": "s",
        }
    )
    assert (ep.pg.host, ep.pg.port, ep.pg.user, ep.pg.password, ep.pg.dbname) == (
        "db.example",
        6543,
        "me",
        "secret",
        "cat",
    )
    assert (ep.s3.endpoint, ep.s3.use_ssl, ep.s3.url) == ("s3.example:9443", True, "https://s3.example:9443")
    ep = parse_endpoints(
        {
            "pg_dsn": "host=h user=u password=p",
            "s3_endpoint": "http://127.0.0.1:9000",
            "s3_key_id": "k",
            "s3_secret": "s",
        }
    )
    assert (ep.pg.port, ep.pg.dbname, ep.s3.use_ssl) == (5432, "ducklake_catalog", False)


def test_external_dsn_without_password_is_refused():
    with pytest.raises(KitError, match="has no password"):
        parse_endpoints({"pg_dsn": "postgresql://me@db/cat", "s3_endpoint": "x:1", "s3_key_id": "k", "s3_secret": "s"})
