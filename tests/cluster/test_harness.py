"""The harness says why it cannot build a cluster instead of failing half-way (no cluster is started here)."""

from __future__ import annotations

import os
import sys

import pytest

import cluster as harness
from sparkgrad.spark import demo


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="needs root on Linux")
@pytest.mark.parametrize(
    ("java", "expected"),
    [
        (11, "needs Java 17+ for Spark: found Java 11"),
        (None, "needs Java 17+ for Spark: none found (JAVA_HOME / PATH)"),
    ],
)
def test_an_old_or_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, java, expected: str) -> None:
    monkeypatch.setattr(harness.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(demo, "java_major_version", lambda: java)
    assert expected in harness.unavailable_reason()
    monkeypatch.setattr(demo, "java_major_version", lambda: 17)
    reason = harness.unavailable_reason()
    assert reason is None or "Java" not in reason
