"""Params shared by the sparkgrad estimators and models; configuration objects are stored as JSON text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from pyspark.ml.param import Param, Params, TypeConverters

from sparkgrad._config import Config, check_int

if TYPE_CHECKING:
    from sparkgrad.nn import ComputationGraphConfiguration, MultiLayerConfiguration
    from sparkgrad.spark import CheckpointConfig, ParameterAveragingTrainingMaster, SharedTrainingMaster

DEFAULT_EPOCHS = 1
DEFAULT_BATCH_SIZE = 32


def _conf_json(value: Any) -> str:
    """Param converter: a MultiLayerConfiguration or a ComputationGraphConfiguration with one input and
    one output, or its JSON, as compact canonical JSON.

    Raises:
        TypeError: anything else (pyspark names the param).
        ValueError: a graph with several inputs or outputs (names ``networkConf``).
    """
    from sparkgrad.nn import ComputationGraphConfiguration, MultiLayerConfiguration

    if isinstance(value, str):
        try:
            value = Config.from_json(value)
        except ValueError as exc:
            raise TypeError(f"not a network configuration JSON: {exc}") from None
    if not isinstance(value, (MultiLayerConfiguration, ComputationGraphConfiguration)):
        raise TypeError(
            "expected a MultiLayerConfiguration or ComputationGraphConfiguration or its JSON, got "
            f"{type(value).__name__}"
        )
    if isinstance(value, ComputationGraphConfiguration) and (len(value.inputs), len(value.outputs)) != (1, 1):
        raise ValueError(
            f"networkConf: the graph has inputs {value.inputs} and outputs {value.outputs}, but an "
            "estimator maps one features column to one input and one label column to one output; use a "
            "graph with exactly one of each, or train this one with SparkComputationGraph on an RDD of "
            "MultiDataSets"
        )
    return value.to_json(indent=None)


def _master_json(value: Any) -> str:
    """Param converter: a training master, or its JSON, as compact canonical JSON."""
    from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    if isinstance(value, str):
        try:
            value = Config.from_json(value)
        except ValueError as exc:
            raise TypeError(f"not a training master JSON: {exc}") from None
    if not isinstance(value, (ParameterAveragingTrainingMaster, SharedTrainingMaster)):
        raise TypeError(
            "expected a ParameterAveragingTrainingMaster or SharedTrainingMaster or its JSON, "
            f"got {type(value).__name__}"
        )
    try:
        return value.to_json(indent=None)
    except (TypeError, ValueError) as exc:  # e.g. training hooks that are not configuration objects
        raise TypeError(f"the training master does not serialise to JSON: {exc}") from None


class SparkgradParams(Params):
    """Params of the sparkgrad estimators and models besides the columns (which the pyspark.ml base
    classes, Predictor / Classifier and their models, bring).

    ``networkConf`` and ``trainingMaster`` accept the configuration objects and store their JSON, so
    that the params copy, compare and save like any other pyspark param.
    """

    _input_kwargs: dict[str, Any]  # the keyword arguments pyspark's @keyword_only records

    networkConf: Param[str] = Param(
        Params._dummy(),
        "networkConf",
        "the network: a MultiLayerConfiguration, or a ComputationGraphConfiguration with one input and one "
        "output (stored as its JSON)",
        typeConverter=_conf_json,
    )
    trainingMaster: Param[str] = Param(
        Params._dummy(),
        "trainingMaster",
        "how to train on Spark: a ParameterAveragingTrainingMaster or SharedTrainingMaster (stored as "
        "its JSON); its batch_size_per_worker and rdd_data_set_num_examples are set to batchSize",
        typeConverter=_master_json,
    )
    epochs: Param[int] = Param(
        Params._dummy(), "epochs", "passes over the training data (>= 1)", typeConverter=TypeConverters.toInt
    )
    batchSize: Param[int] = Param(
        Params._dummy(),
        "batchSize",
        "examples per minibatch of each worker (>= 1)",
        typeConverter=TypeConverters.toInt,
    )
    checkpointDir: Param[str] = Param(
        Params._dummy(),
        "checkpointDir",
        "where the fit writes checkpoints (a local directory or Hadoop URI); unset: none",
        typeConverter=TypeConverters.toString,
    )
    checkpointInterval: Param[int] = Param(
        Params._dummy(),
        "checkpointInterval",
        "epochs between checkpoints (>= 1), or -1 for none; the last epoch is always checkpointed",
        typeConverter=TypeConverters.toInt,
    )
    keepCheckpoints: Param[int] = Param(
        Params._dummy(),
        "keepCheckpoints",
        "complete checkpoints kept (>= 1); older ones are deleted",
        typeConverter=TypeConverters.toInt,
    )
    validationIndicatorCol: Param[str] = Param(
        Params._dummy(),
        "validationIndicatorCol",
        "a boolean column: its true rows are validation data, scored after every epoch and not trained "
        "on; the fit then stops early and returns the network of the best epoch (unset: no early stopping)",
        typeConverter=TypeConverters.toString,
    )
    earlyStoppingMetric: Param[str] = Param(
        Params._dummy(),
        "earlyStoppingMetric",
        "what early stopping scores on the validation rows: loss, or a metric of "
        "sparkgrad.spark.early_stopping.EvaluationScoreCalculator (accuracy, f1, mse, auc, ...)",
        typeConverter=TypeConverters.toString,
    )
    earlyStoppingPatience: Param[int] = Param(
        Params._dummy(),
        "earlyStoppingPatience",
        "epochs without an improvement of the validation score after which the fit stops (>= 1)",
        typeConverter=TypeConverters.toInt,
    )
    earlyStoppingMinImprovement: Param[float] = Param(
        Params._dummy(),
        "earlyStoppingMinImprovement",
        "the least change of the validation score that counts as an improvement (>= 0)",
        typeConverter=TypeConverters.toFloat,
    )
    resumeFromCheckpoint: Param[bool] = Param(
        Params._dummy(),
        "resumeFromCheckpoint",
        "continue from the newest complete checkpoint in checkpointDir (none there: start afresh)",
        typeConverter=TypeConverters.toBoolean,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        from sparkgrad.spark import SharedTrainingMaster

        # gradient sharing: every epoch in one Spark job, where parameter averaging starts a job for every
        # averaging round (about 300 an epoch on a 200,000-row frame, 20x slower there)
        self._setDefault(
            trainingMaster=SharedTrainingMaster().to_json(indent=None),
            epochs=DEFAULT_EPOCHS,
            batchSize=DEFAULT_BATCH_SIZE,
            checkpointInterval=1,
            keepCheckpoints=3,
            resumeFromCheckpoint=False,
            earlyStoppingMetric="loss",
            earlyStoppingPatience=5,
            earlyStoppingMinImprovement=0.0,
        )

    def getNetworkConf(self) -> str:
        """The network configuration's JSON."""
        return self.getOrDefault(self.networkConf)

    def getTrainingMaster(self) -> str:
        """The training master's JSON."""
        return self.getOrDefault(self.trainingMaster)

    def getEpochs(self) -> int:
        """Passes over the training data."""
        return self.getOrDefault(self.epochs)

    def getBatchSize(self) -> int:
        """Examples per minibatch of each worker."""
        return self.getOrDefault(self.batchSize)

    def getCheckpointDir(self) -> str | None:
        """Where checkpoints are written (None: none)."""
        return self.getOrDefault(self.checkpointDir) if self.isDefined(self.checkpointDir) else None

    def getCheckpointInterval(self) -> int:
        """Epochs between checkpoints (-1: none)."""
        return self.getOrDefault(self.checkpointInterval)

    def getKeepCheckpoints(self) -> int:
        """Complete checkpoints kept."""
        return self.getOrDefault(self.keepCheckpoints)

    def getResumeFromCheckpoint(self) -> bool:
        """Whether the fit continues from the newest complete checkpoint."""
        return self.getOrDefault(self.resumeFromCheckpoint)

    def getValidationIndicatorCol(self) -> str | None:
        """The boolean column marking validation rows (None: no early stopping)."""
        if not self.isDefined(self.validationIndicatorCol):
            return None
        return self.getOrDefault(self.validationIndicatorCol)

    def getEarlyStoppingMetric(self) -> str:
        """What early stopping scores: ``loss`` or an evaluation metric."""
        return self.getOrDefault(self.earlyStoppingMetric)

    def getEarlyStoppingPatience(self) -> int:
        """Epochs without improvement before the fit stops."""
        return self.getOrDefault(self.earlyStoppingPatience)

    def getEarlyStoppingMinImprovement(self) -> float:
        """The least change that counts as an improvement."""
        return self.getOrDefault(self.earlyStoppingMinImprovement)

    def checkpoint_configuration(self) -> CheckpointConfig | None:
        """The fit's checkpoints from ``checkpointDir``, ``checkpointInterval`` and ``keepCheckpoints``
        (None without a directory or with an interval of -1)."""
        from sparkgrad.spark import CheckpointConfig

        directory, interval = self.getCheckpointDir(), self.getCheckpointInterval()
        if interval != -1:
            interval = check_int("checkpointInterval", interval, minimum=1)
        if directory is None or interval == -1:
            if self.getResumeFromCheckpoint():
                raise ValueError("resumeFromCheckpoint: needs checkpointDir, and checkpointInterval not -1")
            return None
        return CheckpointConfig(directory, every_epochs=interval, keep_last=self.getKeepCheckpoints())

    def network_configuration(self) -> MultiLayerConfiguration | ComputationGraphConfiguration:
        """The configuration of ``networkConf``: a MultiLayerConfiguration, or a
        ComputationGraphConfiguration with one input and one output.

        Raises:
            ValueError: ``networkConf`` is not set.
        """
        if not self.isDefined(self.networkConf):
            raise ValueError(
                "networkConf: not set; pass networkConf=MultiLayerConfiguration(...) or a "
                "ComputationGraphConfiguration with one input and one output"
            )
        # the param's converter (_conf_json) admits only these two
        return cast(
            "MultiLayerConfiguration | ComputationGraphConfiguration", Config.from_json(self.getNetworkConf())
        )

    def training_master(self) -> ParameterAveragingTrainingMaster | SharedTrainingMaster:
        """A fresh training master from ``trainingMaster``, with ``batchSize`` examples per minibatch
        and per DataSet of the converted DataFrame."""
        import dataclasses

        batch = check_int("batchSize", self.getBatchSize(), minimum=1)
        # the param's converter (_master_json) admits only these two
        master = cast(
            "ParameterAveragingTrainingMaster | SharedTrainingMaster",
            Config.from_json(self.getTrainingMaster()),
        )
        return dataclasses.replace(master, batch_size_per_worker=batch, rdd_data_set_num_examples=batch)
