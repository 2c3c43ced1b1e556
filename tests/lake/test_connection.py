"""The connection factory: extensions from the pinned wheels, secrets quoted, no password in ATTACH, settings in
the right place; and the one statement that may be re-run (a commit DuckLake gave up on)."""

from __future__ import annotations

import pytest

from ducklake_kit import lake
from ducklake_kit.platforms.base import Endpoints, PgEndpoint, S3Endpoint

EP = Endpoints(PgEndpoint("127.0.0.1", 5432, "u", "p'w"), S3Endpoint("127.0.0.1:9000", "k", "s"))


def test_extensions_load_from_the_pinned_wheels_not_the_internet():
    *stmts, last = lake.load_statements()
    assert len(stmts) == 3
    assert all(s.startswith("LOAD '") and s.endswith(".duckdb_extension'") for s in stmts), stmts
    assert not any("INSTALL" in s for s in stmts)
    assert last == "SET allow_unsigned_extensions = false"  # after the kit's own LOADs, for good


def test_setup_sql_quotes_secrets_and_keeps_the_password_out_of_attach():
    stmts = lake.setup_statements(EP)
    secret = next(s for s in stmts if "TYPE postgres" in s)
    assert "PASSWORD 'p''w'" in secret  # a quote in a password cannot break out of the literal
    attach = next(s for s in stmts if s.startswith("ATTACH"))
    assert "p'w" not in attach and "password" not in attach.lower()
    assert "DATA_PATH 's3://lake/'" in attach
    assert stmts[-1] == "USE lake"


def test_writer_settings_go_before_the_attach_and_catalog_settings_into_its_options():
    from ducklake_kit.errors import KitError
    from ducklake_kit.lake import connection as lake
    from ducklake_kit.platforms.base import Endpoints, PgEndpoint, S3Endpoint

    ep = Endpoints(PgEndpoint("h", 1, "u", "p"), S3Endpoint("e:1", "k", "s"))
    stmts = lake.setup_statements(
        ep,
        settings={**lake.SMALL_WRITER_SETTINGS, "pg_pool_health_check_query": ""},
        catalog_settings={"synchronous_commit": "off"},
    )
    attach = next(i for i, s in enumerate(stmts) if s.startswith("ATTACH"))
    assert {
        "SET threads = 1",
        "SET pg_pool_health_check_query = ''",
        f"SET ducklake_max_retry_count = {lake.RETRY_SETTINGS['ducklake_max_retry_count']}",
    } <= set(stmts[:attach])
    assert "options=''-csynchronous_commit=off''" in stmts[attach]
    assert "options" not in next(s for s in lake.setup_statements(ep) if s.startswith("ATTACH"))
    with pytest.raises(KitError, match="not a plain name=value"):
        lake.attach_statement(ep, catalog_settings={"synchronous_commit": "off' -c x=y"})


class _Flaky:
    """A connection whose first `fail` executes raise the given error."""

    def __init__(self, fail: int, message: str):
        self.fail, self.message, self.calls = fail, message, 0

    def execute(self, sql, params):
        import duckdb

        self.calls += 1
        if self.calls <= self.fail:
            raise duckdb.TransactionException(self.message)


def test_execute_retrying_reruns_only_commits_ducklake_gave_up(monkeypatch):
    import duckdb

    from ducklake_kit.lake import connection as lake  # the module, where `time.sleep` is looked up

    waits: list[float] = []
    monkeypatch.setattr(lake.time, "sleep", waits.append)
    gave_up = (
        f"Failed to commit DuckLake transaction. {lake.DUCKLAKE_GAVE_UP} of 30 set by the ducklake_max_retry_count"
    )
    con = _Flaky(6, gave_up)
    assert lake.execute_retrying(con, "INSERT ...", [1], first_wait_s=0.1, cap_s=0.5) == 6 and con.calls == 7
    assert all(0.0 < w <= 0.5 for w in waits) and max(waits) > 0.25  # doubling, jittered, capped
    # anything else is not known to have rolled back: never repeated
    con = _Flaky(1, "Constraint Error: NOT NULL constraint failed")
    with pytest.raises(duckdb.TransactionException, match="NOT NULL"):
        lake.execute_retrying(con, "INSERT ...")
    assert con.calls == 1
    # patience runs out: the last error propagates
    con = _Flaky(10**6, gave_up)
    with pytest.raises(duckdb.TransactionException, match=lake.DUCKLAKE_GAVE_UP):
        lake.execute_retrying(con, "INSERT ...", patience_s=0.0)
    assert con.calls == 1
