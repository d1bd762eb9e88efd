"""What the model importers (:mod:`sparkgrad.nn.keras`, :mod:`sparkgrad.nn.onnx`) share: copying the
weights they read into a built network's flat buffer, checked against the network's own layout."""

from __future__ import annotations

from typing import Any

import numpy as np


def set_weights(
    net: Any, given: dict[Any, dict[str, np.ndarray]], source: str, error: type[ValueError]
) -> Any:
    """Copy ``given`` ({layer index or vertex name: {parameter: value}}) into ``net``'s flat buffer; a
    missing parameter or one of another shape raises ``error`` naming the layer and ``source`` (the
    format the weights came from)."""
    flat = net.params().copy()
    for (key, layer, _), entries in zip(net._units, net._layouts):
        for spec, start, stop in entries:
            name = f"{key!r} ({type(layer).__name__})"
            if spec.name not in given.get(key, {}):
                raise error(f"layer {name}: {source} gave no {spec.name!r} weight")
            value = np.asarray(given[key][spec.name], dtype=flat.dtype)
            if value.shape != tuple(spec.shape):
                raise error(
                    f"layer {name} {spec.name!r}: {source} shape {value.shape}, expected {spec.shape}"
                )
            flat[start:stop] = value.ravel()
    net.set_params(flat)
    return net
