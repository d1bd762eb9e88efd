"""The 2-D layers that copy their input into a new shape (Upsampling2D, ZeroPaddingLayer, Cropping2D)
against NumPy (np.repeat, np.pad, slicing) and their adjoints (their float64 gradient checks are in
test_gradient_check.py), the same bits for 1 and 2 threads, configuration round trips and checks, and
per-step use on sequences of images."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sparkgrad
from sparkgrad.data import DataSet
from sparkgrad.nn import (
    Cropping2D,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    RnnOutputLayer,
    Upsampling2D,
    ZeroPaddingLayer,
)


def _net(layers, input_type, dtype="float64") -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(layers, input_type=input_type, seed=3, dtype=dtype)
    return MultiLayerNetwork(conf).init()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 3),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    size=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    pad=st.tuples(*[st.integers(0, 2)] * 4),
    crop=st.tuples(*[st.integers(0, 2)] * 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_copies_match_numpy_and_their_adjoints(n, c, h, w, size, pad, crop, seed) -> None:
    """Upsampling2D -> ZeroPaddingLayer -> Cropping2D against np.repeat, np.pad and slicing; the backward
    of each is the adjoint: <f(x), dy> = <x, f^T(dy)>, here checked entry by entry against NumPy."""
    hu, wu = h * size[0], w * size[1]
    hp, wp = hu + pad[0] + pad[1], wu + pad[2] + pad[3]
    if hp - crop[0] - crop[1] < 1 or wp - crop[2] - crop[3] < 1:
        return
    rng = np.random.default_rng(seed)
    layers = [Upsampling2D(size), ZeroPaddingLayer(pad), Cropping2D(crop), OutputLayer(2)]
    net = _net(layers, InputType.convolutional(h, w, c))
    x = rng.normal(size=(n, c, h, w))
    up, zp, cr = net._runtimes[:3]
    y = cr.forward(zp.forward(up.forward(x, False, 0), False, 0), False, 0)
    want = np.repeat(np.repeat(x, size[0], axis=2), size[1], axis=3)
    want = np.pad(want, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    want = want[:, :, crop[0] : hp - crop[1], crop[2] : wp - crop[3]]
    np.testing.assert_array_equal(y, want)
    dy = rng.normal(size=y.shape)
    dx = up.backward(zp.backward(cr.backward(dy.copy(), True), True), True)
    full = np.zeros((n, c, hp, wp))
    full[:, :, crop[0] : hp - crop[1], crop[2] : wp - crop[3]] = dy
    inner = full[:, :, pad[0] : pad[0] + hu, pad[2] : pad[2] + wu]
    want_dx = inner.reshape(n, c, h, size[0], w, size[1]).sum(axis=(3, 5))
    np.testing.assert_allclose(dx, want_dx, rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_same_bits_for_1_and_2_threads(dtype: str) -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(32, 4, 12, 12)).astype(dtype)
    ds = DataSet(x, np.eye(3, dtype=dtype)[rng.integers(0, 3, 32)])
    layers = [ZeroPaddingLayer(1), Upsampling2D(2), Cropping2D((2, 1, 0, 3)), OutputLayer(3)]
    before = sparkgrad.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            sparkgrad.set_num_threads(threads)
            net = _net(layers, InputType.convolutional(12, 12, 4), dtype)
            results.append((net.output(x), net.compute_gradient_and_score(ds)[0].copy()))
    finally:
        sparkgrad.set_num_threads(before)
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


def test_configuration_round_trips_and_is_checked() -> None:
    conf = MultiLayerConfiguration(
        [Upsampling2D((2, 3)), ZeroPaddingLayer((1, 2)), Cropping2D((0, 1, 2, 3)), OutputLayer(2)],
        input_type=InputType.convolutional(4, 5, 2),
    )
    assert conf.layer_input_types[1] == InputType.convolutional(8, 15, 2)
    assert conf.layer_input_types[2] == InputType.convolutional(10, 19, 2)
    assert conf.layer_input_types[3] == InputType.convolutional(9, 14, 2)
    assert ZeroPaddingLayer(3).padding == (3, 3, 3, 3)
    assert MultiLayerConfiguration.from_json(conf.to_json()) == conf
    assert MultiLayerConfiguration.from_yaml(conf.to_yaml()) == conf
    with pytest.raises(ValueError, match="size"):
        Upsampling2D((0, 2))
    with pytest.raises(ValueError, match="padding"):
        ZeroPaddingLayer((1, -1, 0, 0))
    with pytest.raises(ValueError, match=r"layers\[0\] \(Cropping2D\)\.cropping: leaves nothing of the 4x5"):
        MultiLayerConfiguration(
            [Cropping2D((2, 2, 0, 0)), OutputLayer(2)], input_type=InputType.convolutional(4, 5, 2)
        )
    with pytest.raises(ValueError, match=r"layers\[0\] \(Upsampling2D\)\.input: needs convolutional input"):
        MultiLayerConfiguration([Upsampling2D(), OutputLayer(2)], input_type=InputType.feed_forward(3))


def test_sequences_of_images_run_the_copies_at_every_step() -> None:
    rng = np.random.default_rng(6)
    seq = _net(
        [ZeroPaddingLayer(1), Cropping2D((0, 2, 1, 0)), RnnOutputLayer(2)],
        InputType.recurrent_images(3, 3, 2),
    )
    one = _net(
        [ZeroPaddingLayer(1), Cropping2D((0, 2, 1, 0)), OutputLayer(2)], InputType.convolutional(3, 3, 2)
    )
    one.set_params(seq.params())
    x = rng.normal(size=(2, 2 * 3 * 3, 4))
    out = seq.output(x)
    for t in range(4):
        np.testing.assert_allclose(out[:, :, t], one.output(x[:, :, t].reshape(2, 2, 3, 3)), rtol=1e-12)
