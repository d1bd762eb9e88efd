"""Shared fixtures: the cpu/cuda `device` parametrisation and hypothesis profiles; SPARKGRAD_REQUIRE."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# tests/python/reference holds the pure-NumPy references: `from reference.compress import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))
# tests/prerequisites.py: `from prerequisites import require_or_skip, ...` in any test module.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prerequisites import require_gpu, required  # noqa: E402

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
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


@pytest.fixture(
    params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)],
)
def device(request: pytest.FixtureRequest) -> str:
    """Runs a test once on numpy arrays and once on cupy arrays (skipped without a CUDA build + GPU)."""
    if request.param == "cuda":
        require_gpu()
    return request.param
