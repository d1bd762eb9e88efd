"""The emulated device of ``emulated_device.py`` keeps its promise: device arrays reach the host only
through ``to_host`` (counted), and the mixing guard holds per thread. Then the product code the stricter
guard exposed: a gradient-sharing step on the emulated device downloads its update explicitly."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from emulated_device import DeviceArray, EmulatedDevice

from sparkgrad._native import _core
from sparkgrad.compress import (
    EncodingHandler,
    FixedThresholdAlgorithm,
    NoOpResidualPostProcessor,
    apply_message,
    share_update,
)
from sparkgrad.data import DataSet
from sparkgrad.nn import DenseLayer, InputType, MultiLayerConfiguration, MultiLayerNetwork, OutputLayer
from sparkgrad.nn.updaters import Sgd

CONVERSIONS = {
    "np.asarray": np.asarray,
    "np.array": np.array,
    "np.asanyarray": np.asanyarray,
    "np.ascontiguousarray": np.ascontiguousarray,
    "np.copyto into host": lambda a: np.copyto(np.zeros(3, np.float32), a),
    "tolist": lambda a: a.tolist(),
    "iteration": list,
}


@pytest.mark.parametrize("convert", CONVERSIONS.values(), ids=CONVERSIONS.keys())
def test_a_device_array_does_not_become_a_host_array_implicitly(convert: Any) -> None:
    dev = EmulatedDevice()
    arr = dev.put(np.arange(3, dtype=np.float32))
    with pytest.raises(TypeError, match=r"to_host|host array mixed"):
        convert(arr)
    assert dev.downloads == 0


def test_a_host_kernel_refuses_a_device_array() -> None:
    dev = EmulatedDevice()
    with pytest.raises(ValueError, match=r"update must be a numpy array, got .*DeviceArray"):
        _core.accumulate(np.zeros(3, np.float32), dev.put(np.ones(3, np.float32)))


def test_np_asarray_names_the_explicit_counted_download() -> None:
    dev = EmulatedDevice()
    arr = dev.put(np.arange(3, dtype=np.float32))
    with pytest.raises(TypeError, match=r"download it explicitly with device\.to_host\(arr\)"):
        np.asarray(arr)
    host = dev.to_host(arr)
    assert type(host) is np.ndarray and dev.downloads == 1
    np.testing.assert_array_equal(host, np.arange(3, dtype=np.float32))


def test_device_arrays_still_compute_and_read_scalars_on_the_device() -> None:
    dev = EmulatedDevice()
    arr = dev.put(np.arange(6, dtype=np.float32).reshape(2, 3))
    with dev.scope():
        total = dev.xp.sum(arr * 2 + 1)
    assert type(total) is not np.ndarray and float(total) == 36.0
    assert type(arr[1]) is DeviceArray and type(arr.reshape(-1)) is DeviceArray
    assert type(np.maximum(arr, 0)) is DeviceArray and arr.shape == (2, 3)
    assert dev.downloads == 0


def test_the_mixing_guard_is_per_thread() -> None:
    """While one thread is inside an xp call (where NumPy's internals may meet host arrays), another
    thread's mixed host/device arithmetic is still refused."""
    dev = EmulatedDevice()
    arr = dev.put(np.ones(3, np.float32))
    inside, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold(i: Any) -> Any:
        inside.set()
        release.wait(30)
        return i

    def xp_call() -> None:
        try:
            with dev.scope():
                dev.xp.fromfunction(hold, (3,))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    worker = threading.Thread(target=xp_call)
    worker.start()
    try:
        assert inside.wait(30)
        with pytest.raises(TypeError, match="host array mixed with device arrays"):
            arr + np.ones(3, np.float32)
        with pytest.raises(TypeError, match="host array mixed with device arrays"):
            arr[np.array([0, 1])] = 0
    finally:
        release.set()
        worker.join(30)
    assert not errors


# -- what the guard exposed in the product code -------------------------------------------------------


def _net() -> MultiLayerNetwork:
    conf = MultiLayerConfiguration(
        [DenseLayer(5, activation="tanh"), OutputLayer(3)],
        input_type=InputType.feed_forward(4),
        updater=Sgd(0.1),
        seed=3,
    )
    return MultiLayerNetwork(conf).init()


def _batch() -> DataSet:
    rng = np.random.default_rng(0)
    return DataSet(
        rng.normal(size=(8, 4)).astype(np.float32), np.eye(3, dtype=np.float32)[rng.integers(0, 3, 8)]
    )


@pytest.mark.parametrize("own_update", ["full", "encoded"])
def test_sharing_an_update_on_the_device_downloads_it_explicitly(own_update: str) -> None:
    """The encoder's residual lives on the host for a device the codecs have no kernels for: the update
    crosses once through ``to_host`` (counted, formerly an uncounted ``np.ascontiguousarray``), and the
    decoded message once through ``from_host`` (formerly decoded by a host kernel into device memory).
    The replica ends where the same step on the CPU leaves it."""
    dev = EmulatedDevice()
    on_dev, on_cpu = _net().to(dev), _net()

    def step(net: MultiLayerNetwork, scratch: Any) -> np.ndarray | None:
        handler = EncodingHandler(
            net.num_params(), FixedThresholdAlgorithm(1e-3), NoOpResidualPostProcessor()
        )
        update, _ = net.compute_update(_batch())
        dev.reset_counts()
        return share_update(handler, net, update, 0, 0, own_update, scratch)

    with dev.scope():
        scratch = dev.xp.zeros(on_dev.num_params(), np.float32)
    message = step(on_dev, scratch)
    assert message is not None and type(message) is np.ndarray
    assert dev.downloads == 1 and dev.uploads == 1
    host_scratch = np.zeros(on_cpu.num_params(), np.float32)
    np.testing.assert_array_equal(message, step(on_cpu, host_scratch))
    np.testing.assert_array_equal(EmulatedDevice.peek(scratch), host_scratch)
    np.testing.assert_array_equal(on_dev.params(), on_cpu.params())

    dev.reset_counts()
    apply_message(message, on_dev, scratch)  # a peer's message: decoded on the host, uploaded
    assert dev.downloads == 0 and dev.uploads == 1
