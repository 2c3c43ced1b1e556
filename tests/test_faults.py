"""The test hooks' pause ends at its length, or as soon as the resume file exists (what the fault tests rely on)."""

from __future__ import annotations

import threading
import time

from ducklake_kit import faults


def test_the_pause_lasts_its_length_without_the_resume_file(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.RESUME_FILE, str(tmp_path / "resume"))
    t = time.monotonic()
    faults.pause(0.3)
    assert 0.3 <= time.monotonic() - t < 2


def test_the_pause_ends_once_the_resume_file_appears(tmp_path, monkeypatch):
    resume = tmp_path / "resume"
    monkeypatch.setenv(faults.RESUME_FILE, str(resume))
    threading.Timer(0.2, resume.touch).start()
    t = time.monotonic()
    faults.pause(30)
    assert 0.2 <= time.monotonic() - t < 5
