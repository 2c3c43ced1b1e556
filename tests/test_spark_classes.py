"""The tests' Spark driver JVMs map Spark's classes from the archive tests/spark_classes.py makes (else the CPU it
saves would silently be gone: a JVM whose classpath does not match the archive's starts without it, and says nothing).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_the_sessions_jvm_maps_the_class_archive(spark):
    opts = shlex.split(os.environ["SPARK_SUBMIT_OPTS"])
    if not any(o.startswith("-XX:SharedArchiveFile=") for o in opts):
        pytest.skip("no class archive in this session (SPARK_SUBMIT_OPTS of the user's own, or none could be made)")
    archive = next(o.split("=", 1)[1] for o in opts if o.startswith("-XX:SharedArchiveFile="))
    jvms = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
    assert jvms, "the session fixture's JVM is not a child of this process"
    mapped = [p.pid for p in jvms if archive in Path(f"/proc/{p.pid}/maps").read_text()]
    assert mapped, f"no JVM of this process maps {archive}: its classpath does not match the archive's"
