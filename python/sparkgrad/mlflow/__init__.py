"""MLflow integration: experiment tracking of distributed fits and an MLflow model flavor.

- :func:`autolog`: every ``SparkMultiLayer`` / ``SparkComputationGraph`` / ``sparkgrad.ml`` fit logs the
  network configuration and the training master's options as params, per-epoch metrics (loss,
  examples/s, bytes on the wire, update density, threshold, the epoch callback's metrics) with the epoch
  as step, the training stats' HTML report and the trained model; ``CrossValidator`` and
  ``TrainValidationSplit`` fits of sparkgrad estimators get a run with a nested run per fit.
- :class:`MlflowLogger`: the same for one model, ``spark_net.add_fit_listener(MlflowLogger())``.
- :func:`log_model` / :func:`save_model` / :func:`load_model`: the ``sparkgrad`` flavor, with a
  ``python_function`` flavor, so ``mlflow.pyfunc.load_model(uri).predict(pandas_df)`` and
  ``mlflow.pyfunc.spark_udf(spark, uri)`` score with the network.

MLflow is optional (``pip install "sparkgrad[mlflow]"``): this module imports without it, and its
functions raise :class:`~sparkgrad.errors.EnvironmentNotReadyError` naming the extra.
"""

from __future__ import annotations

from sparkgrad.mlflow._autolog import MlflowLogger, autolog
from sparkgrad.mlflow._flavor import (
    FLAVOR_NAME,
    SparkgradPyfuncModel,
    _load_pyfunc,
    get_default_conda_env,
    get_default_pip_requirements,
    load_model,
    log_model,
    save_model,
)

__all__ = [
    "FLAVOR_NAME",
    "MlflowLogger",
    "SparkgradPyfuncModel",
    "_load_pyfunc",
    "autolog",
    "get_default_conda_env",
    "get_default_pip_requirements",
    "load_model",
    "log_model",
    "save_model",
]
