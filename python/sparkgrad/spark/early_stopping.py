"""Early stopping on Spark: DL4J's ``EarlyStoppingConfiguration`` and ``SparkEarlyStoppingTrainer``.

A configuration names how an epoch is scored (a :class:`ScoreCalculator`: the loss, or any metric of the
evaluation classes, on validation data), when training ends (epoch termination conditions: a number of
epochs, no improvement for some epochs, a score reached; iteration conditions: a time limit, a score that
is not finite) and where the best and latest models go (a :class:`ModelSaver`: memory, or a local or
Hadoop directory). :class:`SparkEarlyStoppingTrainer` trains a ``SparkMultiLayer`` or
``SparkComputationGraph`` with it and returns an :class:`EarlyStoppingResult`.

Where the validation data is scored decides how the fit runs:

- a ``DataSet`` / ``MultiDataSet`` (validation data that fits the driver): scored on the driver at every
  epoch end, inside the fit's one Spark job (both masters' default), as an ``epoch_callback`` is;
- an RDD of DataSets or a DataFrame (any size): scored on the executors by a Spark job. A Spark job
  started while the one-job fit runs would wait for the task slots its training tasks hold, so the
  trainer then runs one fit per epoch (what DL4J's SparkEarlyStoppingTrainer does): the data stays
  prepared and persisted between them, gradient sharing carries its threshold from fit to fit, and the
  workers' updater states are averaged at every fit's end. The cost is measured in
  docs/guides/checkpoints.md#early-stopping.

Iteration termination conditions are checked at every epoch end: a Spark fit stops cleanly only there.
"""

from __future__ import annotations

import abc
import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkgrad._config import check_int
from sparkgrad._io import is_uri

if TYPE_CHECKING:
    from sparkgrad.spark.network import SparkNetwork

log = logging.getLogger(__name__)


# -- termination conditions -------------------------------------------------------------------------
class EpochTerminationCondition(abc.ABC):
    """Decides after a scored epoch whether training ends (DL4J ``EpochTerminationCondition``)."""

    def initialize(self) -> None:  # noqa: B027 - a stateless condition has nothing to reset
        """Called once before training: forget any state of an earlier fit."""

    @abc.abstractmethod
    def terminate(self, epoch: int, score: float, minimize: bool) -> bool:
        """Whether to stop after ``epoch`` (0-based, counted from the trainer's start) with ``score``."""


@dataclass
class MaxEpochsTerminationCondition(EpochTerminationCondition):
    """Stop once ``max_epochs`` epochs are trained."""

    max_epochs: int

    def __post_init__(self) -> None:
        self.max_epochs = check_int("max_epochs", self.max_epochs, minimum=1)

    def terminate(self, epoch: int, score: float, minimize: bool) -> bool:
        return epoch + 1 >= self.max_epochs


@dataclass
class ScoreImprovementEpochTerminationCondition(EpochTerminationCondition):
    """Stop when the score has not improved on the best so far by more than ``min_improvement`` for
    ``max_epochs_without_improvement`` scored epochs in a row (patience)."""

    max_epochs_without_improvement: int
    min_improvement: float = 0.0
    _best: float = field(default=math.nan, init=False, repr=False)
    _waited: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.max_epochs_without_improvement = check_int(
            "max_epochs_without_improvement", self.max_epochs_without_improvement, minimum=1
        )
        if not (isinstance(self.min_improvement, (int, float)) and 0 <= self.min_improvement < math.inf):
            raise ValueError(f"min_improvement: expected a finite number >= 0, got {self.min_improvement!r}")

    def initialize(self) -> None:
        self._best, self._waited = math.nan, 0

    def terminate(self, epoch: int, score: float, minimize: bool) -> bool:
        gain = (self._best - score) if minimize else (score - self._best)
        if math.isnan(self._best) or gain > self.min_improvement:
            self._best, self._waited = score, 0
            return False
        self._waited += 1
        return self._waited >= self.max_epochs_without_improvement


@dataclass
class BestScoreEpochTerminationCondition(EpochTerminationCondition):
    """Stop once the score reaches ``best_expected_score`` (at most it when minimizing, at least it
    otherwise)."""

    best_expected_score: float

    def terminate(self, epoch: int, score: float, minimize: bool) -> bool:
        return score <= self.best_expected_score if minimize else score >= self.best_expected_score


