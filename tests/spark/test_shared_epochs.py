"""SharedTrainingMaster: every epoch of a fit in one Spark job, the epoch callback, per-step stats."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import accuracy, mlp_conf, port, subset

from sparkgrad.compress import TargetSparsityThresholdAlgorithm, bitmap_encode, decode, threshold_encode
from sparkgrad.data import DataSet
from sparkgrad.errors import TrainingError
from sparkgrad.nn.schedules import MapSchedule
from sparkgrad.nn.updaters import Sgd
from sparkgrad.spark import (
    DefaultRepartitioner,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
)
from sparkgrad.spark.controller_fit import task_slots
from sparkgrad.spark.shared import encoded_count
from sparkgrad.transport import HEADER_SIZE

HEADER_BYTES = HEADER_SIZE + 16  # frame header + message header (4 int32 words)


def _master(**kwargs) -> SharedTrainingMaster:
    return SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        rng_seed=5,
        **kwargs,
    )


@pytest.fixture(scope="module")
def small_rdd(spark, digits):
    rdd = spark.sparkContext.parallelize(subset(digits[0], 256).split(1), 2)
    yield rdd
    rdd.unpersist()


def test_all_epochs_run_in_one_job_and_the_callback_sees_the_controller_params(spark, small_rdd) -> None:
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master())
    seen: list[tuple[int, int, np.ndarray]] = []

    def callback(epoch, network):
        seen.append((epoch, int(network.epoch_count), network.params().copy()))

    sm.fit(small_rdd, epochs=3, epoch_callback=callback)
    traffic = sm.training_master.last_traffic
    assert traffic["spark_jobs"] == 1 and traffic["epochs"] == 3
    # a fit shorter than updater_state_interval_ms (60 s) sends no updater-state report for late workers
    assert traffic["updater_state_reports"] == 0
    assert [(e, c) for e, c, _ in seen] == [(0, 1), (1, 2), (2, 3)]
    assert sm.network.epoch_count == 3
    # every example once per epoch: 256 examples in minibatches of 16 on 2 workers of 128
    assert traffic["worker_minibatches"] == 3 * 256 // 16
    # the last callback saw exactly the final model; earlier ones saw it before later updates
    np.testing.assert_array_equal(seen[-1][2], sm.network.params())
    assert not np.array_equal(seen[0][2], seen[-1][2])
    # a second fit continues the epoch numbering
    sm.fit(small_rdd, epochs=1, epoch_callback=callback)
    assert seen[-1][:2] == (3, 4) and sm.network.epoch_count == 4


def test_without_a_callback_the_workers_go_before_the_network_copies_the_epoch(
    spark, small_rdd, monkeypatch
) -> None:
    """No epoch callback: each epoch's barrier is released before the driver's network takes that
    epoch's parameters (a large model's copies held every worker); with one, the callback's network
    has them before the release. Either way the fit ends holding the controller's final parameters."""
    from sparkgrad.spark.controller_fit import ProgressController

    events: list[tuple[str, int]] = []
    release = ProgressController.release_epoch

    def recorded_release(self, epoch, stop):
        events.append(("release", epoch))
        return release(self, epoch, stop)

    monkeypatch.setattr(ProgressController, "release_epoch", recorded_release)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master())
    set_params = sm.network.set_params

    def recorded_set_params(params):
        events.append(("set_params", int(sm.network.epoch_count)))
        return set_params(params)

    monkeypatch.setattr(sm.network, "set_params", recorded_set_params)
    sm.fit(small_rdd, epochs=3)
    epoch_ends = [e for e in events if e[0] == "release" or e[1] < 3]
    expected = [("release", 0), ("set_params", 0), ("release", 1), ("set_params", 1)]
    assert epoch_ends[:6] == expected + [("release", 2), ("set_params", 2)]
    assert sm.network.epoch_count == 3
    final = sm.network.params().copy()
    events.clear()
    sm.fit(small_rdd, epochs=1, epoch_callback=lambda epoch, network: events.append(("callback", epoch)))
    assert events[:3] == [("set_params", 3), ("callback", 3), ("release", 3)]
    assert not np.array_equal(final, sm.network.params())


def test_the_workers_follow_an_epoch_learning_rate_schedule(spark, small_rdd) -> None:
    # the demo anneals its rate for the last epoch: the epoch count must reach the workers' updaters
    # within the one job. A rate of 0 in epoch 0 makes every update exactly 0: nothing is sent, the
    # controller's parameters stay the initial ones; the rate of epoch 1 then trains them.
    rate = MapSchedule("epoch", {0: 0.0, 1: 0.1})
    conf = dataclasses.replace(mlp_conf(hidden=16), updater=Sgd(rate))
    sm = SparkMultiLayer(spark, conf, _master())
    initial = sm.network.params().copy()
    seen: list[np.ndarray] = []
    sm.fit(small_rdd, epochs=2, epoch_callback=lambda epoch, network: seen.append(network.params().copy()))
    assert sm.training_master.last_traffic["spark_jobs"] == 1
    np.testing.assert_array_equal(seen[0], initial)
    assert not np.array_equal(seen[1], initial)


def test_a_true_callback_stops_every_worker_after_that_epoch(spark, small_rdd) -> None:
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), _master())
    epochs: list[int] = []
    sm.fit(small_rdd, epochs=10, epoch_callback=lambda e, net: epochs.append(e) or e == 1)
    traffic = sm.training_master.last_traffic
    assert epochs == [0, 1] and sm.network.epoch_count == 2
    assert traffic["epochs"] == 2 and traffic["spark_jobs"] == 1
    assert traffic["worker_minibatches"] == 2 * 256 // 16


