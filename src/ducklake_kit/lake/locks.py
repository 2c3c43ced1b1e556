"""PostgreSQL advisory locks in the catalog database: held by a session, released when it ends, so a killed
holder never leaves a lock behind."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from ducklake_kit.errors import KitError
from ducklake_kit.platforms import postgres
from ducklake_kit.platforms.base import Endpoints


def lock_key(name: str) -> int:
    """A bigint key from a short name (at most 8 ASCII bytes): 'dlk-load' -> int.from_bytes(b'dlk-load')."""
    raw = name.encode("ascii")
    if not 0 < len(raw) <= 8:
        raise ValueError(f"lock name {name!r} must be 1-8 ASCII characters")
    return int.from_bytes(raw, "big")


@contextmanager
def advisory_lock(ep: Endpoints, key: int, *, timeout_s: int, busy: KitError) -> Iterator[None]:
    """Hold advisory lock `key` for the `with` block, waiting at most `timeout_s` seconds; `busy` is raised when
    it could not be had in time. (PostgreSQL reads a lock_timeout of 0 as "wait forever": refused here.)"""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, not {timeout_s}")
    conn = postgres.connect(ep.pg, timeout=10)
    try:
        conn.execute(f"SET lock_timeout = '{int(timeout_s)}s'")
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [key])
        except psycopg.errors.LockNotAvailable:
            raise busy from None
        yield
    finally:
        conn.close()  # ends the session: the lock goes with it


LOAD_LIFE_NAMESPACE = int.from_bytes(b"L\x00", "big") << 48  # keys of a load's life lock: the namespace, then its id


def load_life_key(load_id: str) -> int:
    """The advisory lock key a load holds for its whole life: its 12-hex-digit id (48 bits) in its own namespace."""
    if len(load_id) != 12:
        raise ValueError(f"a load id is 12 hex digits, not {load_id!r}")
    return LOAD_LIFE_NAMESPACE | int(load_id, 16)


# the loads' commit lock (taxi.load holds it around its commit; maintain around deleting dead loads' files)
COMMIT_LOCK_KEY = lock_key("dlk-load")
COMMIT_LOCK_TIMEOUT_S = 300


def data_file_prefix(load_id: str) -> str:
    """Every data file a load writes is named `ducklake-<load id>-<uuid>.parquet`: an orphan says whose it is."""
    return f"ducklake-{load_id}-"


def load_id_of(path: str) -> str | None:
    """The load that wrote a data file, from its name; None for a file of another writer (or an older kit)."""
    m = re.fullmatch(r"ducklake-([0-9a-f]{12})-[0-9a-f-]{36}\.parquet", path.rsplit("/", 1)[-1])
    return m.group(1) if m else None


def commit_lock(ep: Endpoints):
    """Hold the loads' commit lock. DuckLake appends never conflict, so without it two loads of the same file,
    both planned before either committed, would both land; inside it, the second one's re-plan sees the first's
    commit and stops. A killed load's session ends and PostgreSQL releases the lock."""
    return advisory_lock(
        ep,
        COMMIT_LOCK_KEY,
        timeout_s=COMMIT_LOCK_TIMEOUT_S,
        busy=KitError(
            f"another load held the commit lock for {COMMIT_LOCK_TIMEOUT_S}s; nothing was registered",
            "wait for the other load to finish, then run this one again",
        ),
    )


@contextmanager
def held_for_life(ep: Endpoints, key: int) -> Iterator[psycopg.Connection]:
    """Hold advisory lock `key` while the block runs (it is free: no one else takes a new load's key). Whoever sees
    the key free afterwards knows the holder is gone: finished, failed or killed, its session ended. Yields the
    session, whose being alive is the proof that the lock is still held."""
    conn = postgres.connect(ep.pg, timeout=10)
    try:
        conn.execute("SELECT pg_advisory_lock(%s)", [key])
        yield conn
    finally:
        conn.close()


def held_now(ep: Endpoints, keys: list[int]) -> set[int]:
    """Which of `keys` some session holds right now (a try-lock that is given back at once when it succeeds)."""
    if not keys:
        return set()
    held = set()
    with postgres.connect(ep.pg, timeout=10) as conn:
        for key in keys:
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]
            if got:
                conn.execute("SELECT pg_advisory_unlock(%s)", [key])
            else:
                held.add(key)
    return held


def named_key(namespace: bytes, name: str) -> int:
    """A bigint key for `name` in a 2-byte namespace (48 bits of the name's SHA-256 after it)."""
    import hashlib

    if len(namespace) != 2:
        raise ValueError("a lock namespace is 2 bytes")
    return (int.from_bytes(namespace, "big") << 48) | int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "big")


def holder_of(conn: psycopg.Connection, key: int) -> str | None:
    """The application_name of the session that holds advisory lock `key` (how the holder said who it is)."""
    row = conn.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.classid::bigint = %s "
        "AND l.objid::bigint = %s",
        [key >> 32, key & 0xFFFFFFFF],
    ).fetchone()
    return row[0] if row and row[0] else None


@contextmanager
def held_exclusively(ep: Endpoints, key: int, holder: str, busy: Callable[[str | None], KitError]) -> Iterator[None]:
    """Hold advisory lock `key` for the block, or raise `busy(who)` at once when another session holds it; `holder`
    is what this session says it is (its application_name: the next one who finds the lock held reads it)."""
    conn = postgres.connect(ep.pg, timeout=10)
    try:
        conn.execute("SELECT set_config('application_name', %s, false)", [holder[:63]])
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]:
            raise busy(holder_of(conn, key))
        yield
    finally:
        conn.close()