class IterationTerminationCondition(abc.ABC):
    """Decides whether training ends at once (DL4J ``IterationTerminationCondition``); on Spark checked
    at every epoch end, scored or not, with the latest score (None before the first)."""

    def initialize(self) -> None:  # noqa: B027 - a stateless condition has nothing to reset
        """Called once before training."""

    @abc.abstractmethod
    def terminate(self, score: float | None) -> bool:
        """Whether to stop now."""


@dataclass
class MaxTimeIterationTerminationCondition(IterationTerminationCondition):
    """Stop once ``max_time_s`` seconds have passed since training started."""

    max_time_s: float
    _start: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.max_time_s, (int, float)) and 0 < self.max_time_s < math.inf):
            raise ValueError(
                f"max_time_s: expected a positive finite number of seconds, got {self.max_time_s!r}"
            )

    def initialize(self) -> None:
        self._start = time.monotonic()

    def terminate(self, score: float | None) -> bool:
        return time.monotonic() - self._start >= self.max_time_s


@dataclass
class InvalidScoreIterationTerminationCondition(IterationTerminationCondition):
    """Stop when the score is NaN or infinite (training diverged)."""

    def terminate(self, score: float | None) -> bool:
        return score is not None and not math.isfinite(score)


# -- score calculators ------------------------------------------------------------------------------
_METRICS: dict[str, tuple[str, str, bool]] = {
    # name: (evaluation, how to read it, minimize)
    "accuracy": ("classification", "accuracy", False),
    "f1": ("classification", "f1", False),
    "precision": ("classification", "precision", False),
    "recall": ("classification", "recall", False),
    "matthews_correlation": ("classification", "matthews_correlation", False),
    "mse": ("regression", "average_mean_squared_error", True),
    "mae": ("regression", "average_mean_absolute_error", True),
    "rmse": ("regression", "average_root_mean_squared_error", True),
    "r2": ("regression", "average_r_squared", False),
    "pearson": ("regression", "average_pearson_correlation", False),
    "auc": ("roc", "calculate_auc", False),
    "auprc": ("roc", "calculate_auprc", False),
}


class ScoreCalculator(abc.ABC):
    """Scores the model after an epoch (DL4J ``ScoreCalculator``)."""

    minimize: bool  # whether a lower score is better

    def __init__(self, data: Any, features_col: str = "features", label_col: str = "label") -> None:
        from sparkgrad.data import DataSet, MultiDataSet

        self.data = data
        self.local = isinstance(data, (DataSet, MultiDataSet))
        self.features_col, self.label_col = features_col, label_col
        self._frame: tuple[Any, Any] | None = None  # (DataFrame, its DataSet RDD)
        if not self.local:
            from pyspark import RDD

            from sparkgrad.spark.columns import is_dataframe

            if not isinstance(data, RDD) and not is_dataframe(data):
                raise TypeError(
                    "data: expected a DataSet or MultiDataSet (scored on the driver), an RDD of them or a "
                    f"DataFrame (scored on the executors), got {type(data).__name__}"
                )

    def _rdd(self, model: SparkNetwork) -> Any:
        """The validation data as an RDD of DataSets (a DataFrame converted once, as a fit converts it)."""
        from sparkgrad.spark.columns import dataframe_datasets, is_dataframe

        if not is_dataframe(self.data):
            return self.data
        if self._frame is None:
            conf = model.network.conf
            rdd = dataframe_datasets(self.data, self.features_col, self.label_col, conf, 64).cache()
            self._frame = (self.data, rdd)
        return self._frame[1]

    def release(self) -> None:
        """Unpersist what scoring cached."""
        if self._frame is not None:
            self._frame[1].unpersist()
            self._frame = None

    @abc.abstractmethod
    def calculate_score(self, model: SparkNetwork) -> float:
        """The score of ``model``'s network now."""


class DataSetLossCalculator(ScoreCalculator):
    """The mean loss (with the l1/l2 penalty) over validation data (DL4J ``DataSetLossCalculator``).

    Args:
        data: a DataSet or MultiDataSet (scored on the driver, inside a one-job fit), an RDD of them or a
            DataFrame (scored on the executors by a Spark job: the trainer then fits an epoch at a time).
        features_col: with a DataFrame, its features column.
        label_col: with a DataFrame, its label column.
    """

    minimize = True

    def calculate_score(self, model: SparkNetwork) -> float:
        if self.local:
            return float(model.network.score(self.data))
        return float(model.calculate_score(self._rdd(model)))