def test_a_failing_callback_propagates_and_the_port_is_free_again(spark, small_rdd) -> None:
    master = _master()
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)

    def callback(epoch, network):
        raise KeyError(f"callback failed at epoch {epoch}")

    with pytest.raises(KeyError, match="callback failed at epoch 0"):
        sm.fit(small_rdd, epochs=5, epoch_callback=callback)
    sm.fit(small_rdd, epochs=1)  # workers stopped cleanly; the same port serves the next fit
    assert master.last_traffic["epochs"] == 1


def test_dl4j_partitioning_runs_one_job_per_epoch_and_still_learns(spark, digits, small_rdd) -> None:
    master = _master(repartitioner=DefaultRepartitioner())  # one minibatch per partition: 16 > 2 slots
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    before = accuracy(sm.network, digits[1])
    calls: list[int] = []
    sm.fit(small_rdd, epochs=2, epoch_callback=lambda e, net: calls.append(e))
    traffic = master.last_traffic
    assert calls == [0, 1] and traffic["spark_jobs"] == 2 and traffic["epochs"] == 2
    assert traffic["worker_minibatches"] == 2 * 256 // 16
    assert accuracy(sm.network, digits[1]) > before + 0.2


def test_density_series_values_match_the_bytes_of_every_message(spark, small_rdd) -> None:
    # a tiny first threshold makes the first updates bitmaps; doubling every step, it soon gives sparse ones
    algorithm = TargetSparsityThresholdAlgorithm(1e-5, 1e-3, decay_rate=0.5)
    master = _master(threshold_algorithm=algorithm, collect_training_stats=True)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    sm.fit(small_rdd, epochs=2)
    n = sm.network.num_params()
    bitmap_bytes = HEADER_BYTES + 4 * (n // 16 + 1)
    records = [r for recs in sm.training_stats.series().values() for r in recs]
    assert len(records) == 2 * 256 // 16
    kinds = set()
    for r in records:
        sent, density = int(r["bytes_sent"]), r["density"]
        if sent == 0:
            assert density == 0.0
        elif sent == bitmap_bytes:
            kinds.add("bitmap")
            assert 1 / 16 < density <= 1.0  # a bitmap is chosen only above 1/16 density
        else:  # packed (sign bits, a 1-5 byte gap per entry) when smaller than 4 header + k int32 words
            kinds.add("sparse")
            entries = round(density * n)
            assert density * n == pytest.approx(entries, abs=1e-6)
            assert (entries + 7) // 8 + entries <= sent - HEADER_BYTES <= 4 * entries
    assert kinds == {"bitmap", "sparse"}, kinds


@pytest.mark.parametrize("fraction", [0.3, 0.9])
def test_encoded_count_of_a_bitmap_is_its_encoded_elements_not_its_length(fraction: float) -> None:
    rng = np.random.default_rng(1)
    n = 4096
    x = np.zeros(n, np.float32)
    chosen = rng.choice(n, int(fraction * n), replace=False)
    x[chosen] = rng.choice([-1.0, 1.0], chosen.size) * rng.uniform(1.0, 2.0, chosen.size)
    message, _ = bitmap_encode(x.copy(), 1.0)
    decoded = np.zeros(n, np.float32)
    decode(message, decoded)
    assert int(message[0]) == n  # word 0 of a bitmap is the length: the old density read this
    assert encoded_count(message, decoded, is_bitmap=True) == chosen.size
    sparse = threshold_encode(x.copy(), 1.0)
    decoded.fill(0)
    decode(sparse, decoded)
    assert encoded_count(sparse, decoded, is_bitmap=False) == chosen.size


def test_non_finite_features_fail_naming_the_worker_and_leave_the_model_alone(spark, digits) -> None:
    train = subset(digits[0], 64)
    features = train.features.copy()
    features[37, 5] = np.nan
    rdd = spark.sparkContext.parallelize(DataSet(features, train.labels).split(1), 2)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _master())
    start = sm.network.params().copy()
    with pytest.raises(
        TrainingError,
        match=r"worker [^:]+:\d+#[0-9a-f]{8}: iteration \d+: non-finite .*features\[\d+, 5\] = nan",
    ):
        sm.fit(rdd, epochs=2)
    np.testing.assert_array_equal(sm.network.params(), start)  # NaN never reached the driver's model
    sm.fit(spark.sparkContext.parallelize(train.split(1), 2))  # the next fit on the same master works
    assert np.isfinite(sm.network.params()).all()


def test_task_slots_are_spark_s_own_count(spark) -> None:
    assert task_slots(spark.sparkContext) == 2  # local[2]: what a barrier stage is checked against


def test_a_clean_fit_loses_no_worker_and_reports_its_updater_state(spark, small_rdd, caplog) -> None:
    transport = ZmqTransportConfiguration(updater_state_interval_ms=0)  # report at every epoch end
    master = _master(transport=transport)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    start = sm.network.updater_state().copy()
    sm.fit(small_rdd, epochs=3)
    traffic = master.last_traffic
    assert traffic["workers"] == 2 and traffic["workers_lost"] == 0
    assert traffic["updates_from_lost_workers"] == 0 and traffic["retrained_minibatches"] == 0
    # the first partition's worker, once the barrier let it go at every epoch end but the fit's last
    # (no worker can join after it)
    assert traffic["updater_state_reports"] == 2
    # each worker's state at the fit's end came over the transport (a FINAL report each, besides the two
    # above), and the network holds their mean, not the fit's start state
    reports = (2 + 2) * (HEADER_SIZE + start.nbytes)
    assert traffic["worker_bytes_sent"] - traffic["worker_update_bytes_sent"] >= reports
    assert not np.array_equal(sm.network.updater_state(), start)
    assert np.isfinite(sm.network.updater_state()).all()
    assert "did not reach the controller" not in caplog.text
