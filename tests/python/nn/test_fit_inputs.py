"""MultiLayerNetwork.fit on the inputs a NumPy user has: (x, y) arrays, tuples, iterables of batches."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.data import DataSet, ListDataSetIterator
from sparkgrad.data.inputs import DEFAULT_ARRAY_BATCH_SIZE, training_batches
from sparkgrad.nn import (
    DenseLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    updaters,
)


def _xy(n: int = 70, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[np.argmax(x[:, :3], axis=1)]
    return x, y


def _net() -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(6, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(5),
        updater=updaters.Adam(0.01),
        seed=3,
    )
    return MultiLayerNetwork(conf).init()


def _reference(x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int) -> MultiLayerNetwork:
    """The same training spelled with DataSets: the result every other input form must reproduce."""
    return _net().fit(ListDataSetIterator(DataSet(x, y), batch_size), epochs=epochs)


def test_arrays_train_exactly_like_the_equivalent_datasets() -> None:
    x, y = _xy()
    expected = _reference(x, y, 16, 2)
    for net in (
        _net().fit(x, y, batch_size=16, epochs=2),
        _net().fit((x, y), batch_size=16, epochs=2),
        _net().fit([(x[i : i + 16], y[i : i + 16]) for i in range(0, 70, 16)], epochs=2),
        _net().fit([DataSet(x, y)], batch_size=16, epochs=2),
        _net().fit(DataSet(x, y), batch_size=16, epochs=2),
    ):
        np.testing.assert_array_equal(net.params(), expected.params())
        assert net.iteration_count == expected.iteration_count == 2 * 5
        assert net.epoch_count == 2


def test_arrays_default_to_batches_of_32() -> None:
    x, y = _xy()
    net = _net().fit(x, y)
    assert net.iteration_count == -(-70 // DEFAULT_ARRAY_BATCH_SIZE) == 3
    np.testing.assert_array_equal(net.params(), _reference(x, y, 32, 1).params())


def test_iterable_of_pairs_is_rebatched() -> None:
    x, y = _xy()
    pairs = [(x[:50], y[:50]), (x[50:], y[50:])]
    batches = list(training_batches(pairs, batch_size=20))
    assert [b.num_examples() for b in batches] == [20, 20, 20, 10]
    np.testing.assert_array_equal(np.concatenate([b.features for b in batches]), x)
    np.testing.assert_array_equal(np.concatenate([b.labels for b in batches]), y)


def test_a_generator_serves_one_epoch_only() -> None:
    x, y = _xy()
    net = _net().fit((x[i : i + 10], y[i : i + 10]) for i in range(0, 70, 10))
    assert net.iteration_count == 7
    with pytest.raises(ValueError, match="data: a one-shot iterator"):
        _net().fit(((x, y) for _ in range(2)), epochs=2)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("features",), {}, TypeError, "data: features given without labels"),
        (("dataset", "labels"), {}, TypeError, "labels: given with data of type DataSet"),
        (("dataset", 3), {}, TypeError, r"epochs by keyword"),
        (("features", "labels"), {"batch_size": 0}, ValueError, "batch_size"),
        (([(1, 2, 3)],), {}, TypeError, r"data\[0\]: expected a DataSet or an \(x, y\) tuple"),
        (("text",), {}, TypeError, "data: expected a DataSet"),
    ],
)
def test_bad_input_names_the_argument(args: tuple, kwargs: dict, error: type, match: str) -> None:
    x, y = _xy()
    values = {"features": x, "labels": y, "dataset": DataSet(x, y), "text": "x.csv"}
    resolved = [values.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(error, match=match):
        _net().fit(*resolved, **kwargs)


def test_row_count_mismatch_is_rejected() -> None:
    x, y = _xy()
    with pytest.raises(ValueError, match="labels"):
        _net().fit(x, y[:-1])


def test_score_is_a_method_with_a_dl4j_alias() -> None:
    x, y = _xy()
    net = _net().fit(x, y)
    assert net.get_score() == net.score()
    ds = DataSet(x, y)
    assert net.get_score(ds) == net.score(ds)
