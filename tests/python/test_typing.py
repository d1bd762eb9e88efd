"""Type checking: mypy passes over python/sparkgrad (configuration in pyproject.toml), user code typed
against the package is checked through its annotations (py.typed), and the native module's stub names
exactly the functions the module has."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkgrad import _core

ROOT = Path(__file__).resolve().parents[2]

# what a user writes (the README's style: enum settings as strings), which must type-check
_USER_CODE = """
import numpy as np
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Adam

conf = MultiLayerConfiguration(
    [DenseLayer(16, activation="relu"), OutputLayer(3, activation="softmax", loss="mcxent")],
    input_type=InputType.feed_forward(4), updater=Adam(1e-3), seed=1,
)
net: MultiLayerNetwork = MultiLayerNetwork(conf).init()
score: float = net.fit(DataSet(np.zeros((2, 4), np.float32), np.eye(3, dtype=np.float32)[:2])).score()
"""
# and a mistake the annotations must catch
_USER_MISTAKE = """
from sparkgrad.nn import DenseLayer

DenseLayer("sixteen")
"""


def _mypy(*targets: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", *map(str, targets)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.slow  # about a minute on 2 cores without mypy's cache
def test_mypy_passes_on_the_package_and_checks_user_code(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy comes with the test extra")
    package = _mypy()  # the files and settings of [tool.mypy]
    assert package.returncode == 0, package.stdout[-6000:] + package.stderr[-2000:]

    user, mistake = tmp_path / "user_code.py", tmp_path / "user_mistake.py"
    user.write_text(textwrap.dedent(_USER_CODE))
    mistake.write_text(textwrap.dedent(_USER_MISTAKE))
    checked = _mypy(user)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    caught = _mypy(mistake)
    assert (
        caught.returncode == 1 and 'Argument 1 to "DenseLayer" has incompatible type "str"' in caught.stdout
    ), caught.stdout + caught.stderr


def test_core_stub_names_exactly_the_native_functions() -> None:
    stub = ast.parse((ROOT / "python" / "sparkgrad" / "_core.pyi").read_text())
    stubbed = {node.name for node in stub.body if isinstance(node, ast.FunctionDef)}
    native = {name for name in dir(_core) if not name.startswith("_") and callable(getattr(_core, name))}
    assert stubbed == native, (
        f"missing from _core.pyi: {sorted(native - stubbed)}, extra: {sorted(stubbed - native)}"
    )
