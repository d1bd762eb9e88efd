"""SPARKGRAD_REQUIRE turns the skip of a missing prerequisite into a failure that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# imported here, not first inside pytester's in-process runs (which unload what they import: numpy can't be)
import sparkgrad.spark.demo  # noqa: F401
from prerequisites import ENV, PREREQUISITES, require_or_skip, required

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
VALID = "valid names: java, cluster, nvcc, gpu, chromium"

JAVA_TEST = """
from prerequisites import require_java

def test_spark_thing():
    require_java()
"""


@pytest.fixture
def without_java(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Java to be found: JAVA_HOME names an empty directory (Spark, and the check, look there first)."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))


@pytest.mark.usefixtures("without_java")
def test_missing_java_fails_when_java_is_required(pytester: pytest.Pytester, monkeypatch) -> None:
    monkeypatch.setenv(ENV, "java")
    pytester.makepyfile(JAVA_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*prerequisite 'java' is required by SPARKGRAD_REQUIRE: Spark needs Java 17+: none found*"]
    )


@pytest.mark.usefixtures("without_java")
@pytest.mark.parametrize("require", [None, "", "gpu, nvcc"])
def test_missing_java_skips_unless_java_is_required(
    pytester: pytest.Pytester, monkeypatch, require: str | None
) -> None:
    if require is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, require)
    pytester.makepyfile(JAVA_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*Spark needs Java 17+: none found on JAVA_HOME / PATH*"])


def _outcome(name: str, available: bool) -> str:
    """What require_or_skip does, caught (a skip escaping a test would skip it rather than fail it)."""
    try:
        require_or_skip(name, available, "what is missing")
    except pytest.fail.Exception as exc:
        return f"fail: {exc}"
    except pytest.skip.Exception as exc:
        return f"skip: {exc}"
    return "run"


@pytest.mark.parametrize("name", list(PREREQUISITES))
def test_every_prerequisite_fails_only_when_listed(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(ENV, f" {name} ,")  # spaces and empty items are ignored
    assert _outcome(name, False) == f"fail: prerequisite '{name}' is required by {ENV}: what is missing"
    assert _outcome(name, True) == "run"
    monkeypatch.setenv(ENV, ",".join(other for other in PREREQUISITES if other != name))
    assert _outcome(name, False) == "skip: what is missing"
    assert _outcome(name, True) == "run"


def test_an_unknown_name_is_rejected_with_the_valid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "java,jvm")
    with pytest.raises(ValueError, match=f"^{ENV}: unknown prerequisite 'jvm'; {VALID}$"):
        required()
    monkeypatch.setenv(ENV, "")
    with pytest.raises(ValueError, match=f"unknown prerequisite 'jvm'; {VALID}$"):
        require_or_skip("jvm", False, "a typo in a test")


def test_pytest_refuses_to_start_with_an_unknown_name() -> None:
    # tests/conftest.py checks the variable once, before collection: a typo must not require nothing
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", __file__],
        cwd=ROOT,
        env={**os.environ, ENV: "java,clustr"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert f"{ENV}: unknown prerequisite 'clustr'; {VALID}" in result.stderr
