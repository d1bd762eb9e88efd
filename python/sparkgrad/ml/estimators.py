"""pyspark.ml estimators training sparkgrad networks on DataFrames, and the models they produce."""

from __future__ import annotations

import functools
import uuid
import zlib
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from pyspark import keyword_only
from pyspark.ml.classification import ProbabilisticClassificationModel, ProbabilisticClassifier
from pyspark.ml.linalg import DenseVector
from pyspark.ml.regression import RegressionModel, Regressor
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable, MLReadable, MLWritable

from sparkgrad._config import check_int
from sparkgrad.ml._params import DEFAULT_BATCH_SIZE, DEFAULT_EPOCHS, SparkgradParams
from sparkgrad.spark.columns import (
    CLASSIFICATION,
    REGRESSION,
    dataframe_dataset_frame,
    dataframe_datasets,
    linalg_rows,
    network_output,
    output_size,
    values_per_example,
    with_network_outputs,
)
from sparkgrad.spark.connect import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sparkgrad.nn import (
        ComputationGraph,
        ComputationGraphConfiguration,
        MultiLayerConfiguration,
        MultiLayerNetwork,
    )

    Network = MultiLayerNetwork | ComputationGraph


P = TypeVar("P", bound=SparkgradParams)


def _train(estimator: Any, dataset: DataFrame, task: str) -> Network:
    """Train a network from the estimator's params on ``dataset``: SparkComputationGraph for a graph
    configuration, SparkMultiLayer otherwise (one code path for both from here on)."""
    from sparkgrad.nn import ComputationGraphConfiguration
    from sparkgrad.spark import SparkComputationGraph, SparkMultiLayer
    from sparkgrad.spark.network import _FitRequest

    conf = estimator.network_configuration()
    if task == CLASSIFICATION:
        _check_classifier_output(conf)
    master = estimator.training_master()
    epochs = check_int("epochs", estimator.getEpochs(), minimum=1)
    validation = estimator.getValidationIndicatorCol()

    def datasets(frame: DataFrame) -> Any:
        # a Connect session has no RDDs: its fit reads the serialized DataSets from a DataFrame
        convert = dataframe_dataset_frame if is_connect(frame) else dataframe_datasets
        return convert(
            frame,
            estimator.getFeaturesCol(),
            estimator.getLabelCol(),
            conf,
            master.rdd_data_set_num_examples,
            task,
            ("featuresCol", "labelCol"),
        )

    spark_network = (
        SparkComputationGraph if isinstance(conf, ComputationGraphConfiguration) else SparkMultiLayer
    )
    checkpoint, resume = estimator.checkpoint_configuration(), estimator.getResumeFromCheckpoint()
    if validation is None:
        with spark_network(dataset.sparkSession, conf, master) as model:
            if is_connect(dataset):
                request = _FitRequest.of(epochs, None, checkpoint, resume)
                return model._fit_serialized(datasets(dataset), request)
            return model.fit(datasets(dataset), epochs=epochs, checkpoint=checkpoint, resume=resume)
    if checkpoint is not None:
        raise ValueError(
            "checkpointDir: an early-stopping fit (validationIndicatorCol) is not checkpointed; unset one"
        )
    return _train_early_stopping(
        estimator, dataset, validation, datasets, spark_network(dataset.sparkSession, conf, master), epochs
    )


def _train_early_stopping(
    estimator: Any, dataset: DataFrame, column: str, datasets: Any, model: Any, epochs: int
) -> Network:
    """Train on the rows where ``column`` is false, score the others after every epoch and return the
    network of the best epoch (Spark ML's ``validationIndicatorCol``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    from sparkgrad.spark.early_stopping import (
        DataSetLossCalculator,
        EarlyStoppingConfiguration,
        EvaluationScoreCalculator,
        MaxEpochsTerminationCondition,
        ScoreImprovementEpochTerminationCondition,
        SparkEarlyStoppingTrainer,
    )

    if column not in dataset.columns or not isinstance(dataset.schema[column].dataType, BooleanType):
        raise ValueError(f"validationIndicatorCol: {column!r} is not a boolean column of the dataset")
    flag = F.col(column)
    train, held_out = dataset.filter(~flag), dataset.filter(flag)
    metric = estimator.getEarlyStoppingMetric()
    scored = datasets(held_out)
    calculator = (
        DataSetLossCalculator(scored) if metric == "loss" else EvaluationScoreCalculator(metric, scored)
    )
    patience = check_int("earlyStoppingPatience", estimator.getEarlyStoppingPatience(), minimum=1)
    config = EarlyStoppingConfiguration(
        calculator,
        [
            MaxEpochsTerminationCondition(epochs),
            ScoreImprovementEpochTerminationCondition(patience, estimator.getEarlyStoppingMinImprovement()),
        ],
    )
    with model:
        result = SparkEarlyStoppingTrainer(model, config, datasets(train)).fit()
    if result.best_model is None:
        raise ValueError(f"validationIndicatorCol: {column!r} marks no row, or no epoch could be scored")
    return result.best_model


def _check_classifier_output(conf: MultiLayerConfiguration | ComputationGraphConfiguration) -> None:
    """A classifier's network outputs class probabilities: softmax over classes, or one sigmoid."""
    from sparkgrad.nn import ComputationGraphConfiguration
    from sparkgrad.nn.enums import Activation

    n_out = output_size(conf)
    if isinstance(conf, ComputationGraphConfiguration):
        activation = conf.setting(conf.outputs[0], "activation")
    else:
        activation = conf.setting(len(conf.layers) - 1, "activation")
    expected = Activation.SOFTMAX if n_out > 1 else Activation.SIGMOID
    if activation != expected:
        raise ValueError(
            f"networkConf: a classifier's output layer must be {expected.value} with {n_out} output(s) "
            f"(class probabilities), got {activation.value}; use SparkgradRegressor for other outputs"
        )


