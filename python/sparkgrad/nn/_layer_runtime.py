"""The base of every layer runtime (:mod:`sparkgrad.nn._runtime` has the feed-forward ones,
:mod:`sparkgrad.nn._recurrent` the recurrent ones): a buffer cache plus the parameter and gradient views
of one layer, and its activation."""

from __future__ import annotations

from typing import Any

import numpy as np

from sparkgrad.device import Device
from sparkgrad.nn.enums import Activation
from sparkgrad.nn.input_type import InputType

_ALPHA = {Activation.LEAKYRELU: 0.01, Activation.ELU: 1.0}  # DL4J defaults


def activation_alpha(activation: Activation) -> float:
    """The ``alpha`` kernel argument of an activation (leaky-relu slope, elu alpha; 0 otherwise)."""
    return _ALPHA.get(activation, 0.0)


class LayerRuntime:
    """Base: buffer cache plus the parameter and gradient views of one layer."""

    def __init__(
        self,
        conf: Any,
        input_type: InputType,
        activation: Activation | None,
        dtype: np.dtype,
        params: dict[str, np.ndarray],
        grads: dict[str, np.ndarray],
        device: Device,
    ) -> None:
        self.conf = conf
        self.device, self.xp, self.k = device, device.xp, device.kernels
        self.input_type = input_type
        self.activation = activation
        self.alpha = activation_alpha(activation) if activation is not None else 0.0
        self.dtype = dtype
        self.params = params
        self.grads = grads
        self._buffers: dict[str, np.ndarray] = {}

    def buf(self, name: str, shape: tuple[int, ...], dtype: Any = None) -> np.ndarray:
        """A cached work array of ``shape`` (contents undefined)."""
        arr = self._buffers.get(name)
        if arr is None or arr.shape != shape:
            arr = self.xp.empty(shape, dtype=dtype or self.dtype)
            self._buffers[name] = arr
        return arr

    def forward(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        raise NotImplementedError  # every concrete runtime overrides this

    def backward(self, dy: np.ndarray, need_dx: bool) -> np.ndarray | None:
        """Writes parameter gradients; returns dL/dx (may reuse ``dy``'s memory) when ``need_dx``."""
        raise NotImplementedError  # every concrete runtime overrides this

    # -- helpers shared by the parametrised layers ---------------------------------------------
    def _input_dropout(self, x: np.ndarray, train: bool, seed: int) -> np.ndarray:
        """DL4J applies a layer's ``dropout`` to its input during training."""
        retain = getattr(self.conf, "dropout", None)
        self._dropped = train and retain is not None and retain < 1.0
        if not self._dropped:
            return x
        out, mask = self.buf("drop_x", x.shape), self.buf("drop_mask", x.shape)
        self.k.dropout_forward(x, out, mask, retain, seed)
        return out

    def _input_dropout_backward(self, dx: np.ndarray) -> np.ndarray:
        if self._dropped:
            self.k.dropout_backward(dx, self._buffers["drop_mask"], dx)
        return dx

    @property
    def _activation_name(self) -> str:
        """The activation's kernel name; only layers built with an activation ask for it."""
        if self.activation is None:
            raise TypeError(f"{type(self.conf).__name__}: this layer runtime has no activation")
        return self.activation.value

    def _activate(self, z: np.ndarray) -> np.ndarray:
        if self.activation is Activation.IDENTITY:
            return z
        y = self.buf("y", z.shape)
        self.k.activation_forward(self._activation_name, z, y, alpha=self.alpha)
        return y

    def _activation_backward(self, z: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        if self.activation is not Activation.IDENTITY:
            self.k.activation_backward(self._activation_name, z, y, dy, dy, alpha=self.alpha)
        return dy


__all__ = ["LayerRuntime", "activation_alpha"]
