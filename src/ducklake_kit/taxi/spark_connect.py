"""A Spark Connect session the kit can stop waiting for.

PySpark's client retries a call its server does not answer (UNAVAILABLE) 15 times, up to 60 s apart. When the
server died during a load, the CLI sat silent for 14.6 minutes, and Ctrl-C only moved it on to the next retried call
(cancelling the operation, releasing the session, and releasing the results in a thread the process waits for at
exit). Here:

- the retries of one call end `RETRY_S` after its first failure (PySpark's own policy otherwise: what it retries,
  the backoff), so a server that went away is one line within about a minute, not a quarter of an hour;
- Ctrl-C while the kit waits on a job (`interruptible`) makes a short try at cancelling the job on the server, then
  closes the channel: every call on it, in any thread, ends at once;
- a session whose server went away, or that Ctrl-C ended, is closed without asking the server anything.

Imported only when a Connect session starts (grpc and the Connect client are optional extras of pyspark).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from pyspark.sql.connect.client.core import DefaultChannelBuilder
from pyspark.sql.connect.client.retries import DefaultPolicy, RetryPolicyState
from pyspark.sql.connect.session import SparkSession

from ducklake_kit.errors import KitError, first_line

RETRY_S = float(os.environ.get("DUCKLAKE_SPARK_CONNECT_RETRY_S", "60"))
FIRST_CALL_RETRY_S = 10.0  # a server that is not there when the session starts is said in seconds
CANCEL_WAIT_S = 3.0  # Ctrl-C: how long the server may take to cancel the job before the channel is closed anyway
GONE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

# PySpark warns "[RETRIES_EXCEEDED]" on stderr when it gives up: the kit says what happened in its own one line
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")


class BoundedRetries(DefaultPolicy):
    """PySpark's default policy (UNAVAILABLE and the like, backoff x4 from 50 ms) with waits of at most 5 s, bounded in
    time rather than in count, and stopped at once by `stopped`."""

    def __init__(self, budget_s: float):
        super().__init__(max_retries=None, max_backoff=5000)
        self.budget_s = budget_s
        self.stopped = False

    def can_retry(self, e: BaseException) -> bool:
        return not self.stopped and super().can_retry(e)

    def to_state(self) -> RetryPolicyState:
        return _Budget(self)


class _Budget(RetryPolicyState):
    """One call's retries: none once `budget_s` has passed since its first failure."""

    def __init__(self, policy: BoundedRetries):
        super().__init__(policy)
        self._first_failure: float | None = None

    def next_attempt(self, exception: BaseException | None = None) -> int | None:
        now = time.monotonic()
        if self._first_failure is None:
            self._first_failure = now
        wait = super().next_attempt(exception)
        policy = self.policy
        assert isinstance(policy, BoundedRetries)
        if wait is None or policy.stopped or now - self._first_failure + wait / 1000 > policy.budget_s:
            return None
        return wait


class _Builder(DefaultChannelBuilder):
    """Keeps the channel it made: closing it ends every call on it at once (PySpark's own close first waits for the
    calls releasing results, which a hung server never answers)."""

    channel: grpc.Channel | None = None

    def toChannel(self) -> grpc.Channel:
        self.channel = super().toChannel()
        return self.channel


class _Guard:
    """What the kit keeps of one Connect session: where it goes (never the token), its channel and retry policy."""

    def __init__(self, url: str, kit: bool, builder: _Builder, policy: BoundedRetries):
        self.url, self.kit, self.builder, self.policy = url, kit, builder, policy
        self.interrupted = False  # Ctrl-C ended the session

    def abandon(self) -> None:
        """No more waiting on this server: retries end, and every call on the channel ends now."""
        self.policy.stopped = True
        if self.builder.channel is not None:
            self.builder.channel.close()

    def server_gone(self, exc: BaseException) -> bool:
        """Asked, not guessed: the failure is gRPC's "not answering", or the server's port no longer takes a
        connection."""
        if _grpc_code(exc) in GONE_CODES:
            return True
        host, _, port = self.url.removeprefix("sc://").split("/", 1)[0].rpartition(":")
        try:
            socket.create_connection((host or "localhost", int(port or 15002)), timeout=3).close()
        except (OSError, ValueError):
            return True
        return False


def _grpc_code(exc: BaseException) -> grpc.StatusCode | None:
    if isinstance(exc, grpc.RpcError):
        return exc.code()  # type: ignore[attr-defined] - a failed call is also a grpc.Call
    return exc.getGrpcStatusCode() if hasattr(exc, "getGrpcStatusCode") else None