class _EstimatorParams(SparkgradParams):
    """Setters of the estimators' own params."""

    @keyword_only
    def setParams(self: P, **kwargs: Any) -> P:
        """Set params by keyword (the names of the constructor)."""
        return self._set(**self._input_kwargs)

    def setNetworkConf(self: P, value: Any) -> P:
        """Sets ``networkConf`` (a MultiLayerConfiguration, or a ComputationGraphConfiguration with one
        input and one output, or its JSON)."""
        return self._set(networkConf=value)

    def setTrainingMaster(self: P, value: Any) -> P:
        """Sets ``trainingMaster`` (a training master or its JSON)."""
        return self._set(trainingMaster=value)

    def setEpochs(self: P, value: int) -> P:
        """Sets ``epochs``, the passes over the training data."""
        return self._set(epochs=value)

    def setBatchSize(self: P, value: int) -> P:
        """Sets ``batchSize``, the examples per minibatch of each worker."""
        return self._set(batchSize=value)

    def setCheckpointDir(self: P, value: str) -> P:
        """Sets ``checkpointDir``, where the fit writes checkpoints."""
        return self._set(checkpointDir=value)

    def setCheckpointInterval(self: P, value: int) -> P:
        """Sets ``checkpointInterval``, the epochs between checkpoints (-1: none)."""
        return self._set(checkpointInterval=value)

    def setKeepCheckpoints(self: P, value: int) -> P:
        """Sets ``keepCheckpoints``, the complete checkpoints kept."""
        return self._set(keepCheckpoints=value)

    def setValidationIndicatorCol(self: P, value: str) -> P:
        """Sets ``validationIndicatorCol``: its true rows are validation data (early stopping)."""
        return self._set(validationIndicatorCol=value)

    def setEarlyStoppingMetric(self: P, value: str) -> P:
        """Sets ``earlyStoppingMetric``: ``loss`` or an evaluation metric."""
        return self._set(earlyStoppingMetric=value)

    def setEarlyStoppingPatience(self: P, value: int) -> P:
        """Sets ``earlyStoppingPatience``, epochs without improvement before stopping."""
        return self._set(earlyStoppingPatience=value)

    def setEarlyStoppingMinImprovement(self: P, value: float) -> P:
        """Sets ``earlyStoppingMinImprovement``."""
        return self._set(earlyStoppingMinImprovement=value)

    def setResumeFromCheckpoint(self: P, value: bool) -> P:
        """Sets ``resumeFromCheckpoint``: continue from the newest complete checkpoint."""
        return self._set(resumeFromCheckpoint=value)


