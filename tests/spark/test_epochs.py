"""fit(data, epochs=N, epoch_callback=...): epochs trained, the callback's arguments, early stop, the
metrics it returns, errors.

The tests of training behaviour run for both training masters.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import mlp_conf, port, subset

from sparkgrad.spark import (
    DefaultRepartitioner,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
)
from sparkgrad.spark.stats import epoch_callback_result

EXAMPLES, BATCH = 192, 16
MASTERS = ["pa", "shared"]
# per master: (stats key of worker minibatches with an "examples" extra, stats key of the whole fit)
STATS_KEYS = {
    "pa": ("ParameterAveragingWorkerFitTimesMs", "ParameterAveragingMasterFitTimesMs"),
    "shared": ("SharedWorkerComputeUpdateTimesMs", "SharedMasterFitTimesMs"),
}


def _master(name: str, **kw):
    if name == "pa":
        # one averaging round per epoch: 2 workers x 16 x 10 >= EXAMPLES
        return ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH,
            averaging_frequency=10,
            rdd_data_set_num_examples=BATCH,
            rng_seed=2,
            **kw,
        )
    return SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=BATCH,
        rdd_data_set_num_examples=BATCH,
        repartitioner=DefaultRepartitioner(max_partitions=2),
        transport=ZmqTransportConfiguration(
            connect_timeout_ms=3000, sync_timeout_ms=30000, poll_interval_ms=10
        ),
        rng_seed=2,
        **kw,
    )


@pytest.fixture(scope="module")
def data(digits):
    return subset(digits[0], EXAMPLES)


@pytest.fixture(scope="module")
def rdd(spark, data):
    out = spark.sparkContext.parallelize(data.split(BATCH), 2)
    yield out
    out.unpersist()


class Recorder:
    """An epoch callback that copies what it is given; returns True from the epoch ``stop_at`` on."""

    def __init__(self, model: SparkMultiLayer, stop_at: int | None = None) -> None:
        self.model, self.stop_at = model, stop_at
        self.epochs: list[int] = []
        self.counts: list[int] = []
        self.params: list[np.ndarray] = []
        self.updater: list[np.ndarray] = []
        self.iterations: list[int] = []

    def __call__(self, epoch: int, network) -> bool:
        assert network is self.model.network  # the driver's network, not a copy
        self.epochs.append(epoch)
        self.counts.append(int(network.epoch_count))
        self.params.append(network.params().copy())
        self.updater.append(network.updater_state().copy())
        self.iterations.append(int(network.iteration_count))
        return self.stop_at is not None and epoch >= self.stop_at


@pytest.mark.parametrize("master", MASTERS)
def test_fit_trains_every_epoch_and_calls_back_with_the_trained_network(spark, data, rdd, master) -> None:
    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master(master)) as sm:
        before = sm.network.score(data)
        calls = Recorder(sm)
        assert sm.fit(rdd, epochs=3, epoch_callback=calls) is sm.network
        assert sm.network.epoch_count == 3
        assert calls.epochs == [0, 1, 2] and calls.counts == [1, 2, 3]
        # every epoch trained: new parameters and more iterations each time
        for a, b in zip(calls.params, calls.params[1:]):
            assert not np.array_equal(a, b)
        assert calls.iterations == sorted(set(calls.iterations)) and calls.iterations[0] > 0
        # the callback saw the averaged / authoritative state: nothing changes after the last call
        np.testing.assert_array_equal(calls.params[-1], sm.network.params())
        if master == "pa":
            np.testing.assert_array_equal(calls.updater[-1], sm.network.updater_state())
        else:  # the workers hold their updater states until the fit returns and averages them
            assert not np.array_equal(calls.updater[-1], sm.network.updater_state())
        assert np.isfinite(sm.score()) and sm.network.score(data) < before

        more = Recorder(sm)
        sm.fit(rdd, epochs=2, epoch_callback=more)  # the epoch index continues the network's count
        assert more.epochs == [3, 4] and sm.network.epoch_count == 5
        np.testing.assert_array_equal(more.params[-1], sm.network.params())
        sm.fit(rdd)  # no arguments: one epoch
        assert sm.network.epoch_count == 6


@pytest.mark.parametrize("master", MASTERS)
def test_callback_returning_true_stops_after_that_epoch(spark, rdd, master) -> None:
    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master(master, collect_training_stats=True)) as sm:
        calls = Recorder(sm, stop_at=1)
        sm.fit(rdd, epochs=5, epoch_callback=calls)
        assert calls.epochs == [0, 1] and sm.network.epoch_count == 2
        np.testing.assert_array_equal(calls.params[-1], sm.network.params())
        # one stats object for the whole fit: one fit event, every example of both epochs
        worker_key, fit_key = STATS_KEYS[master]
        stats = sm.training_stats
        assert sum(e.extra["examples"] for e in stats.events(worker_key)) == 2 * EXAMPLES
        assert len(stats.events(fit_key)) == 1


@pytest.mark.parametrize("master", MASTERS)
def test_callback_metrics_are_recorded_per_epoch_across_fits(spark, data, rdd, master) -> None:
    returned: dict[int, dict[str, float]] = {}

    def callback(epoch: int, network) -> dict:
        accuracy = float(network.evaluate(data).accuracy())
        returned[epoch] = {"accuracy": accuracy, "weight_norm": float(np.linalg.norm(network.params()))}
        return {**returned[epoch], "stop": epoch >= 2}

    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master(master, collect_training_stats=True)) as sm:
        sm.fit(rdd, epochs=2, epoch_callback=callback)
        assert sm.training_stats.epoch_metrics() == returned and list(returned) == [0, 1]
        sm.fit(rdd, epochs=5, epoch_callback=callback)  # "stop" is True after epoch 2
        assert sm.network.epoch_count == 3 and list(returned) == [0, 1, 2]
        # exactly what the callback returned, epoch by epoch, accumulated over both fits
        assert sm.training_stats.epoch_metrics() == returned
        assert returned[2]["accuracy"] == sm.network.evaluate(data).accuracy()
        assert returned[0]["weight_norm"] != returned[2]["weight_norm"]
        sm.reset_training_stats()
        sm.fit(rdd, epoch_callback=lambda epoch, network: {"accuracy": 0.25})  # no "stop": go on
        assert sm.network.epoch_count == 4
        assert sm.training_stats.epoch_metrics() == {3: {"accuracy": 0.25}}


@pytest.mark.parametrize("master", MASTERS)
def test_bad_callback_metrics_reach_the_caller_naming_the_returned_value(spark, rdd, master) -> None:
    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master(master)) as sm:
        message = (
            r"^epoch_callback returned \{'accuracy': 'high'\}: metric 'accuracy' must be a number, got str$"
        )
        with pytest.raises(TypeError, match=message):
            sm.fit(rdd, epochs=3, epoch_callback=lambda epoch, network: {"accuracy": "high"})
        assert sm.network.epoch_count == 1


@pytest.mark.parametrize(
    "value, error, message",
    [
        ({"stop": "yes"}, TypeError, r"'stop' must be a bool, got str$"),
        ({"stop": 1}, TypeError, r"'stop' must be a bool, got int$"),
        ({"accuracy": True}, TypeError, r"metric 'accuracy' must be a number, got bool$"),
        ({"accuracy": None}, TypeError, r"metric 'accuracy' must be a number, got NoneType$"),
        ({"accuracy": float("nan")}, ValueError, r"metric 'accuracy' must be finite, got nan$"),
        ({"loss": float("inf")}, ValueError, r"metric 'loss' must be finite, got inf$"),
        ({1: 0.5}, TypeError, r"metric names must be non-empty strings, got 1$"),
        ({"": 0.5}, TypeError, r"metric names must be non-empty strings, got ''$"),
    ],
)
def test_bad_callback_results_raise_clearly(value, error, message) -> None:
    with pytest.raises(error, match=r"^epoch_callback returned " + re.escape(repr(value)) + ": " + message):
        epoch_callback_result(value)


def test_callback_results_mean_stop_and_metrics() -> None:
    assert epoch_callback_result(True) == (True, {})
    assert epoch_callback_result(None) == (False, {})
    assert epoch_callback_result(0) == (False, {})
    assert epoch_callback_result({}) == (False, {})
    assert epoch_callback_result({"stop": True}) == (True, {})
    result = epoch_callback_result(
        {"accuracy": np.float32(0.5), "examples": np.int64(3), "stop": np.bool_(0)}
    )
    assert result == (False, {"accuracy": 0.5, "examples": 3.0})
    assert all(type(v) is float for v in result[1].values())


def test_callback_metrics_may_not_replace_evaluation_data_metrics(spark, digits, rdd) -> None:
    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master("pa", collect_training_stats=True)) as sm:
        sm.evaluation_data = subset(digits[1], 50)
        with pytest.raises(ValueError, match="metric 'accuracy' is already recorded from evaluation_data"):
            sm.fit(rdd, epoch_callback=lambda epoch, network: {"accuracy": 0.5})
        sm.fit(rdd, epochs=2, epoch_callback=lambda epoch, network: {"train_accuracy": 0.5 + epoch / 8})
        metrics = sm.training_stats.epoch_metrics()  # the failed fit (epoch 0) recorded nothing
        assert list(metrics) == [1, 2]
        assert (metrics[1]["train_accuracy"], metrics[2]["train_accuracy"]) == (0.625, 0.75)
        assert metrics[2]["accuracy"] == sm.network.evaluate(sm.evaluation_data).accuracy()
        assert set(metrics[1]) == {"accuracy", "evaluation_score", "train_accuracy"}


class StopTraining(Exception):
    pass


@pytest.mark.parametrize("master", MASTERS)
def test_exception_in_callback_reaches_the_caller(spark, rdd, master) -> None:
    def fail(epoch: int, network) -> bool:
        raise StopTraining(f"epoch {epoch}")

    with SparkMultiLayer(spark, mlp_conf(hidden=8), _master(master)) as sm:
        with pytest.raises(StopTraining, match="^epoch 0$"):
            sm.fit(rdd, epochs=3, epoch_callback=fail)
        assert sm.network.epoch_count == 1  # the epoch had finished when the callback ran
        sm.fit(rdd, epochs=1)  # the model is still usable (the failed fit cleaned up)
        assert sm.network.epoch_count == 2


@pytest.mark.parametrize("method", ["fit", "fit_paths", "fit_labeled_point", "fit_continuous_labeled_point"])
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(epochs=0), ValueError, r"^epochs: must be >= 1, got 0$"),
        (dict(epochs=-2), ValueError, r"^epochs: must be >= 1, got -2$"),
        (dict(epochs=True), TypeError, r"^epochs: expected a positive int, got bool$"),
        (dict(epochs=2.0), TypeError, r"^epochs: expected a positive int, got float$"),
        (dict(epochs="3"), TypeError, r"^epochs: expected a positive int, got str$"),
        (dict(epoch_callback=3), TypeError, r"^epoch_callback: expected a callable .* got int$"),
    ],
)
def test_bad_epoch_arguments_name_the_argument(spark, rdd, method, kwargs, error, message) -> None:
    # SparkMultiLayer checks them for either master, before any Spark job
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _master("pa"))
    with pytest.raises(error, match=message):
        getattr(sm, method)(rdd, **kwargs)
    assert sm.network.epoch_count == 0