_GUARDS: weakref.WeakKeyDictionary[SparkSession, _Guard] = weakref.WeakKeyDictionary()


def open_session(url: str, remote: str, kit: bool) -> SparkSession:
    """A new Connect session on `remote` (`url` with its `;token=...`, if any) with the kit's retry policy, checked by
    a first round trip (a refused token and a server that is not there are one line each). `kit`: the server is the
    one `spark up` started."""
    # what pyspark.sql's own builder does for a `remote`: the process is now in Connect mode (pyspark.sql.functions
    # build Connect columns); a classic session later takes it back (spark.session)
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    builder = _Builder(remote)
    policy = BoundedRetries(FIRST_CALL_RETRY_S)
    # no builder options: `create()` then makes no call, so the first one already runs under this policy
    spark = SparkSession.builder.channelBuilder(builder).create()
    spark.client.set_retry_policies([policy])
    guard = _Guard(url, kit, builder, policy)
    try:
        spark.version  # noqa: B018 - a real round trip
    except Exception as exc:  # noqa: BLE001 - gRPC and Spark errors
        guard.abandon()
        close(spark, guard)
        if _grpc_code(exc) == grpc.StatusCode.UNAUTHENTICATED:
            fix = (
                (
                    "run `spark down`, then `spark up --mode connect` (it starts the server with this state folder's "
                    "token)"
                )
                if kit
                else (
                    "give the server's own token, `;token=...` in the URL or "
                    "SPARK_CONNECT_AUTHENTICATE_TOKEN (for the kit's server: --spark-master connect)"
                )
            )
            raise KitError(f"token refused by the Spark Connect server at {url}", fix) from None
        raise KitError(
            f"the Spark Connect server at {url} did not answer ({first_line(exc)[:300]})",
            "run `spark status`, or check SPARK_REMOTE",
        ) from None
    policy.budget_s = RETRY_S
    _GUARDS[spark] = guard
    return spark


def close(spark: SparkSession, guard: _Guard | None = None) -> None:
    """Give the session back to its server; when the server went away or Ctrl-C ended the session, close it without
    asking the server anything."""
    guard = guard or _GUARDS.get(spark)
    if guard is not None and guard.policy.stopped:
        spark.release_session_on_close = False
    spark.stop()


@contextmanager
def interruptible(spark: SparkSession, done: str) -> Iterator[None]:
    """While the kit waits on this session's jobs: Ctrl-C ends the wait at once and is one line saying `done` (what
    the interruption left behind, e.g. "nothing was committed"). Outside, Ctrl-C is Python's own."""
    guard = _GUARDS.get(spark)
    if guard is None or threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def on_sigint(_signum, _frame) -> None:
        if not guard.interrupted:
            guard.interrupted = True
            guard.policy.stopped = True
            # a server that answers is asked to cancel the job (its executors are freed now, not when it notices the
            # client is gone); one that does not gets CANCEL_WAIT_S, then the channel is closed under it
            asked = threading.Thread(target=_cancel_quietly, args=(spark,), daemon=True)
            asked.start()
            asked.join(CANCEL_WAIT_S)
            guard.abandon()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        raise KitError(f"the load was interrupted (Ctrl-C); {done}", "run the same load again") from None
    finally:
        signal.signal(signal.SIGINT, previous)


def _cancel_quietly(spark: SparkSession) -> None:
    try:
        spark.interruptAll()
    except Exception:  # noqa: BLE001 - a server that went away cannot cancel anything
        pass


def failure(spark, exc: BaseException, done: str) -> KitError | None:
    """What ended a Connect session's job, when it was not the job itself: Ctrl-C, or a server that stopped answering.
    `done` says what that left behind ("nothing was committed"). None for a session without the kit's guard, or a
    failure of the job itself."""
    guard = _GUARDS.get(spark)
    if guard is None:
        return None
    if guard.interrupted:
        return KitError(f"the load was interrupted (Ctrl-C); {done}", "run the same load again")
    if not guard.server_gone(exc):
        return None
    guard.abandon()
    fix = (
        "run `spark up --mode connect`, then the same load again"
        if guard.kit
        else "start the Spark Connect server again (or check SPARK_REMOTE), then run the same load again"
    )
    return KitError(f"the Spark Connect server at {guard.url} stopped answering during the load; {done}", fix)
