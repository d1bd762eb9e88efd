"""A network with frozen layers trains on Spark: gradient sharing leaves the frozen parameters bit-identical
on the driver and no message the controller applies names a frozen index (issue 39 item 2)."""

from __future__ import annotations

import numpy as np
from helpers import accuracy, local_network, port, subset

from sparkgrad.nn import DenseLayer, FineTuneConfiguration, FrozenLayer, OutputLayer, TransferLearning
from sparkgrad.nn.updaters import Nesterovs
from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration
from sparkgrad.spark.controller_fit import ProgressController


def test_shared_training_leaves_frozen_parameters_bit_identical_and_never_sends_them(
    spark, digits, monkeypatch
) -> None:
    train, test = digits
    pretrained = local_network(subset(train, 400), epochs=1)
    net = (
        TransferLearning.Builder(pretrained)
        .fine_tune_configuration(
            FineTuneConfiguration(updater=Nesterovs(0.05, 0.9), l2=1e-3, weight_decay=1e-3)
        )
        .set_feature_extractor(0)
        .remove_output_layer()
        .add_layer(DenseLayer(16, activation="relu"))
        .add_layer(OutputLayer(10))
        .build()
    )
    start, stop = net._layer_ranges[0]
    assert isinstance(net.conf.layers[0], FrozenLayer) and (start, stop) == (0, 64 * 128 + 128)
    frozen_before = net.params()[start:stop].copy()

    named = np.zeros(net.num_params(), dtype=bool)
    applied = ProgressController._applied

    def recording(self, header, message) -> None:  # the controller thread, on the driver
        named[np.flatnonzero(self._scratch)] = True  # the message, decoded into zeros
        applied(self, header, message)

    monkeypatch.setattr(ProgressController, "_applied", recording)
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        rdd_training_approach="direct",
        rng_seed=1,
    )
    sm = SparkMultiLayer(spark, net, master)
    rdd = spark.sparkContext.parallelize(train.split(16), 2)
    before = accuracy(sm.network, test)
    for _ in range(2):
        sm.fit(rdd)
    params = sm.network.params()
    np.testing.assert_array_equal(params[start:stop].view(np.uint32), frozen_before.view(np.uint32))
    assert master.last_traffic["updates_applied"] >= 1
    assert named[stop:].any() and not named[start:stop].any()
    assert accuracy(sm.network, test) > max(before, 0.8)


def test_parameter_averaging_gives_frozen_parameters_back_exactly(spark, digits) -> None:
    """Averaging sends every parameter, but each worker keeps the frozen ones it started with: their
    float64 mean is the same float32 value, so the driver's frozen layer stays bit-identical."""
    from sparkgrad.spark import ParameterAveragingTrainingMaster

    train, test = digits
    net = (
        TransferLearning.Builder(local_network(subset(train, 400), epochs=1))
        .set_feature_extractor(0)
        .remove_output_layer()
        .add_layer(OutputLayer(10))
        .build()
    )
    start, stop = net._layer_ranges[0]
    frozen_before = net.params()[start:stop].copy()
    before = accuracy(net, test)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=3, rng_seed=1)
    sm = SparkMultiLayer(spark, net, master)
    sm.fit(spark.sparkContext.parallelize(train.split(16), 2))
    params = sm.network.params()
    np.testing.assert_array_equal(params[start:stop].view(np.uint32), frozen_before.view(np.uint32))
    assert accuracy(sm.network, test) > max(before, 0.8)  # the new output layer trained