class EvaluationScoreCalculator(ScoreCalculator):
    """A metric of the evaluation classes over validation data (DL4J's ClassificationScoreCalculator,
    RegressionScoreCalculator and ROCScoreCalculator in one).

    Args:
        metric: ``accuracy``, ``f1``, ``precision``, ``recall``, ``matthews_correlation``
            (classification); ``mse``, ``mae``, ``rmse``, ``r2``, ``pearson`` (regression, averaged
            over the outputs); ``auc``, ``auprc`` (ROC of a binary output).
        data: as for :class:`DataSetLossCalculator`.
        features_col: as for :class:`DataSetLossCalculator`.
        label_col: as for :class:`DataSetLossCalculator`.
    """

    def __init__(
        self, metric: str, data: Any, features_col: str = "features", label_col: str = "label"
    ) -> None:
        if metric not in _METRICS:
            raise ValueError(f"metric: expected one of {', '.join(_METRICS)}, got {metric!r}")
        super().__init__(data, features_col, label_col)
        self.metric = metric
        self.minimize = _METRICS[metric][2]

    def calculate_score(self, model: SparkNetwork) -> float:
        kind, reader, _ = _METRICS[self.metric]
        method = {"classification": "evaluate", "regression": "evaluate_regression", "roc": "evaluate_roc"}[
            kind
        ]
        if self.local:  # the network's own evaluation, on the driver
            evaluation = getattr(model.network, method)(self.data)
        else:  # the Spark model's: a Spark job over the RDD
            evaluation = getattr(model, method)(self._rdd(model))
        return float(getattr(evaluation, reader)())


# -- model savers ---------------------------------------------------------------------------------
class ModelSaver(abc.ABC):
    """Keeps the best and the latest network (DL4J ``EarlyStoppingModelSaver``)."""

    @abc.abstractmethod
    def save_best_model(self, network: Any, score: float) -> None: ...

    @abc.abstractmethod
    def save_latest_model(self, network: Any, score: float) -> None: ...

    @abc.abstractmethod
    def get_best_model(self) -> Any: ...

    @abc.abstractmethod
    def get_latest_model(self) -> Any: ...


class InMemoryModelSaver(ModelSaver):
    """Copies of the networks, in the driver's memory."""

    def __init__(self) -> None:
        self._best: Any = None
        self._latest: Any = None

    def save_best_model(self, network: Any, score: float) -> None:
        self._best = network.clone()

    def save_latest_model(self, network: Any, score: float) -> None:
        self._latest = network.clone()

    def get_best_model(self) -> Any:
        return self._best

    def get_latest_model(self) -> Any:
        return self._latest