class _ModelBase(SparkgradParams, MLWritable, MLReadable):
    """The trained network, its broadcast for ``transform`` and persistence (MLWritable/MLReadable)."""

    _network: Network | None = None
    # (SparkContext, checksum of the parameters, broadcast of the network)
    _broadcast: tuple[Any, int, Any] | None = None

    def _attach(self, network: Network | None) -> None:
        """Hold ``network`` (its configuration becomes ``networkConf``)."""
        self._network = network
        self._broadcast = None
        if network is not None:
            self._set(networkConf=network.conf)

    @property
    def network(self) -> Network:
        """The trained network on the driver: a MultiLayerNetwork, or a ComputationGraph (one input,
        one output) when ``networkConf`` is a ComputationGraphConfiguration."""
        if self._network is None:
            raise ValueError(f"{type(self).__name__}: no network; build the model with fit() or load()")
        return self._network

    @property
    def numFeatures(self) -> int:
        """Number of feature values per example the network (a graph: its only input) takes; for
        sequence input, per time step."""
        return values_per_example(self.network.conf)

    def _network_getter(self, dataset: DataFrame) -> Any:
        """A picklable function returning the network on an executor.

        The network is broadcast once and again only when its parameters change (a network trained
        further in place), which the CRC-32 of the parameters detects. With a local master the Python
        workers run the driver's interpreter, as for a fit (a model loaded in a fresh session included).
        """
        from sparkgrad.spark.common import NetworkSnapshot, use_driver_interpreter
        from sparkgrad.spark.connect import Held
        from sparkgrad.spark.network import _InferenceJob

        # a Connect session has no broadcasts: the network travels in the plan, cached by the job's key
        connect = is_connect(dataset)
        sc: Any = dataset.sparkSession if connect else dataset.sparkSession.sparkContext
        if not connect:
            use_driver_interpreter(sc)
        checksum = zlib.crc32(np.ascontiguousarray(self.network.params()).view(np.uint8).data)
        if self._broadcast is None or self._broadcast[0] is not sc or self._broadcast[1] != checksum:
            job = _InferenceJob(uuid.uuid4().hex, NetworkSnapshot.of(self.network, False))
            self._broadcast = (sc, checksum, Held(job) if connect else sc.broadcast(job))
        from sparkgrad.spark.network import _first_network

        return functools.partial(_first_network, self._broadcast[2])

    def _one_output(self, value: Any) -> np.ndarray:
        """The network output (float64) for one ml Vector."""
        x, single, _ = linalg_rows(value, self.network.conf, "value")
        if not single:
            raise TypeError("value: expected one Vector (a single example)")
        return network_output(self.network, x)[0].astype(np.float64)

    def write(self) -> Any:
        """An MLWriter saving the params and the network (``model.write().save(path)``)."""
        from sparkgrad.ml.persistence import ModelWriter

        return ModelWriter(self)

    @classmethod
    def read(cls) -> Any:
        """An MLReader loading a model saved by :meth:`write` (``Model.load(path)``)."""
        from sparkgrad.ml.persistence import ModelReader

        return ModelReader(cls)


# -- classification -------------------------------------------------------------------------------------
class SparkgradClassifier(
    ProbabilisticClassifier, _EstimatorParams, DefaultParamsWritable, DefaultParamsReadable
):
    """A pyspark.ml classifier training a sparkgrad network on Spark (``fit(df)``).

    The network's output layer gives the class probabilities: softmax with one output per class, or
    one sigmoid output for two classes. Training goes through :class:`sparkgrad.spark.SparkMultiLayer`
    (:class:`~sparkgrad.spark.SparkComputationGraph` for a graph) with the training master of
    ``trainingMaster``: the DataFrame is converted per partition, in
    Arrow batches, into DataSets of ``batchSize`` examples, and nothing is collected to the driver.
    Works in a ``Pipeline`` and with ``CrossValidator`` / ``TrainValidationSplit``.

    Args:
        networkConf: the network, a MultiLayerConfiguration or a ComputationGraphConfiguration with one
            input and one output (or its JSON); required.
        trainingMaster: a SharedTrainingMaster (default: ``SharedTrainingMaster()``, its controller on a
            free port of the driver's address) or ParameterAveragingTrainingMaster (or its
            JSON); its ``batch_size_per_worker`` and ``rdd_data_set_num_examples`` become
            ``batchSize``.
        featuresCol: a Vector or array-of-numbers column, the network's input size per row (images
            as ``channels * height * width`` values in that order, reshaped by the input type).
        labelCol: class indices ``0 .. numClasses - 1`` (a binary 0/1 label for one sigmoid output),
            or a Vector / array column of one value per output (one-hot or soft labels).
        predictionCol: output, the predicted class index (double).
        probabilityCol: output, the class probabilities (Vector).
        rawPredictionCol: output, the network's output per class (Vector; equal to the probability).
        thresholds: optional per-class thresholds: the class with the largest ``p / t`` is predicted.
        epochs: passes over the training data.
        batchSize: examples per minibatch of each worker.
        checkpointDir: where the fit writes checkpoints (a local directory or any Hadoop URI); unset,
            none are written (see :mod:`sparkgrad.spark.checkpoint`).
        checkpointInterval: epochs between checkpoints (-1: none); the last epoch is always written.
        keepCheckpoints: complete checkpoints kept.
        resumeFromCheckpoint: continue from the newest complete checkpoint in ``checkpointDir``: a
            fit rerun after its driver failed trains only the epochs it had not done.
        validationIndicatorCol: a boolean column whose true rows are validation data: not trained on,
            scored after every epoch (on the executors); the fit stops when the score has not
            improved for ``earlyStoppingPatience`` epochs and the model holds the best epoch's network.
        earlyStoppingMetric: ``loss``, or a metric of
            :class:`~sparkgrad.spark.early_stopping.EvaluationScoreCalculator` (``accuracy``, ``f1``,
            ``mse``, ``auc``...).
        earlyStoppingPatience: epochs without improvement before stopping.
        earlyStoppingMinImprovement: the least change of the score that counts as an improvement.
    """

    @keyword_only
    def __init__(
        self,
        *,
        networkConf: Any = None,
        trainingMaster: Any = None,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        thresholds: list[float] | None = None,
        epochs: int = DEFAULT_EPOCHS,
        batchSize: int = DEFAULT_BATCH_SIZE,
        checkpointDir: str | None = None,
        checkpointInterval: int = 1,
        keepCheckpoints: int = 3,
        resumeFromCheckpoint: bool = False,
        validationIndicatorCol: str | None = None,
        earlyStoppingMetric: str = "loss",
        earlyStoppingPatience: int = 5,
        earlyStoppingMinImprovement: float = 0.0,
    ) -> None:
        super().__init__()
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> SparkgradClassificationModel:
        model = SparkgradClassificationModel(_train(self, dataset, CLASSIFICATION))
        self._copyValues(model)
        return model


