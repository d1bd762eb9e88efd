"""share_update and take_params: what a gradient-sharing worker applies of its own update."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgrad.compress import (
    OWN_UPDATES,
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    check_own_update,
    share_update,
    take_params,
)


class _Replica:
    """The part of a network a worker's step touches: params -= update."""

    def __init__(self, params: np.ndarray) -> None:
        self.p = params.copy()

    def apply_update(self, update: np.ndarray) -> None:
        self.p -= update

    def set_params(self, params: np.ndarray) -> None:
        self.p = params.copy()


def _handler(n: int, scale: float) -> EncodingHandler:
    return EncodingHandler(
        n, FixedThresholdAlgorithm(0.5), NoOpResidualPostProcessor(), dtype="float64", update_scale=scale
    )


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_full_applies_the_whole_scaled_update_and_encoded_only_the_message(scale: float) -> None:
    update = np.array([3.0, -1.25, 0.1, 0.0, -0.2, 2.0])  # none in a bitmap's half-threshold band
    start = np.arange(6, dtype=np.float64)
    for own_update in OWN_UPDATES:
        replica, handler, scratch = _Replica(start), _handler(6, scale), np.full(6, 7.0)
        message = share_update(handler, replica, update, 0, 0, own_update, scratch)
        assert message is not None
        # the scratch holds the message decoded: one threshold toward zero where the scaled update reached it
        scaled = update * scale
        sent = np.where(np.abs(scaled) >= 0.5, np.sign(scaled) * 0.5, 0.0)
        np.testing.assert_array_equal(scratch, sent)
        np.testing.assert_array_equal(handler.residual, scaled - sent)
        expected = start - (scaled if own_update == "full" else sent)
        np.testing.assert_array_equal(replica.p, expected)


def test_full_applies_its_update_when_nothing_reaches_the_threshold() -> None:
    replica, handler, scratch = _Replica(np.zeros(3)), _handler(3, 1.0), np.zeros(3)
    assert share_update(handler, replica, np.array([0.1, -0.2, 0.0]), 0, 0, "full", scratch) is None
    np.testing.assert_array_equal(replica.p, [-0.1, 0.2, 0.0])
    replica = _Replica(np.zeros(3))
    assert (
        share_update(_handler(3, 1.0), replica, np.array([0.1, -0.2, 0.0]), 0, 0, "encoded", scratch) is None
    )
    np.testing.assert_array_equal(replica.p, np.zeros(3))


def test_take_params_keeps_the_unsent_residual_applied_with_full_only() -> None:
    handler = _handler(3, 1.0)
    controller = np.array([1.0, 2.0, 3.0])
    for own_update in OWN_UPDATES:
        replica = _Replica(np.zeros(3))
        take_params(replica, controller, handler, own_update)  # before any update: nothing pending
        np.testing.assert_array_equal(replica.p, controller)
    share_update(handler, _Replica(np.zeros(3)), np.array([0.75, -0.125, 0.0]), 0, 0, "full", np.zeros(3))
    np.testing.assert_array_equal(handler.residual, [0.25, -0.125, 0.0])
    replica = _Replica(np.zeros(3))
    take_params(replica, controller, handler, "full")
    np.testing.assert_array_equal(replica.p, [0.75, 2.125, 3.0])
    take_params(replica, controller, handler, "encoded")
    np.testing.assert_array_equal(replica.p, controller)


def test_an_unknown_own_update_is_named() -> None:
    with pytest.raises(ValueError, match=r"own_update: expected one of full, encoded, got 'sent'"):
        check_own_update("sent")
