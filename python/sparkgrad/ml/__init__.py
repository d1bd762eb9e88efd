"""Spark ML integration: sparkgrad networks as ``pyspark.ml`` estimators and models.

- :class:`SparkgradClassifier` -> :class:`SparkgradClassificationModel`: class probabilities,
  raw predictions and the predicted class, for ``MulticlassClassificationEvaluator`` and
  ``BinaryClassificationEvaluator``.
- :class:`SparkgradRegressor` -> :class:`SparkgradRegressionModel`: the network's output as the
  prediction, for ``RegressionEvaluator``.

The estimators take the network configuration (a MultiLayerConfiguration, or a
ComputationGraphConfiguration with one input and one output) and the training master as params
(stored as JSON), train through :class:`sparkgrad.spark.SparkMultiLayer` or
:class:`sparkgrad.spark.SparkComputationGraph` on DataFrames converted per partition in Arrow
batches (:mod:`sparkgrad.spark.columns`), and fit into ``Pipeline`` and ``CrossValidator`` like
Spark's own. The models' ``transform`` runs the network on the executors over Arrow batches
of the features alone, and they save to and load from any Hadoop path (:mod:`sparkgrad.ml.persistence`).

Needs the ``spark`` extra (pyspark 4.1 or later, pandas and pyarrow for the Arrow transfer).
"""

from __future__ import annotations

import pyspark

from sparkgrad.errors import EnvironmentNotReadyError

if tuple(int(part) for part in pyspark.__version__.split(".")[:2]) < (4, 1):
    raise EnvironmentNotReadyError(
        f"sparkgrad.ml needs pyspark 4.1 or later (its Arrow transfer of Vector columns, and arrow_udf "
        f"for transform), found {pyspark.__version__}: pip install 'pyspark>=4.1'"
    )

from sparkgrad.ml.estimators import (  # noqa: E402 - after the version check
    SparkgradClassificationModel,
    SparkgradClassifier,
    SparkgradRegressionModel,
    SparkgradRegressor,
)

__all__ = [
    "SparkgradClassificationModel",
    "SparkgradClassifier",
    "SparkgradRegressionModel",
    "SparkgradRegressor",
]
