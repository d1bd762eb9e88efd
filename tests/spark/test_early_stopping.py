"""Early stopping on Spark (issue 38): DL4J's termination conditions, score calculators, model savers and
SparkEarlyStoppingTrainer, for both masters and both ways of scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import mlp_conf, residual_graph

from sparkgrad.nn import MultiLayerNetwork
from sparkgrad.spark import (
    BestScoreEpochTerminationCondition,
    DataSetLossCalculator,
    EarlyStoppingConfiguration,
    EvaluationScoreCalculator,
    FileModelSaver,
    InvalidScoreIterationTerminationCondition,
    MaxEpochsTerminationCondition,
    MaxTimeIterationTerminationCondition,
    ParameterAveragingTrainingMaster,
    ScoreImprovementEpochTerminationCondition,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkEarlyStoppingTrainer,
    SparkMultiLayer,
)
from sparkgrad.spark import early_stopping as es


@pytest.fixture(scope="module")
def split_digits(spark, digits):
    train, test = digits
    rdd = spark.sparkContext.parallelize(train.split(32), 2).cache()
    yield rdd, test, spark.sparkContext.parallelize(test.split(64), 2).cache()
    rdd.unpersist()


def test_validation_on_the_driver_runs_inside_the_one_job_fit(spark, split_digits) -> None:
    """A DataSet scored in the fit's epoch callback: one Spark job for the whole early-stopping fit; the
    best model is the saved network of the best epoch, scored again to the same value."""
    rdd, test, _ = split_digits
    master = SharedTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    config = EarlyStoppingConfiguration(
        DataSetLossCalculator(test),
        [MaxEpochsTerminationCondition(6), ScoreImprovementEpochTerminationCondition(2)],
    )
    with SparkMultiLayer(spark, mlp_conf(hidden=64), master) as model:
        result = SparkEarlyStoppingTrainer(model, config, rdd).fit()
        assert master.last_traffic["spark_jobs"] == 1
        assert model.network.epoch_count == result.total_epochs
    assert sorted(result.score_vs_epoch) == list(range(result.total_epochs))
    best = min(result.score_vs_epoch, key=result.score_vs_epoch.get)
    assert (result.best_model_epoch, result.best_model_score) == (best, result.score_vs_epoch[best])
    assert result.best_model.epoch_count == best + 1
    assert result.best_model.score(test) == pytest.approx(result.best_model_score, rel=1e-6)
    assert result.termination_reason == "EpochTerminationCondition"


def test_validation_on_the_executors_fits_an_epoch_at_a_time(spark, split_digits) -> None:
    """An RDD scored by a Spark job: one fit per epoch; accuracy is maximised."""
    rdd, test, test_rdd = split_digits
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    config = EarlyStoppingConfiguration(
        EvaluationScoreCalculator("accuracy", test_rdd),
        [MaxEpochsTerminationCondition(3)],
        save_last_model=True,
    )
    with SparkComputationGraph(spark, residual_graph(64, 10), master) as model:
        result = SparkEarlyStoppingTrainer(model, config, rdd).fit()
        assert model.network.epoch_count == 3
    assert result.total_epochs == 3 and sorted(result.score_vs_epoch) == [0, 1, 2]
    assert result.termination_details == "MaxEpochsTerminationCondition(max_epochs=3)"
    best = max(result.score_vs_epoch, key=result.score_vs_epoch.get)
    assert result.best_model_epoch == best
    assert result.best_model.evaluate(test).accuracy() == result.best_model_score
    assert config.model_saver.get_latest_model().epoch_count == 3


def test_patience_and_minimum_improvement() -> None:
    condition = ScoreImprovementEpochTerminationCondition(2, min_improvement=0.1)
    condition.initialize()
    decisions = [condition.terminate(e, s, minimize=True) for e, s in enumerate([1.0, 0.95, 0.85, 0.8, 0.79])]
    # 0.95 is not 0.1 better than 1.0 (wait 1); 0.85 is (reset); 0.8 and 0.79 are not (wait 1, 2: stop)
    assert decisions == [False, False, False, False, True]
    condition.initialize()
    assert [condition.terminate(e, s, minimize=False) for e, s in enumerate([0.5, 0.7, 0.65, 0.7])] == [
        False,
        False,
        False,
        True,
    ]
    assert BestScoreEpochTerminationCondition(0.2).terminate(0, 0.2, minimize=True)
    assert not BestScoreEpochTerminationCondition(0.9).terminate(0, 0.8, minimize=False)
    with pytest.raises(ValueError, match="max_epochs_without_improvement"):
        ScoreImprovementEpochTerminationCondition(0)
    with pytest.raises(ValueError, match="epoch_termination_conditions"):
        EarlyStoppingConfiguration(
            DataSetLossCalculator(np_dataset()), [BestScoreEpochTerminationCondition(0.1)]
        )


def np_dataset():
    from sparkgrad.data import DataSet

    return DataSet(np.zeros((2, 64), np.float32), np.eye(10, dtype=np.float32)[:2])


def test_iteration_conditions(monkeypatch) -> None:
    clock = [50.0]
    monkeypatch.setattr(es.time, "monotonic", lambda: clock[0])
    limit = MaxTimeIterationTerminationCondition(30)
    limit.initialize()
    clock[0] += 29.9
    assert not limit.terminate(None)
    clock[0] += 0.1
    assert limit.terminate(None)
    invalid = InvalidScoreIterationTerminationCondition()
    assert [invalid.terminate(s) for s in (None, 0.3, math.nan, math.inf)] == [False, False, True, True]


class _Diverging(es.ScoreCalculator):
    """A score that turns NaN at the second epoch (a diverged fit)."""

    minimize = True

    def __init__(self, data) -> None:
        super().__init__(data)
        self.calls = 0

    def calculate_score(self, model) -> float:
        self.calls += 1
        return 1.0 if self.calls == 1 else math.nan


def test_an_invalid_score_stops_the_fit_and_the_best_model_stays(spark, split_digits, tmp_path) -> None:
    rdd, test, _ = split_digits
    saver = FileModelSaver(tmp_path.as_uri())  # through Spark's Hadoop FileSystem
    config = EarlyStoppingConfiguration(
        _Diverging(test),
        [MaxEpochsTerminationCondition(5)],
        [InvalidScoreIterationTerminationCondition()],
        model_saver=saver,
    )
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=32, rng_seed=1, progress=False)
    with SparkMultiLayer(spark, mlp_conf(hidden=32), master) as model:
        result = SparkEarlyStoppingTrainer(model, config, rdd).fit()
        assert model.network.epoch_count == 2
    assert result.termination_reason == "IterationTerminationCondition"
    assert result.termination_details == "InvalidScoreIterationTerminationCondition()"
    assert result.best_model_epoch == 0 and result.best_model_score == 1.0
    assert math.isnan(result.score_vs_epoch[1])
    assert isinstance(result.best_model, MultiLayerNetwork) and result.best_model.epoch_count == 1
    assert (tmp_path / "bestModel.zip").exists()


def test_the_estimator_stops_early_on_its_validation_rows(spark) -> None:
    from pyspark.sql import functions as F

    from sparkgrad.datasets import load_digits
    from sparkgrad.ml import SparkgradClassifier

    train, _ = load_digits(shape="flat")
    rows = [(train.features[i].tolist(), int(train.labels[i].argmax())) for i in range(600)]
    frame = spark.createDataFrame(rows, ["features", "label"]).withColumn("held_out", F.rand(7) < 0.25)
    master = ParameterAveragingTrainingMaster(rng_seed=1, progress=False)
    classifier = SparkgradClassifier(
        networkConf=mlp_conf(hidden=32),
        trainingMaster=master,
        batchSize=32,
        epochs=30,
        validationIndicatorCol="held_out",
        earlyStoppingPatience=1,
        earlyStoppingMinImprovement=1e9,  # no change counts: the second epoch ends the fit
    )
    model = classifier.fit(frame)
    # no change counts as an improvement: the second epoch ends the fit, whose best network (the lower
    # validation loss) is one of the two (without early stopping, 30 epochs)
    assert model.network.epoch_count in (1, 2)
    with pytest.raises(ValueError, match="validationIndicatorCol: 'label' is not a boolean column"):
        classifier.copy().setValidationIndicatorCol("label").fit(frame)
    with pytest.raises(ValueError, match="metric: expected one of"):
        classifier.copy().setEarlyStoppingMetric("speed").fit(frame)
