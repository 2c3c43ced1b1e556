"""The test hooks' pause (DUCKLAKE_FAULT=pause-...=SECONDS): the window a fault test kills a process in.

A fixed pause long enough for the slowest machine would cost every run its whole length, so the pause ends early
once the file DUCKLAKE_FAULT_RESUME_FILE names exists: the test creates it when it has seen what it came for (its
kill has landed). The load pauses before its commit (or after it), a worker-plane task after its commit."""

from __future__ import annotations

import os
import time

RESUME_FILE = "DUCKLAKE_FAULT_RESUME_FILE"


def pause(seconds: float) -> None:
    """Sleep `seconds`, or less: until the resume file exists."""
    deadline = time.monotonic() + seconds
    resume = os.environ.get(RESUME_FILE)
    while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
        time.sleep(0.05)
