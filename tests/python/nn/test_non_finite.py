"""Non-finite scores, gradients and updates stop training with a TrainingError and change nothing."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.data import DataSet
from sparkgrad.errors import TrainingError
from sparkgrad.nn import (
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)


def _net(activation: str = "tanh") -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation=activation), OutputLayer(3, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(6),
        updater=updaters.Adam(0.01),
        seed=3,
    )
    return MultiLayerNetwork(conf).init()


def _data(seed: int = 0, n: int = 16) -> DataSet:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return DataSet(x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)])


def _state(net: MultiLayerNetwork) -> tuple[np.ndarray, np.ndarray, int, int]:
    return net.params().copy(), net.updater_state().copy(), int(net.iteration_count), int(net.epoch_count)


def _assert_same_state(net: MultiLayerNetwork, before: tuple[np.ndarray, np.ndarray, int, int]) -> None:
    params, state, iteration, epoch = _state(net)
    np.testing.assert_array_equal(params, before[0])
    np.testing.assert_array_equal(state, before[1])
    assert (iteration, epoch) == before[2:]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features_name_the_first_bad_element_and_change_nothing(bad: float) -> None:
    net = _net()
    net.fit(_data(1))  # non-zero updater state to protect
    before = _state(net)
    ds = _data(2)
    ds.features[3, 5] = bad
    ds.features[9, 0] = bad
    with pytest.raises(TrainingError, match=r"iteration 1: non-finite .*features\[3, 5\]"):
        net.fit(ds)
    _assert_same_state(net, before)
    with pytest.raises(TrainingError, match=r"features\[3, 5\]"):
        net.compute_update(ds)
    _assert_same_state(net, before)


def test_non_finite_labels_and_parameters_are_named() -> None:
    net = _net()
    ds = _data()
    ds.labels[4, 1] = np.nan
    with pytest.raises(TrainingError, match=r"labels\[4, 1\]"):
        net.fit(ds)
    params = net.params().copy()
    params[17] = np.nan
    net.set_params(params)
    with pytest.raises(TrainingError, match=r"parameters\[17\] = nan"):
        net.fit(_data())


def test_overflow_with_finite_inputs_says_so() -> None:
    net = _net(activation="identity")
    ds = _data()
    ds.features[:] = np.float32(3e38)  # finite, but the products overflow float32
    with pytest.raises(TrainingError, match="every input is finite"):
        net.fit(ds)


def test_a_bad_batch_stops_a_multi_batch_fit_after_the_good_ones() -> None:
    good, bad = _data(1), _data(2)
    bad.features[0, 0] = np.nan
    reference = _net()
    reference.fit(good)
    net = _net()
    with pytest.raises(TrainingError, match=r"iteration 1: .*features\[0, 0\]"):
        net.fit([good, bad, good])
    np.testing.assert_array_equal(net.params(), reference.params())
    np.testing.assert_array_equal(net.updater_state(), reference.updater_state())
    assert np.isfinite(net.params()).all()


@pytest.mark.parametrize("dtype, big", [("float32", 3e38), ("float64", 1e308)])
def test_params_finite_sees_one_inf_or_nan_even_where_the_sum_overflows(dtype: str, big: float) -> None:
    """One float64 sum decides in the common case; finite values whose sum overflows it (float64
    parameters near the limit) fall back to the elementwise check."""
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(3, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(6),
        dtype=dtype,
    )
    net = MultiLayerNetwork(conf).init()
    assert net.params_finite()
    params = np.full(net.num_params(), big, dtype=dtype)
    net.set_params(params)
    assert net.params_finite()  # every value finite, the float64 sum of the float64 ones is not
    for bad in (np.inf, -np.inf, np.nan):
        params[5] = bad
        net.set_params(params)
        assert not net.params_finite()


def test_params_finite_over_indices_looks_at_those_parameters_only() -> None:
    # a worker checks only what a peer's sparse update changed: the other parameters kept their values
    conf = MultiLayerConfiguration(
        [DenseLayer(8, activation="tanh"), OutputLayer(3, activation="softmax", loss="mcxent")],
        input_type=InputType.feed_forward(6),
    )
    net = MultiLayerNetwork(conf).init()
    params = net.params().copy()
    params[5] = np.inf
    net.set_params(params)
    assert not net.params_finite()
    assert net.params_finite(np.array([0, 4, 6, 4], dtype=np.int32))
    assert not net.params_finite(np.array([6, 5], dtype=np.int32))
