"""Deep Gradient Compression's momentum factor masking (FlatNetwork.mask_momentum) and its use by the
gradient-sharing workers of ParallelWrapper (SharedTrainingMaster's worker: tests/distributed)."""

from __future__ import annotations

import numpy as np
import pytest

from prerequisites import require_gpu
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.data import DataSet, ListDataSetIterator
from sparkgrad.nn import (
    ComputationGraph,
    ComputationGraphConfiguration,
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)
from sparkgrad.parallel import ParallelWrapper


def _multilayer(first: updaters.Updater, second: updaters.Updater) -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(6, activation="tanh", updater=first), OutputLayer(3, updater=second)],
        input_type=InputType.feed_forward(4),
        seed=3,
        dtype="float64",
    )
    return MultiLayerNetwork(conf).init()


def _graph(first: updaters.Updater, second: updaters.Updater) -> ComputationGraph:
    conf = (
        ComputationGraphConfiguration.builder(seed=3, dtype="float64")
        .add_inputs("x")
        .set_input_types(InputType.feed_forward(4))
        .add_layer("hidden", DenseLayer(6, activation="tanh", updater=first), "x")
        .add_layer("out", OutputLayer(3, updater=second), "hidden")
        .set_outputs("out")
        .build()
    )
    return ComputationGraph(conf).init()


def _data(n: int = 32, seed: int = 0) -> DataSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    labels = np.eye(3)[(x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)]
    return DataSet(x, labels)


@pytest.mark.parametrize("make", [_multilayer, _graph], ids=["multilayer", "graph"])
def test_mask_momentum_zeroes_the_velocity_where_sent_and_nothing_else(make) -> None:
    """The hidden layer trains with Nesterovs (its state is the velocity), the output layer with Adam:
    only the Nesterov velocity of the sent parameters becomes 0, every other state element keeps its value."""
    net = make(updaters.Nesterovs(0.1, 0.9), updaters.Adam(1e-2))
    for _ in range(3):
        net.apply_update(net.compute_update(_data())[0])
    hidden = 4 * 6 + 6  # the hidden layer's parameters come first, and so does its state
    state = net.updater_state().copy()
    assert np.all(state[:hidden] != 0) and np.all(state[hidden:] != 0)
    sent = np.zeros(net.num_params())
    chosen = [0, 7, hidden - 1, hidden, net.num_params() - 1]  # both ends of both layers
    sent[chosen] = [0.5, -0.25, 1e-30, 0.5, -0.5]
    net.mask_momentum(sent)
    expected = state.copy()
    expected[[0, 7, hidden - 1]] = 0
    np.testing.assert_array_equal(net.updater_state(), expected)


def test_mask_momentum_names_a_vector_of_the_wrong_length() -> None:
    net = _multilayer(updaters.Nesterovs(), updaters.Nesterovs())
    with pytest.raises(ValueError, match=r"sent: expected a flat vector of length 51, got shape \(50,\)"):
        net.mask_momentum(np.zeros(50))


def _fit_one_worker(updater: updaters.Updater, masking: bool) -> tuple[ParallelWrapper, MultiLayerNetwork]:
    net = _multilayer(updater, updater)
    wrapper = ParallelWrapper(
        net, workers=1, threshold_algorithm=FixedThresholdAlgorithm(1e-2), momentum_masking=masking
    )
    wrapper.fit(ListDataSetIterator(_data(64, seed=1), batch_size=8), epochs=2)
    return wrapper, net


def test_shared_gradient_workers_mask_their_velocity_after_every_message() -> None:
    """One worker (so its replica is the wrapped network's): after the last step the velocity is 0 exactly
    where the last message sent, unlike without masking, and the two fits differ."""
    masked, net = _fit_one_worker(updaters.Nesterovs(0.1, 0.9), True)
    worker = masked._workers[0]
    sent = worker.scratch != 0
    assert 0 < sent.sum() < sent.size  # a sparse last message
    velocity = worker.net.updater_state()
    assert np.all(velocity[sent] == 0) and np.count_nonzero(velocity[~sent]) > 0
    plain, plain_net = _fit_one_worker(updaters.Nesterovs(0.1, 0.9), False)
    plain_worker = plain._workers[0]
    assert np.count_nonzero(plain_worker.net.updater_state()[plain_worker.scratch != 0]) > 0
    assert not np.array_equal(net.params(), plain_net.params())


def test_masking_leaves_updaters_without_velocity_alone() -> None:
    _, masked = _fit_one_worker(updaters.Adam(1e-2), True)
    _, plain = _fit_one_worker(updaters.Adam(1e-2), False)
    np.testing.assert_array_equal(masked.params(), plain.params())
    np.testing.assert_array_equal(masked.updater_state(), plain.updater_state())


def test_bad_momentum_masking_names_the_argument() -> None:
    with pytest.raises(ValueError, match="momentum_masking"):
        ParallelWrapper(_multilayer(updaters.Sgd(), updaters.Sgd()), momentum_masking="yes")


@pytest.mark.cuda
@pytest.mark.parametrize("make", [_multilayer, _graph], ids=["multilayer", "graph"])
def test_mask_momentum_on_the_gpu_zeroes_exactly_what_the_cpu_zeroes(make) -> None:
    """The same masking on a network on cuda:0 with a GPU vector: the velocity elements that were non-zero
    before stay bit-identical (masking only writes zeros) and the sent ones become 0, as on the CPU."""
    cp = require_gpu()
    net = make(updaters.Nesterovs(0.1, 0.9), updaters.Adam(1e-2)).to("cuda:0")
    for _ in range(3):
        net.apply_update(net.compute_update(_data())[0])
    hidden = 4 * 6 + 6
    state = net.updater_state().copy()
    sent = np.zeros(net.num_params())
    sent[[0, 7, hidden - 1, hidden, net.num_params() - 1]] = [0.5, -0.25, 1e-30, 0.5, -0.5]
    net.mask_momentum(cp.asarray(sent))
    expected = state.copy()
    expected[[0, 7, hidden - 1]] = 0
    np.testing.assert_array_equal(net.updater_state(), expected)
