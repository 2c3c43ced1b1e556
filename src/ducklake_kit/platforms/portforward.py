"""A port-forward supervisor: keeps one `kubectl port-forward` (or any command) running until told to stop.

    python -m ducklake_kit.platforms.portforward [--min-backoff S] [--max-backoff S] [--stable-after S] -- CMD [ARG ...]

`kubectl port-forward` exits when its pod goes away (a restart, a new rollout, the cluster stopping); this
process starts it again, with a bounded backoff, and logs every start and exit with a timestamp and the exit
code. SIGTERM (what `down` sends) or SIGINT stops the child first, then the supervisor. The k3d platform starts
one of these per forward with `procs.start` (pid file in the state folder, output in its log file).
"""

from __future__ import annotations

import argparse
import ctypes
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable

STOP_GRACE = 5.0  # seconds a child gets to exit after SIGTERM before it is killed


class _Stop(Exception):
    """Raised by the signal handler: unwinds whatever the loop is waiting on (child.wait, sleep)."""


def _on_signal(signum: int, _frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the supervisor dies without cleaning up (e.g. SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: best effort only


def _log_line(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} portforward: {text}", flush=True)


def _stop_child(child: subprocess.Popen | None, log: Callable[[str], None]) -> None:
    if child is None or child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(STOP_GRACE)
        log(f"stopped pid {child.pid} (code {child.returncode})")
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        log(f"killed pid {child.pid} after {STOP_GRACE:.0f}s")


def supervise(
    argv: list[str],
    *,
    min_backoff: float = 0.5,
    max_backoff: float = 10.0,
    stable_after: float = 10.0,
    max_restarts: int | None = None,
    log: Callable[[str], None] = _log_line,
) -> int | None:
    """Run `argv`, restart it whenever it exits, until a signal (SIGTERM/SIGINT) or `max_restarts` restarts.

    The wait before a restart starts at `min_backoff` and doubles after each quick exit, up to `max_backoff`;
    a child that ran `stable_after` seconds or more counts as healthy and resets it. Returns the last exit
    code (None when stopped by a signal while the child ran). The signal handlers are installed only
    while this runs, and only in the main thread.
    """
    handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            handlers[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread (an in-process test): no handlers, no signal stop
            pass
    child: subprocess.Popen | None = None
    backoff, restarts, code = min_backoff, 0, None
    try:
        while True:
            started = time.monotonic()
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl in the child; no lock is taken there
            log(f"started pid {child.pid}: {shlex.join(argv)}")
            code = child.wait()
            ran = time.monotonic() - started
            if ran >= stable_after:
                backoff = min_backoff
            if max_restarts is not None and restarts >= max_restarts:
                log(f"pid {child.pid} exited with code {code} after {ran:.1f}s; not restarting ({restarts} restarts)")
                return code
            log(f"pid {child.pid} exited with code {code} after {ran:.1f}s; restarting in {backoff:.2f}s")
            time.sleep(backoff)
            restarts += 1
            backoff = min(backoff * 2, max_backoff)
    except _Stop as stop:
        log(f"{stop}: stopping")
        return None if child is None or child.poll() is None else child.returncode
    finally:
        for sig in handlers:  # a second signal must not interrupt the cleanup (it is bounded by STOP_GRACE)
            signal.signal(sig, signal.SIG_IGN)
        _stop_child(child, log)
        for sig, old in handlers.items():
            signal.signal(sig, old)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ducklake_kit.platforms.portforward", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--min-backoff", type=float, default=0.5, help="first wait before a restart, seconds")
    parser.add_argument("--max-backoff", type=float, default=10.0, help="longest wait before a restart, seconds")
    parser.add_argument(
        "--stable-after", type=float, default=10.0, help="a child that ran this long resets the backoff"
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command to keep running")
    opts = parser.parse_args(args)
    argv = opts.argv[1:] if opts.argv[:1] == ["--"] else opts.argv
    if not argv:
        parser.error("give the command to supervise after --")
    supervise(argv, min_backoff=opts.min_backoff, max_backoff=opts.max_backoff, stable_after=opts.stable_after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
