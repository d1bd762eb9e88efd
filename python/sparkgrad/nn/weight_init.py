"""Weight initialisation with DL4J's definitions (fan-in/fan-out as DL4J's param initialisers)."""

from __future__ import annotations

import math

import numpy as np

from sparkgrad.nn.enums import WeightInit


def init_weights(
    scheme: WeightInit, out: np.ndarray, fan_in: float, fan_out: float, rng: np.random.Generator
) -> None:
    """Fill ``out`` (a view into the flat parameter buffer) in place.

    Args:
        scheme: the initialisation scheme.
        out: destination array of any shape; written in float64 then cast to its dtype.
        fan_in: inputs per output unit (C*R*S for convolutions).
        fan_out: outputs per input unit (K*R*S/(stride_h*stride_w) for convolutions).
        rng: the network's seeded generator; draws happen in layer order so results are reproducible.
    """
    shape = out.shape
    if scheme is WeightInit.ZERO:
        out[...] = 0.0
    elif scheme is WeightInit.ONES:
        out[...] = 1.0
    elif scheme is WeightInit.XAVIER:  # N(0, 2 / (fan_in + fan_out))
        out[...] = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), shape)
    elif scheme is WeightInit.XAVIER_UNIFORM:  # U(-s, s), s = sqrt(6 / (fan_in + fan_out))
        s = math.sqrt(6.0 / (fan_in + fan_out))
        out[...] = rng.uniform(-s, s, shape)
    elif scheme is WeightInit.RELU:  # He: N(0, 2 / fan_in)
        out[...] = rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)
    elif scheme is WeightInit.RELU_UNIFORM:  # U(-s, s), s = sqrt(6 / fan_in)
        s = math.sqrt(6.0 / fan_in)
        out[...] = rng.uniform(-s, s, shape)
    elif scheme is WeightInit.LECUN_NORMAL:  # N(0, 1 / fan_in)
        out[...] = rng.normal(0.0, math.sqrt(1.0 / fan_in), shape)
    elif scheme is WeightInit.NORMAL:  # N(0, std = 1 / sqrt(fan_in))
        out[...] = rng.normal(0.0, 1.0 / math.sqrt(fan_in), shape)
    elif scheme is WeightInit.UNIFORM:  # U(-a, a), a = 1 / sqrt(fan_in)
        a = 1.0 / math.sqrt(fan_in)
        out[...] = rng.uniform(-a, a, shape)
    else:  # pragma: no cover - the enum is closed
        raise ValueError(f"weight_init: unsupported scheme {scheme!r}")


__all__ = ["init_weights"]