class FileModelSaver(ModelSaver):
    """Model files ``bestModel.zip`` and ``latestModel.zip`` in a directory: a local path or a Hadoop
    URI (DL4J's LocalFileModelSaver), each replaced atomically.

    Args:
        directory: where the files go (a local directory is created).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = os.fspath(directory)
        if not self.directory:
            raise ValueError("directory: expected a non-empty path or URI")
        self._type: Any = None

    def _path(self, name: str) -> str:
        if not is_uri(self.directory):
            os.makedirs(self.directory, exist_ok=True)
            return os.path.join(self.directory, name)
        return f"{self.directory.rstrip('/')}/{name}"

    def save_best_model(self, network: Any, score: float) -> None:
        self._type = type(network)
        network.save(self._path("bestModel.zip"))

    def save_latest_model(self, network: Any, score: float) -> None:
        self._type = type(network)
        network.save(self._path("latestModel.zip"))

    def get_best_model(self) -> Any:
        return None if self._type is None else self._type.load(self._path("bestModel.zip"))

    def get_latest_model(self) -> Any:
        return None if self._type is None else self._type.load(self._path("latestModel.zip"))


# -- configuration, result, trainer ---------------------------------------------------------------
@dataclass
class EarlyStoppingConfiguration:
    """How early stopping scores, ends and saves (DL4J ``EarlyStoppingConfiguration``).

    Args:
        score_calculator: scores an epoch (:class:`DataSetLossCalculator`,
            :class:`EvaluationScoreCalculator`).
        epoch_termination_conditions: checked after every scored epoch; at least one, and training
            needs an end: with neither :class:`MaxEpochsTerminationCondition` nor
            :class:`ScoreImprovementEpochTerminationCondition` a :class:`BestScoreEpochTerminationCondition`
            may never hold, so one of the first two is required.
        iteration_termination_conditions: checked at every epoch end.
        model_saver: where the best (and latest) network goes (default: in memory).
        evaluate_every_n_epochs: score every this many epochs (and at the last).
        save_last_model: also keep the latest network.
    """

    score_calculator: ScoreCalculator
    epoch_termination_conditions: list[EpochTerminationCondition] = field(default_factory=list)
    iteration_termination_conditions: list[IterationTerminationCondition] = field(default_factory=list)
    model_saver: ModelSaver = field(default_factory=InMemoryModelSaver)
    evaluate_every_n_epochs: int = 1
    save_last_model: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.score_calculator, ScoreCalculator):
            raise TypeError(
                f"score_calculator: expected a ScoreCalculator, got {type(self.score_calculator).__name__}"
            )
        bounded = (MaxEpochsTerminationCondition, ScoreImprovementEpochTerminationCondition)
        if not any(isinstance(c, bounded) for c in self.epoch_termination_conditions):
            raise ValueError(
                "epoch_termination_conditions: include a MaxEpochsTerminationCondition or a "
                "ScoreImprovementEpochTerminationCondition, so that training ends"
            )
        self.evaluate_every_n_epochs = check_int(
            "evaluate_every_n_epochs", self.evaluate_every_n_epochs, minimum=1
        )

    @property
    def max_epochs(self) -> int | None:
        limits = [
            c.max_epochs
            for c in self.epoch_termination_conditions
            if isinstance(c, MaxEpochsTerminationCondition)
        ]
        return min(limits) if limits else None


@dataclass
class EarlyStoppingResult:
    """What early stopping ended with (DL4J ``EarlyStoppingResult``).

    Attributes:
        termination_reason: ``"EpochTerminationCondition"``, ``"IterationTerminationCondition"`` or
            ``"Error"`` (an exception in training or scoring; it is re-raised after the result is built
            only when no epoch was scored).
        termination_details: the condition that held (its repr), or the error.
        score_vs_epoch: the score of every scored epoch (0-based, from the trainer's start).
        best_model_epoch: the epoch of the best score (-1 when none was scored).
        best_model_score: the best score.
        total_epochs: epochs trained.
        best_model: the network of the best score (from the model saver).
    """

    termination_reason: str
    termination_details: str
    score_vs_epoch: dict[int, float]
    best_model_epoch: int
    best_model_score: float
    total_epochs: int
    best_model: Any


class SparkEarlyStoppingTrainer:
    """Trains a Spark model until a termination condition of ``config`` holds (DL4J
    ``SparkEarlyStoppingTrainer``); see the module docstring for where scoring runs.

    Args:
        model: a ``SparkMultiLayer`` or ``SparkComputationGraph`` (its training master trains).
        config: the :class:`EarlyStoppingConfiguration`.
        data: the training data, anything the model's ``fit`` takes.
        features_col: with a DataFrame, its features column (as for ``fit``).
        label_col: with a DataFrame, its label column.

    A restartable early-stopping fit keeps its latest network with ``save_last_model=True`` and a
    :class:`FileModelSaver`; ``fit(checkpoint=...)`` is for fits of a fixed number of epochs.
    """

    def __init__(
        self,
        model: SparkNetwork,
        config: EarlyStoppingConfiguration,
        data: Any,
        features_col: str = "features",
        label_col: str = "label",
    ) -> None:
        from sparkgrad.spark.network import SparkNetwork

        if not isinstance(model, SparkNetwork):
            raise TypeError(
                f"model: expected a SparkMultiLayer or SparkComputationGraph, got {type(model).__name__}"
            )
        if not isinstance(config, EarlyStoppingConfiguration):
            raise TypeError(f"config: expected an EarlyStoppingConfiguration, got {type(config).__name__}")
        self.model, self.config, self.data = model, config, data
        self.features_col, self.label_col = features_col, label_col

    def fit(self) -> EarlyStoppingResult:
        """Train, score and save as the configuration says; returns the result (the model's network is
        the last one trained; ``result.best_model`` the best)."""
        config = self.config
        for epoch_condition in config.epoch_termination_conditions:
            epoch_condition.initialize()
        for iteration_condition in config.iteration_termination_conditions:
            iteration_condition.initialize()
        calculator = config.score_calculator
        state = _Progress(config, int(self.model.network.epoch_count))
        limit = config.max_epochs or 2**31 - 1
        try:
            if calculator.local:  # every epoch in one fit, scored on the driver in its callback
                self.model.fit(
                    self.data,
                    epochs=limit,
                    epoch_callback=state.after_epoch(self.model),
                    features_col=self.features_col,
                    label_col=self.label_col,
                )
            else:  # a Spark job scores: one fit per epoch
                after = state.after_epoch(self.model)
                for _ in range(limit):
                    self.model.fit(
                        self.data, epochs=1, features_col=self.features_col, label_col=self.label_col
                    )
                    if after(int(self.model.network.epoch_count) - 1, self.model.network)["stop"]:
                        break
        except Exception as exc:
            if not state.scores:
                raise
            log.exception("early stopping: training failed after %d epochs", state.epochs)
            state.reason, state.details = "Error", f"{type(exc).__name__}: {exc}"
        finally:
            calculator.release()
        if state.reason is None:  # the fit ran all its epochs without a condition holding
            state.reason, state.details = (
                "EpochTerminationCondition",
                f"MaxEpochsTerminationCondition({limit})",
            )
        best = config.model_saver.get_best_model()
        return EarlyStoppingResult(
            state.reason,
            state.details,
            dict(state.scores),
            state.best_epoch,
            state.best_score,
            state.epochs,
            best,
        )


class _Progress:
    """The trainer's state between epochs: scores, the best so far, and why it stopped."""

    def __init__(self, config: EarlyStoppingConfiguration, first_epoch: int) -> None:
        self.config, self.first_epoch = config, first_epoch
        self.scores: dict[int, float] = {}
        self.best_epoch, self.best_score = -1, math.nan
        self.epochs = 0
        self.reason: str | None = None
        self.details = ""

    def after_epoch(self, model: SparkNetwork) -> Any:
        config = self.config
        calculator = config.score_calculator

        def callback(epoch: int, network: Any) -> dict[str, Any]:
            index = epoch - self.first_epoch  # counted from the trainer's start
            self.epochs = index + 1
            last = config.max_epochs is not None and index + 1 >= config.max_epochs
            score = self.scores[max(self.scores)] if self.scores else None
            scored = (index + 1) % config.evaluate_every_n_epochs == 0 or last
            if scored:
                score = calculator.calculate_score(model)
                self.scores[index] = score
                better = score < self.best_score if calculator.minimize else score > self.best_score
                if math.isfinite(score) and (math.isnan(self.best_score) or better):
                    self.best_epoch, self.best_score = index, score
                    config.model_saver.save_best_model(network, score)
                if config.save_last_model:
                    config.model_saver.save_latest_model(network, score)
                log.info(
                    "early stopping: epoch %d score %.6g (best %.6g at epoch %d)",
                    index,
                    score,
                    self.best_score,
                    self.best_epoch,
                )
            # the epoch's metric for the fit's records, when it is a number they can hold
            metrics = (
                {"validation_score": score} if score is not None and scored and math.isfinite(score) else {}
            )
            for iteration_condition in config.iteration_termination_conditions:
                if iteration_condition.terminate(score):
                    self.reason, self.details = "IterationTerminationCondition", repr(iteration_condition)
                    return {**metrics, "stop": True}
            if scored and score is not None:
                for epoch_condition in config.epoch_termination_conditions:
                    if epoch_condition.terminate(index, score, calculator.minimize):
                        self.reason, self.details = "EpochTerminationCondition", repr(epoch_condition)
                        return {**metrics, "stop": True}
            return {**metrics, "stop": False}

        return callback


__all__ = [
    "BestScoreEpochTerminationCondition",
    "DataSetLossCalculator",
    "EarlyStoppingConfiguration",
    "EarlyStoppingResult",
    "EpochTerminationCondition",
    "EvaluationScoreCalculator",
    "FileModelSaver",
    "InMemoryModelSaver",
    "InvalidScoreIterationTerminationCondition",
    "IterationTerminationCondition",
    "MaxEpochsTerminationCondition",
    "MaxTimeIterationTerminationCondition",
    "ModelSaver",
    "ScoreCalculator",
    "ScoreImprovementEpochTerminationCondition",
    "SparkEarlyStoppingTrainer",
]
