"""A network with frozen layers trains on Spark: gradient sharing leaves the frozen parameters bit-identical
on the driver and no message the controller applies names a frozen index; parameter averaging sends and
averages only the trained parameters (issue 39 item 2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import accuracy, local_network, port, subset

from sparkgrad.data import MultiDataSet
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    FineTuneConfiguration,
    FrozenLayer,
    MergeVertex,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    TransferLearning,
)
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.updaters import Adam, Nesterovs, NoOp
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkComputationGraph,
    SparkMultiLayer,
    VoidConfiguration,
    parameter_averaging,
)
from sparkgrad.spark.controller_fit import ProgressController
from sparkgrad.transport import policies


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
    """The workers send and the driver averages only the trained parameters: the driver's frozen layer
    stays bit-identical and the new output layer trains."""
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


def _network(kind: str, frozen: bool) -> tuple[Any, tuple[int, int]]:
    """A network and the flat range of its layer under test: wrapped in a FrozenLayer, or the same layer
    with a NoOp updater (it never changes either, but is a trained range: sent and averaged in full). In
    the MultiLayerNetwork the layer is the first of three; in the ComputationGraph it is "dr" (the
    right half's layer), between "dl" and "hidden" in the flat buffer."""
    layer = DenseLayer(48, activation="relu") if frozen else DenseLayer(48, activation="relu", updater=NoOp())
    tested = FrozenLayer(layer) if frozen else layer
    net: Any
    if kind == "multilayer":
        conf = MultiLayerConfiguration(
            [tested, DenseLayer(16, activation="relu"), OutputLayer(10)],
            input_type=InputType.feed_forward(64),
            updater=Adam(1e-2),
            seed=1,
        )
        net, key = MultiLayerNetwork(conf).init(), 0
    else:
        net = ComputationGraph(
            ComputationGraphConfiguration.builder(seed=1, updater=Adam(1e-2))
            .add_inputs("left", "right")
            .set_input_types(InputType.feed_forward(32), InputType.feed_forward(32))
            .add_layer("dl", DenseLayer(48, activation="relu"), "left")
            .add_layer("dr", tested, "right")
            .add_vertex("merge", MergeVertex(), "dl", "dr")
            .add_layer("hidden", DenseLayer(48, activation="relu"), "merge")
            .add_layer("digit", OutputLayer(10), "hidden")
            .set_outputs("digit")
            .build()
        ).init()
        key = "dr"
    index = [unit[0] for unit in net._units].index(key)
    return net, net._layer_ranges[index]


@pytest.mark.parametrize("jobs", ["per_round", "one"])
@pytest.mark.parametrize("kind", ["multilayer", "graph"])
def test_parameter_averaging_sends_and_averages_only_the_trained_parameters(
    spark, digits, monkeypatch, kind, jobs
) -> None:
    """Against the same network whose layer has a NoOp updater instead (the full-vector averaging:
    nothing frozen): the same trained parameters and updater state bit for bit (two workers: the same
    exact float sums), so no trained entry was misplaced; the frozen ones bit-identical to before the
    fit; and every worker result the driver got holds the trained parameters (and their updater state)
    only."""
    sent: list[int] = []
    run_spark, parse = parameter_averaging.run_spark, policies.parse_averaging_payload

    def recording_run_spark(what, job):  # per_round: the treeAggregate of the workers' results
        total = run_spark(what, job)
        sent.append(total.params.size + total.updater.size)
        return total

    def recording_parse(header, payload, peer="peer"):  # one: the controller reads a worker's AVERAGE
        body, values = parse(header, payload, peer)
        if values is not None:
            sent.append(values.size)
        return body, values

    monkeypatch.setattr(parameter_averaging, "run_spark", recording_run_spark)
    monkeypatch.setattr(policies, "parse_averaging_payload", recording_parse)
    items = subset(digits[0], 200).split(10)
    if kind == "graph":
        items = [MultiDataSet([ds.features[:, :32], ds.features[:, 32:]], [ds.labels]) for ds in items]
    frozen_net, (start, stop) = _network(kind, frozen=True)
    reference, reference_range = _network(kind, frozen=False)
    assert reference_range == (start, stop) and (stop - start) == (32 if kind == "graph" else 64) * 48 + 48
    n = frozen_net.num_params()
    assert frozen_net.trained_ranges().size == n - (stop - start)
    assert start == 0 if kind == "multilayer" else 0 < start and stop < n  # bottom; middle of the buffer
    reference.set_params(frozen_net.params())
    before = frozen_net.params().copy()
    fitted, sizes, traffic = [], [], []
    for net in (frozen_net, reference):
        master = ParameterAveragingTrainingMaster(
            averaging_jobs=jobs,
            num_workers=2,
            batch_size_per_worker=10,
            averaging_frequency=2,
            rdd_data_set_num_examples=10,
            repartition="never",
            rng_seed=5,
            progress=False,
        )
        wrap = SparkMultiLayer if kind == "multilayer" else SparkComputationGraph
        sent.clear()
        sm = wrap(spark, net, master)
        sm.fit(spark.sparkContext.parallelize(items, 2), epochs=2)
        fitted.append(sm.network)
        sizes.append(list(sent))
        traffic.append(master.last_traffic)
    net, full = fitted
    params = net.params()
    np.testing.assert_array_equal(params[start:stop].view(np.uint32), before[start:stop].view(np.uint32))
    assert not np.array_equal(params[stop:], before[stop:])  # the rest trained
    np.testing.assert_array_equal(params.view(np.uint32), full.params().view(np.uint32))
    np.testing.assert_array_equal(net.updater_state().view(np.uint32), full.updater_state().view(np.uint32))
    # 2 epochs of 5 rounds (20 DataSets, 2 workers x 2 minibatches of 10 a round): per round one
    # aggregated sum; in one job an AVERAGE from each of the 2 workers
    rounds = 2 * 5 if jobs == "per_round" else 2 * 5 * 2
    state = net.updater_state().size  # Adam's, of the trained parameters only either way (NoOp has none)
    assert state == 2 * (n - (stop - start))
    assert sizes == [[n - (stop - start) + state] * rounds, [n + state] * rounds]
    if jobs == "one":  # the controller's byte counts: each AVERAGE in and AVERAGED out is 4 bytes a float
        # smaller; the frames' JSON bodies (scores) may differ by a few characters
        for key in ("controller_bytes_received", "controller_bytes_sent"):
            saved = traffic[1][key] - traffic[0][key]
            assert abs(saved - rounds * (stop - start) * 4) <= rounds * 32, (key, saved)
