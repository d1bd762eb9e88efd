"""Shared fixtures: the cpu/cuda `device` parametrisation and hypothesis profiles."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import sparkgrad

# tests/python/reference holds the pure-NumPy references: `from reference.compress import ...`.
sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("SPARKGRAD_HYPOTHESIS_PROFILE", "ci"))


def _cuda_ready() -> bool:
    if not sparkgrad.cuda_available():
        return False
    try:
        import cupy  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(
    params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)],
)
def device(request: pytest.FixtureRequest) -> str:
    """Runs a test once on numpy arrays and once on cupy arrays (skipped without a CUDA build + GPU)."""
    if request.param == "cuda" and not _cuda_ready():
        pytest.skip("CUDA build with a visible GPU and cupy is required")
    return request.param
