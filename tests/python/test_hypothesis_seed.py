"""Hypothesis explores a fresh seed per run (tests/conftest.py): the seed is printed, replays the run's
examples for any selection of tests, and the example database keeps failures."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parents[1]

PROPERTIES = """
import os

from hypothesis import given, settings, strategies as st


def record(kind, x):
    with open(os.environ["EXAMPLES"], "a") as f:
        f.write(f"{kind} {x}\\n")


@given(st.integers())
def test_decorated(x):
    record("decorated", x)


def test_inner():  # a property defined inside a test, as the fuzz suites do
    @settings(max_examples=5)
    @given(st.integers())
    def inner(x):
        record("inner", x)

    inner()
"""


@pytest.fixture(params=["local", "ci"])
def project(
    request: pytest.FixtureRequest, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> pytest.Pytester:
    """A directory with this suite's conftest.py (and the prerequisites module it imports), run
    without and with $CI (where hypothesis would load its own derandomized, database-less profile)."""
    if request.param == "ci":
        monkeypatch.setenv("CI", "true")
    else:
        monkeypatch.delenv("CI", raising=False)
    for name in ("conftest.py", "prerequisites.py"):
        shutil.copy(TESTS / name, pytester.path / name)
    return pytester


def _run(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[str, list[str]]:
    """(stdout, the examples the properties saw, in order) of one subprocess pytest run."""
    examples = project.path / "examples.txt"
    examples.unlink(missing_ok=True)
    monkeypatch.setenv("EXAMPLES", str(examples))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.stdout.str()
    return result.stdout.str(), examples.read_text().splitlines()


def test_a_seed_replays_its_examples_and_another_explores(project, monkeypatch) -> None:
    project.makepyfile(test_properties=PROPERTIES)
    output, fresh = _run(project, monkeypatch)
    seed = re.search(r"hypothesis seed (\d+) \(reproduce with --hypothesis-seed=\1\)", output)
    assert seed is not None, output
    _, replayed = _run(project, monkeypatch, f"--hypothesis-seed={seed.group(1)}")
    assert replayed == fresh
    # per test: the inner property alone sees what it saw in the whole run
    _, alone = _run(
        project, monkeypatch, f"--hypothesis-seed={seed.group(1)}", "test_properties.py::test_inner"
    )
    assert alone == [line for line in fresh if line.startswith("inner ")]
    _, other = _run(project, monkeypatch, f"--hypothesis-seed={int(seed.group(1)) + 1}")
    assert other != fresh


def test_a_failure_names_its_seed_and_is_kept(project, monkeypatch) -> None:
    project.makepyfile(
        test_failing="""
from hypothesis import given, strategies as st

@given(st.integers())
def test_small(x):
    assert x < 1000
"""
    )
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--hypothesis-seed=7")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["hypothesis seed 7: rerun a failure with --hypothesis-seed=7"])
    assert any((project.path / ".hypothesis" / "examples").iterdir())  # the database is on
