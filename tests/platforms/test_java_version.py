"""doctor: the Java version read from real `java -version` banners."""

from __future__ import annotations

import pytest

from ducklake_kit.platforms import doctor


@pytest.mark.parametrize(
    "text, major",
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_292"', 8),
        ("bash: java: command not found", None),
    ],
)
def test_java_major_parses_real_version_banners(text, major):
    assert doctor.java_major(text) == major
