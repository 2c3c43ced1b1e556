"""platforms/postgres.py against the stack's real PostgreSQL."""

from __future__ import annotations

import threading
from dataclasses import replace

import psycopg

from ducklake_kit.platforms import postgres


def test_ensure_database_raced_by_many_at_once_creates_it_once_and_never_fails(stack):
    """Two `steps run` of one playbook at once both create the catalog's database: the CREATE that loses the race
    after the existence check fails on pg_database's unique index, which must read as "it exists", not an error."""
    kit = stack.platform.endpoints().pg
    for round_ in range(5):  # the race is a matter of timing: several rounds make it happen
        ep = replace(kit, dbname=f"ensure_race_{round_}")
        barrier, made, failed = threading.Barrier(6), [], []

        def create(ep=ep, barrier=barrier, made=made, failed=failed) -> None:
            barrier.wait()
            try:
                made.append(postgres.ensure_database(ep))
            except Exception as exc:  # noqa: BLE001 - what the caller would have seen
                failed.append(repr(exc))

        threads = [threading.Thread(target=create) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            assert failed == [] and made.count(True) == 1, (failed, made)
            assert postgres.ping(ep, ep.dbname)
        finally:
            with psycopg.connect(kit.libpq("postgres"), autocommit=True) as con:
                con.execute(f"DROP DATABASE IF EXISTS {ep.dbname}")
