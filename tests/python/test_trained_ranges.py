"""TrainedRanges: the trained part of a flat parameter vector, gathered and put back (issue 39)."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.nn import DenseLayer, FrozenLayer, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.input_type import InputType
from sparkgrad.nn.trained_ranges import TrainedRanges


def test_gather_and_put_back_move_only_the_trained_entries() -> None:
    ranges = TrainedRanges.of([(0, 2), (2, 3), (3, 3), (5, 7)], 9)  # adjacent merged, empty dropped
    assert ranges.ranges == ((0, 3), (5, 7)) and ranges.size == 5 and not ranges.all
    vec = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(ranges.gather(vec), [0, 1, 2, 5, 6])
    base = np.full(9, -1.0, np.float32)
    full = ranges.put_back(np.array([10, 11, 12, 15, 16], np.float32), base)
    assert full is base  # in place
    np.testing.assert_array_equal(full, [10, 11, 12, -1, -1, 15, 16, -1, -1])


def test_nothing_frozen_copies_nothing() -> None:
    ranges = TrainedRanges.of([(0, 4)], 4)
    vec, base = np.ones(4, np.float32), np.zeros(4, np.float32)
    assert ranges.all and ranges.gather(vec) is vec
    assert ranges.put_back(vec, base) is vec and not base.any()


def test_all_frozen_gathers_an_empty_vector() -> None:
    ranges = TrainedRanges.of([], 3)
    assert ranges.gather(np.ones(3, np.float32)).shape == (0,)
    np.testing.assert_array_equal(ranges.put_back(np.empty(0, np.float32), np.ones(3, np.float32)), 1.0)


@pytest.mark.parametrize("bad", [[(2, 1)], [(0, 5)], [(2, 4), (1, 3)], [(-1, 2)]])
def test_bad_ranges_are_refused_naming_the_argument(bad) -> None:
    with pytest.raises(ValueError, match="ranges: expected ascending disjoint ranges within"):
        TrainedRanges.of(bad, 4)


def test_a_vector_of_the_wrong_length_is_refused_naming_the_argument() -> None:
    ranges = TrainedRanges.of([(1, 3)], 4)
    with pytest.raises(ValueError, match="vec: expected a flat vector of length 4"):
        ranges.gather(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="compact: expected a flat vector of length 2"):
        ranges.put_back(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="base: expected a flat vector of length 4"):
        ranges.put_back(np.zeros(2, np.float32), np.zeros((2, 2), np.float32))


def test_a_network_trains_every_layer_but_its_frozen_ones() -> None:
    def net(first):
        conf = MultiLayerConfiguration(
            [first, DenseLayer(5), OutputLayer(3)], input_type=InputType.feed_forward(4), seed=1
        )
        return MultiLayerNetwork(conf).init()

    frozen = net(FrozenLayer(DenseLayer(6)))
    n = frozen.num_params()
    assert frozen.trained_ranges() == TrainedRanges.of([(4 * 6 + 6, n)], n)
    plain = net(DenseLayer(6))
    assert plain.trained_ranges().all and plain.trained_ranges().num_params == plain.num_params()