class SparkgradClassificationModel(_ModelBase, ProbabilisticClassificationModel):
    """A trained sparkgrad classifier: ``transform(df)`` adds the prediction columns.

    ``transform`` runs the network on the executors over Arrow batches of the features column
    (a scalar ``arrow_udf``: only the features go to Python, the other columns stay in the JVM; the
    network is broadcast once per model). Saved with ``write().save(path)``
    and read back with ``SparkgradClassificationModel.load(path)`` on any Hadoop path.
    """

    def __init__(self, network: Network | None = None) -> None:
        super().__init__()
        self._attach(network)

    @property
    def numClasses(self) -> int:
        """Number of classes (2 for a single sigmoid output)."""
        return max(output_size(self.network.conf), 2)

    def _thresholds(self) -> np.ndarray | None:
        if not self.isDefined(self.thresholds) or self.getThresholds() is None:
            return None
        t = np.asarray(self.getThresholds(), dtype=np.float64)
        if t.shape != (self.numClasses,) or not np.all(np.isfinite(t)) or (t < 0).any() or (t == 0).sum() > 1:
            raise ValueError(
                f"thresholds: expected {self.numClasses} finite values >= 0 with at most one 0, got "
                f"{self.getThresholds()}"
            )
        return t

    def predictRaw(self, value: Any) -> DenseVector:
        """The network's output per class for one feature Vector."""
        return DenseVector(_class_probabilities(self._one_output(value)[None])[0])

    def predictProbability(self, value: Any) -> DenseVector:
        """The class probabilities for one feature Vector."""
        return self.predictRaw(value)

    def predict(self, value: Any) -> float:
        """The predicted class index for one feature Vector."""
        p = _class_probabilities(self._one_output(value)[None])
        return float(_predicted_class(p, self._thresholds())[0])

    def _transform(self, dataset: DataFrame) -> DataFrame:
        names = {
            "raw": self.getRawPredictionCol(),
            "probability": self.getProbabilityCol(),
            "prediction": self.getPredictionCol(),
        }
        names = {k: v for k, v in names.items() if v}  # an empty name turns that column off
        columns = [(name, key != "prediction") for key, name in names.items()]
        outputs = functools.partial(_classification_columns, names=names, thresholds=self._thresholds())
        return with_network_outputs(
            dataset,
            self.getFeaturesCol(),
            self.network.conf,
            self._network_getter(dataset),
            outputs,
            columns,
            self.training_master().task_threads,
        )


def _class_probabilities(out: np.ndarray) -> np.ndarray:
    """Network outputs as per-class probabilities: one sigmoid output p becomes (1 - p, p)."""
    p = out.astype(np.float64)
    return np.hstack([1.0 - p, p]) if p.shape[1] == 1 else p


def _predicted_class(p: np.ndarray, thresholds: np.ndarray | None) -> np.ndarray:
    """argmax of p (or of p / thresholds, a 0 threshold meaning infinity, as Spark ML does)."""
    if thresholds is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(thresholds == 0, np.inf, p / np.where(thresholds == 0, 1.0, thresholds))
    return p.argmax(axis=1).astype(np.float64)


