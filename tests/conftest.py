"""Shared fixtures: the cpu/cuda `device` parametrisation, hypothesis profiles and seed; SPARKGRAD_REQUIRE."""

from __future__ import annotations

import os
import random
import secrets
import sys
from pathlib import Path

import hypothesis.core
import pytest
from hypothesis import HealthCheck, settings

# tests/python/reference holds the pure-NumPy references: `from reference.compress import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))
# tests/prerequisites.py: `from prerequisites import require_or_skip, ...` in any test module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prerequisites import require_gpu, required  # noqa: E402

# Not derandomized: every run explores new examples from a fresh, printed seed (see _hypothesis_seed)
# and failing examples are kept in the example database (.hypothesis/) and replayed first next time.
# The parent is hypothesis's "default" profile, named: where a CI variable is set ($CI and others),
# hypothesis loads its own "ci" profile (derandomized, no database) and would otherwise be the parent.
_NOT_DERANDOMIZED = settings.get_profile("default")
settings.register_profile(
    "ci",
    _NOT_DERANDOMIZED,
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "dev", _NOT_DERANDOMIZED, max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("SPARKGRAD_HYPOTHESIS_PROFILE", "ci"))

# Fuzz suites: a few thousand cases in CI, many more with `--fuzz-long`.
FUZZ_EXAMPLES = 2000
FUZZ_LONG_EXAMPLES = 50000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        default=False,
        help=f"run the fuzz suites with {FUZZ_LONG_EXAMPLES} cases each instead of {FUZZ_EXAMPLES}",
    )


@pytest.fixture(scope="session")
def fuzz_examples(request: pytest.FixtureRequest) -> int:
    """How many cases a fuzz test runs: FUZZ_EXAMPLES, or FUZZ_LONG_EXAMPLES with --fuzz-long.

    Use it as ``settings(max_examples=fuzz_examples)(test)()`` inside the test (hypothesis reads
    settings when the test is defined, so the option has to be applied at run time).
    """
    return FUZZ_LONG_EXAMPLES if request.config.getoption("--fuzz-long") else FUZZ_EXAMPLES


def pytest_configure(config: pytest.Config) -> None:
    # a misspelt SPARKGRAD_REQUIRE would otherwise require nothing, silently
    try:
        required()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    given = config.getoption("--hypothesis-seed")
    try:
        config.stash[_SEED] = secrets.randbelow(2**32) if given is None else int(given)
    except ValueError:
        raise pytest.UsageError(f"--hypothesis-seed must be an integer, got {given!r}") from None
    try:
        hypothesis.core.threadlocal._hypothesis_global_random  # noqa: B018 (what _hypothesis_seed sets)
    except AttributeError:
        message = "hypothesis.core has no per-thread generator: update _hypothesis_seed"
        raise pytest.UsageError(message) from None


# One seed per run. Each test's examples come from (seed, test id), so `--hypothesis-seed=N` replays
# run N's examples for any selection of tests. Hypothesis's own --hypothesis-seed forces one Random(N)
# for every test and turns the example database off; seeding its per-thread generator instead keeps it.
_SEED = pytest.StashKey[int]()


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    hypothesis.core.global_force_seed = None  # set by hypothesis's plugin from --hypothesis-seed


@pytest.fixture(autouse=True)
def _hypothesis_seed(request: pytest.FixtureRequest) -> None:
    seed = request.config.stash[_SEED]
    hypothesis.core.threadlocal._hypothesis_global_random = random.Random(f"{seed}:{request.node.nodeid}")


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.stash[_SEED]
    return f"hypothesis seed {seed} (reproduce with --hypothesis-seed={seed})"


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if exitstatus != 0:
        seed = config.stash[_SEED]
        terminalreporter.write_line(f"hypothesis seed {seed}: rerun a failure with --hypothesis-seed={seed}")


@pytest.fixture(
    params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)],
)
def device(request: pytest.FixtureRequest) -> str:
    """Runs a test once on numpy arrays and once on cupy arrays (skipped without a CUDA build + GPU)."""
    if request.param == "cuda":
        require_gpu()
    return request.param
