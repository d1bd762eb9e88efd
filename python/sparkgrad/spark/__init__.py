"""Distributed training on Apache Spark: SparkMultiLayer and SparkComputationGraph with parameter averaging
or gradient sharing.

- :class:`SparkMultiLayer` / :class:`SparkComputationGraph`: fit, distributed evaluation, scoring and keyed
  inference of a MultiLayerNetwork / ComputationGraph, one code path (:class:`SparkNetwork`) for both.
- :class:`ParameterAveragingTrainingMaster`: synchronous parameter averaging, every round of a fit in one
  Spark job over the transport (:class:`AveragingJobs`) or DL4J's job per round.
- :class:`SharedTrainingMaster`: asynchronous sharing of threshold-encoded updates through a ZeroMQ
  controller on the driver (wire format in :mod:`sparkgrad.transport.frame`).
- :class:`Repartitioner`: how a master spreads the data over partitions (DL4J's interface), with
  :class:`DefaultRepartitioner`, :class:`EqualRepartitioner` and :class:`NoOpRepartitioner`.
- :class:`SparkTrainingStats`: phase timings, traffic and per-iteration series with an HTML report.
- :class:`FitListener`: observes every fit (experiment tracking, :mod:`sparkgrad.spark.tracking`).
- :func:`export_minibatches`, :func:`read_saved`: training data on any file system Spark reads (HDFS,
  S3, ABFS, GCS): minibatches exported once, then fitted and evaluated from the directory
  (:mod:`sparkgrad.spark.storage`).
"""

from __future__ import annotations

from sparkgrad.spark.checkpoint import CheckpointConfig
from sparkgrad.spark.config import (
    AveragingJobs,
    DefaultRepartitioner,
    EqualRepartitioner,
    MeshBuildMode,
    NoOpRepartitioner,
    RDDTrainingApproach,
    Repartition,
    Repartitioner,
    RepartitionStrategy,
    TrainingHook,
    VoidConfiguration,
)
from sparkgrad.spark.early_stopping import (
    BestScoreEpochTerminationCondition,
    DataSetLossCalculator,
    EarlyStoppingConfiguration,
    EarlyStoppingResult,
    EvaluationScoreCalculator,
    FileModelSaver,
    InMemoryModelSaver,
    InvalidScoreIterationTerminationCondition,
    MaxEpochsTerminationCondition,
    MaxTimeIterationTerminationCondition,
    ScoreImprovementEpochTerminationCondition,
    SparkEarlyStoppingTrainer,
)
from sparkgrad.spark.graph import SparkComputationGraph
from sparkgrad.spark.multilayer import SparkMultiLayer
from sparkgrad.spark.network import SparkNetwork
from sparkgrad.spark.parameter_averaging import ParameterAveragingTrainingMaster
from sparkgrad.spark.shared import SharedTrainingMaster
from sparkgrad.spark.stats import EventStats, SparkTrainingStats
from sparkgrad.spark.storage import export_minibatches, read_saved
from sparkgrad.spark.tracking import FitListener, add_fit_listener, remove_fit_listener
from sparkgrad.transport import ZmqTransportConfiguration

__all__ = [
    "AveragingJobs",
    "BestScoreEpochTerminationCondition",
    "CheckpointConfig",
    "DataSetLossCalculator",
    "DefaultRepartitioner",
    "EarlyStoppingConfiguration",
    "EarlyStoppingResult",
    "EqualRepartitioner",
    "EvaluationScoreCalculator",
    "EventStats",
    "FileModelSaver",
    "FitListener",
    "InMemoryModelSaver",
    "InvalidScoreIterationTerminationCondition",
    "MaxEpochsTerminationCondition",
    "MaxTimeIterationTerminationCondition",
    "MeshBuildMode",
    "NoOpRepartitioner",
    "ParameterAveragingTrainingMaster",
    "RDDTrainingApproach",
    "Repartition",
    "RepartitionStrategy",
    "Repartitioner",
    "ScoreImprovementEpochTerminationCondition",
    "SharedTrainingMaster",
    "SparkComputationGraph",
    "SparkEarlyStoppingTrainer",
    "SparkMultiLayer",
    "SparkNetwork",
    "SparkTrainingStats",
    "TrainingHook",
    "VoidConfiguration",
    "ZmqTransportConfiguration",
    "add_fit_listener",
    "export_minibatches",
    "read_saved",
    "remove_fit_listener",
]
