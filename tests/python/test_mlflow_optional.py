"""sparkgrad without MLflow installed: everything imports and trains, sparkgrad.mlflow names the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# a meta-path finder that makes every ``import mlflow...`` fail as it does where MLflow is not installed
_NO_MLFLOW = textwrap.dedent(
    """
    import sys

    class NoMlflow:
        def find_spec(self, name, path=None, target=None):
            if name == "mlflow" or name.startswith("mlflow."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoMlflow())
    """
)


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _NO_MLFLOW + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sparkgrad_imports_and_trains_without_mlflow() -> None:
    done = _run(
        """
        import numpy as np
        import sparkgrad, sparkgrad.nn, sparkgrad.spark, sparkgrad.mlflow
        from sparkgrad.data import DataSet
        from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork
        from sparkgrad.nn import OutputLayer

        conf = MultiLayerConfiguration(
            [DenseLayer(4, activation="tanh"), OutputLayer(2, activation="softmax", loss="mcxent")],
            input_type=InputType.feed_forward(3), seed=1,
        )
        net = MultiLayerNetwork(conf).init()
        x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        net.fit(DataSet(x, np.eye(2, dtype=np.float32)[np.arange(8) % 2]))
        assert net.iteration_count == 1
        assert "mlflow" not in sys.modules
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_autolog_and_log_model_without_mlflow_name_the_extra() -> None:
    done = _run(
        """
        import sparkgrad.mlflow
        from sparkgrad.errors import EnvironmentNotReadyError

        for call in (sparkgrad.mlflow.autolog, lambda: sparkgrad.mlflow.log_model(None)):
            try:
                call()
            except EnvironmentNotReadyError as exc:
                print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    message = 'sparkgrad.mlflow needs MLflow, which is not installed: pip install "sparkgrad[mlflow]"'
    assert done.stdout.splitlines() == [message, message]
