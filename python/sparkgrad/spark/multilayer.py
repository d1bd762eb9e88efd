"""SparkMultiLayer: a MultiLayerNetwork trained and used on Spark. Everything but its LabeledPoint fits
is :class:`~sparkgrad.spark.network.SparkNetwork`'s, which it shares with SparkComputationGraph."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad.data import SerializedDataSetLoader
from sparkgrad.spark.checkpoint import CheckpointConfig
from sparkgrad.spark.network import EpochCallback, SparkNetwork, _FitRequest

if TYPE_CHECKING:
    from pyspark import RDD

    from sparkgrad.nn import MultiLayerNetwork


class SparkMultiLayer(SparkNetwork["MultiLayerNetwork"]):
    """A MultiLayerNetwork trained and used on Spark (DL4J ``SparkDl4jMultiLayer``); see
    :class:`SparkNetwork` for the resources it holds.

    Args:
        spark: SparkSession or SparkContext.
        network_or_conf: a MultiLayerNetwork, or a MultiLayerConfiguration (a network is built and
            initialised from it).
        training_master: ``SharedTrainingMaster`` or ``ParameterAveragingTrainingMaster``; default
            ``ParameterAveragingTrainingMaster()``.
    """

    _network_type = "MultiLayerNetwork"

    def fit_labeled_point(
        self,
        rdd: RDD,
        epochs: int = 1,
        epoch_callback: EpochCallback[MultiLayerNetwork] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> MultiLayerNetwork:
        """Train on ``pyspark.mllib.regression.LabeledPoint`` data (labels = class indices).

        Args:
            rdd: RDD of LabeledPoints.
            epochs: passes over the data, a positive int.
            epoch_callback: called after every epoch, as in :meth:`fit` (True stops early).
            checkpoint: as in :meth:`fit`.
            resume: as in :meth:`fit`.

        Returns:
            The trained network.
        """
        classes = int(self._network.conf.output_type.size)
        return self._fit_points(rdd, classes, _FitRequest.of(epochs, epoch_callback, checkpoint, resume))

    def fit_continuous_labeled_point(
        self,
        rdd: RDD,
        epochs: int = 1,
        epoch_callback: EpochCallback[MultiLayerNetwork] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> MultiLayerNetwork:
        """Train on LabeledPoint data with real-valued labels (one regression output).

        Args:
            rdd: RDD of LabeledPoints.
            epochs: passes over the data, a positive int.
            epoch_callback: called after every epoch, as in :meth:`fit` (True stops early).
            checkpoint: as in :meth:`fit`.
            resume: as in :meth:`fit`.

        Returns:
            The trained network.
        """
        return self._fit_points(rdd, None, _FitRequest.of(epochs, epoch_callback, checkpoint, resume))

    def _fit_points(self, rdd: RDD, classes: int | None, request: _FitRequest) -> MultiLayerNetwork:
        self._check_rdd(rdd, "rdd")
        batch = self._master.rdd_data_set_num_examples
        dtype = self._network.params().dtype
        datasets = rdd.mapPartitions(lambda it: _points_to_datasets(it, classes, batch, dtype))
        self._check_first(datasets, "rdd")
        return self._train(datasets, "dataset", SerializedDataSetLoader(), request)


def _points_to_datasets(
    points: Iterable[Any], classes: int | None, batch: int, dtype: np.dtype
) -> Iterator[Any]:
    """LabeledPoints -> DataSets of ``batch`` examples: one-hot labels (``classes``) or a regression label."""
    from pyspark.mllib.regression import LabeledPoint

    from sparkgrad.data import DataSet

    it = iter(points)
    while chunk := list(itertools.islice(it, batch)):
        if not isinstance(chunk[0], LabeledPoint):
            raise TypeError(f"rdd: expected LabeledPoint elements, found {type(chunk[0]).__name__}")
        x = np.stack([p.features.toArray() for p in chunk]).astype(dtype)
        y_raw = np.array([p.label for p in chunk])
        if classes is None:
            y = y_raw.reshape(-1, 1).astype(dtype)
        else:
            idx = y_raw.astype(np.int64)
            if np.any(idx != y_raw) or np.any(idx < 0) or np.any(idx >= classes):
                raise ValueError(f"rdd: labels must be class indices in [0, {classes}), got {y_raw[:5]}")
            y = np.eye(classes, dtype=dtype)[idx]
        yield DataSet(x, y)


__all__ = ["SparkMultiLayer", "SparkNetwork"]