def _classification_columns(
    out: np.ndarray, names: dict[str, str], thresholds: np.ndarray | None
) -> dict[str, np.ndarray]:
    p = _class_probabilities(out)
    values = {"raw": p, "probability": p, "prediction": _predicted_class(p, thresholds)}
    return {name: values[key] for key, name in names.items()}


# -- regression -----------------------------------------------------------------------------------------
class SparkgradRegressor(Regressor, _EstimatorParams, DefaultParamsWritable, DefaultParamsReadable):
    """A pyspark.ml regressor training a sparkgrad network on Spark (``fit(df)``).

    Training is that of :class:`SparkgradClassifier`. With one network output the label is a number
    per row and the prediction a double (what ``RegressionEvaluator`` reads); with several outputs the
    label is a Vector / array column of one value per output and the prediction a Vector.

    Args:
        networkConf: the network, a MultiLayerConfiguration or a ComputationGraphConfiguration with one
            input and one output (or its JSON); required.
        trainingMaster: as for :class:`SparkgradClassifier`.
        featuresCol: as for :class:`SparkgradClassifier`.
        labelCol: the target: a number per row (one output) or a Vector / array of one value per
            output.
        predictionCol: output, the network's output (double for one output, else Vector).
        epochs: passes over the training data.
        batchSize: examples per minibatch of each worker.
        checkpointDir: where the fit writes checkpoints (a local directory or any Hadoop URI); unset,
            none are written (see :mod:`sparkgrad.spark.checkpoint`).
        checkpointInterval: epochs between checkpoints (-1: none); the last epoch is always written.
        keepCheckpoints: complete checkpoints kept.
        resumeFromCheckpoint: continue from the newest complete checkpoint in ``checkpointDir``: a
            fit rerun after its driver failed trains only the epochs it had not done.
        validationIndicatorCol: a boolean column whose true rows are validation data: not trained on,
            scored after every epoch (on the executors); the fit stops when the score has not
            improved for ``earlyStoppingPatience`` epochs and the model holds the best epoch's network.
        earlyStoppingMetric: ``loss``, or a metric of
            :class:`~sparkgrad.spark.early_stopping.EvaluationScoreCalculator` (``accuracy``, ``f1``,
            ``mse``, ``auc``...).
        earlyStoppingPatience: epochs without improvement before stopping.
        earlyStoppingMinImprovement: the least change of the score that counts as an improvement.
    """

    @keyword_only
    def __init__(
        self,
        *,
        networkConf: Any = None,
        trainingMaster: Any = None,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        epochs: int = DEFAULT_EPOCHS,
        batchSize: int = DEFAULT_BATCH_SIZE,
        checkpointDir: str | None = None,
        checkpointInterval: int = 1,
        keepCheckpoints: int = 3,
        resumeFromCheckpoint: bool = False,
        validationIndicatorCol: str | None = None,
        earlyStoppingMetric: str = "loss",
        earlyStoppingPatience: int = 5,
        earlyStoppingMinImprovement: float = 0.0,
    ) -> None:
        super().__init__()
        self._set(**self._input_kwargs)

    def _fit(self, dataset: DataFrame) -> SparkgradRegressionModel:
        model = SparkgradRegressionModel(_train(self, dataset, REGRESSION))
        self._copyValues(model)
        return model


class SparkgradRegressionModel(_ModelBase, RegressionModel):
    """A trained sparkgrad regressor: ``transform(df)`` adds the prediction column.

    Inference, saving and loading work as for :class:`SparkgradClassificationModel`.
    """

    def __init__(self, network: Network | None = None) -> None:
        super().__init__()
        self._attach(network)

    def predict(self, value: Any) -> Any:
        """The network's output for one feature Vector: a float for one output, else a DenseVector."""
        out = self._one_output(value)
        return float(out[0]) if out.size == 1 else DenseVector(out)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        name = self.getPredictionCol()
        if not name:
            return dataset
        vector = output_size(self.network.conf) > 1
        outputs = functools.partial(_regression_column, name=name, vector=vector)
        return with_network_outputs(
            dataset,
            self.getFeaturesCol(),
            self.network.conf,
            self._network_getter(dataset),
            outputs,
            [(name, vector)],
            self.training_master().task_threads,
        )


def _regression_column(out: np.ndarray, name: str, vector: bool) -> dict[str, np.ndarray]:
    return {name: out if vector else out[:, 0]}


__all__ = [
    "SparkgradClassificationModel",
    "SparkgradClassifier",
    "SparkgradRegressionModel",
    "SparkgradRegressor",
]
