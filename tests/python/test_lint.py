"""The tree stays ruff-clean (configuration in pyproject.toml), so style drift fails CI, not review."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.prefix) / "bin" / "ruff").exists(),
    reason="ruff is not installed (it comes with the test extra)",
)
def test_ruff_check_passes() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.prefix) / "bin" / "ruff")
    result = subprocess.run(
        [ruff, "check", "python", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
