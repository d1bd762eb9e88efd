"""Skips for a missing prerequisite, turned into failures by ``SPARKGRAD_REQUIRE``.

A test that cannot run without something the machine may lack (Java, root, nvcc, a GPU, a browser) calls
``require_or_skip(name, available, reason)`` instead of ``pytest.skip``. Where ``name`` is listed in the
comma-separated environment variable ``SPARKGRAD_REQUIRE`` (``SPARKGRAD_REQUIRE=java,cluster``), a missing
prerequisite fails the test instead of skipping it, so a machine that is meant to run those tests cannot go
green by skipping them. CI sets ``SPARKGRAD_REQUIRE=java`` (.ci/run).
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType

import pytest

ENV = "SPARKGRAD_REQUIRE"

# name -> what it stands for (docs/development.md lists the same)
PREREQUISITES = {
    "java": "Java 17+ and pyspark: the Spark tests (tests/spark, the Spark-side tests elsewhere)",
    "cluster": "root, network namespaces, iproute2 and Java 17+: the Spark cluster tests (tests/cluster)",
    "nvcc": "nvcc and NVIDIA's cuBLAS/cuDNN wheels: the tests that compile the CUDA sources and build",
    "gpu": "a CUDA build of sparkgrad, a visible GPU and cupy: the tests that run on cuda:0",
    "chromium": "a Chromium or Chrome: the test that renders the HTML report",
}


def required() -> frozenset[str]:
    """The prerequisites named in ``SPARKGRAD_REQUIRE`` (empty when it is unset or empty).

    Raises:
        ValueError: a name is not one of ``PREREQUISITES`` (the message lists the valid ones).
    """
    names = {part.strip() for part in os.environ.get(ENV, "").split(",") if part.strip()}
    unknown = sorted(names - PREREQUISITES.keys())
    if unknown:
        raise ValueError(
            f"{ENV}: unknown prerequisite {', '.join(map(repr, unknown))}; "
            f"valid names: {', '.join(PREREQUISITES)}"
        )
    return frozenset(names)


def require_or_skip(name: str, available: bool, reason: str) -> None:
    """Return when ``available``; otherwise fail the test when ``name`` is required, else skip it.

    Args:
        name: one of ``PREREQUISITES``.
        available: whether the prerequisite is present.
        reason: what is missing and how to get it (the skip or failure message).
    """
    __tracebackhide__ = True  # a skip or failure is reported at the test's line, not here
    if name not in PREREQUISITES:
        raise ValueError(f"unknown prerequisite {name!r}; valid names: {', '.join(PREREQUISITES)}")
    if available:
        return
    if name in required():
        pytest.fail(f"prerequisite '{name}' is required by {ENV}: {reason}", pytrace=False)
    pytest.skip(reason)


def require_java() -> None:
    """Skip (fail with ``java`` required) unless pyspark imports and Java 17+ is on JAVA_HOME / PATH."""
    __tracebackhide__ = True
    require_or_skip(
        "java", importlib.util.find_spec("pyspark") is not None, "pyspark is not installed (the test extra)"
    )
    from sparkgrad.spark.demo import MIN_JAVA, java_major_version

    version = java_major_version()
    found = "none found on JAVA_HOME / PATH" if version is None else f"found Java {version}"
    require_or_skip(
        "java", version is not None and version >= MIN_JAVA, f"Spark needs Java {MIN_JAVA}+: {found}"
    )


def require_gpu() -> ModuleType:
    """cupy, when this sparkgrad is a CUDA build with a visible GPU; skips (fails with ``gpu`` required)."""
    __tracebackhide__ = True
    import sparkgrad

    require_or_skip("gpu", sparkgrad.cuda_available(), "CUDA build with a visible GPU is required")
    require_or_skip("gpu", importlib.util.find_spec("cupy") is not None, "cupy is not installed")
    import cupy

    return cupy
