"""The gradient-sharing policy, which SharedTrainingMaster's workers and ParallelWrapper's threads share:
how the updates of several workers combine, the default threshold algorithm, what a worker applies of
its own update, and the steps a replica takes (its own update, a received message, the controller's
parameters), which reach into the network.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from sparkgrad.compress.codec import FLAG_SPARSE, Array, decode_host_message, decode_message_into
from sparkgrad.compress.handler import EncodingHandler
from sparkgrad.compress.thresholds import TargetSparsityThresholdAlgorithm
from sparkgrad.device import is_gpu_array

# How gradient sharing combines the workers' updates, by the factor each worker's update is scaled by before
# it is encoded (bench/python/bench_convergence.py measures them against local training and DDP):
# - "auto" (default): "sum" when every trained layer's updater divides its step by a running average of
#   the squared gradients (Adam, AdaMax, Nadam, AmsGrad, RmsProp: :data:`SUMMED_UPDATERS`), else "sqrt".
#   Those updaters step about their learning rate per element whatever the gradient's size, so N workers'
#   steps summed are N steps such as local training takes; with a worker's own update applied in full
#   ("full", below) the sum needed fewer epochs than "sqrt" in every cell of the study for them (MLP,
#   CNN, LSTM; 2 to 16 workers; on Spark too). Summed, AdaGrad's first steps (its full learning rate on
#   every element) and momentum's amplified steps overshoot from 8 workers on, so they keep "sqrt"
#   (docs/guides/performance.md, "The default combination sums Adam and RmsProp").
# - "sqrt": 1 / sqrt(workers), the square-root scaling rule of an N-times larger batch (Krizhevsky 2014;
#   Malladi et al. 2022 for adaptive updaters). The workers' updates agree in their signal and not in
#   their noise, so their sum grows the step N-fold and the noise sqrt(N)-fold; this keeps the noise of one
#   worker's step.
# - "mean": 1 / workers, DDP's averaged step (exact for SGD); adaptive updaters then step less than DDP,
#   whose updater sees the averaged, less noisy gradient.
# - "sum": 1, DL4J's and Strom's.
UPDATE_COMBINATIONS = ("auto", "sqrt", "mean", "sum")
"""The ways the updates of N workers training at once combine (:func:`update_scale`)."""
DEFAULT_UPDATE_COMBINATION = "auto"
"""Each worker sends its update whole with the Adam family and RmsProp, divided by sqrt(N) otherwise."""
SUMMED_UPDATERS = ("adam", "adamax", "nadam", "amsgrad", "rmsprop")
"""The updater kinds whose updates ``"auto"`` sums: each divides its step by a running average of the
squared gradients."""


def update_combination_for(combination: str, updaters: Iterable[Any]) -> str:
    """``combination`` with ``"auto"`` resolved for a network trained by ``updaters`` (its updater
    configurations, e.g. ``network.updaters``): ``"sum"`` when every one that trains parameters is of a
    kind in :data:`SUMMED_UPDATERS`, else ``"sqrt"``."""
    if combination not in UPDATE_COMBINATIONS:
        raise ValueError(
            f"update_combination: expected one of {', '.join(UPDATE_COMBINATIONS)}, got {combination!r}"
        )
    if combination != "auto":
        return combination
    kinds = {getattr(u, "kind", None) for u in updaters} - {"noop"}  # a frozen layer takes no step
    return "sum" if kinds and kinds <= set(SUMMED_UPDATERS) else "sqrt"


def update_scale(combination: str, workers: int, updaters: Iterable[Any] = ()) -> float:
    """The :class:`EncodingHandler` ``update_scale`` of ``workers`` workers combined by ``combination``
    (one of :data:`UPDATE_COMBINATIONS`; ``"auto"`` decided by ``updaters``, see
    :func:`update_combination_for`)."""
    resolved = update_combination_for(combination, updaters)
    return {"mean": 1.0 / workers, "sum": 1.0, "sqrt": 1.0 / math.sqrt(workers)}[resolved]


# The default threshold algorithm of gradient sharing (SharedTrainingMaster, ParallelWrapper). Its 3e-3
# target needed as few or fewer epochs than 1e-3 in every cell of the convergence study (3 models, 5
# updaters, 2 to 16 workers, on Spark too), the packed wire paying for the denser messages
# (docs/guides/performance.md, "Packed messages and the 3e-3 default"); DL4J's default is
# AdaptiveThresholdAlgorithm() with ResidualClippingPostProcessor(5.0, 5).
DEFAULT_INITIAL_THRESHOLD = 2e-2
"""The first threshold of :func:`default_threshold_algorithm`."""
DEFAULT_SPARSITY_TARGET = 3e-3
"""The fraction of a message's elements :func:`default_threshold_algorithm` aims to send."""


def default_threshold_algorithm() -> TargetSparsityThresholdAlgorithm:
    """A fresh ``TargetSparsityThresholdAlgorithm(DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET,
    start_at_target=True)``.

    Starting at the first update's target quantile is what makes the first epoch count: from the fixed
    2e-2 start the threshold needs about 100 steps to come down to the updates, so with 8 workers a digits
    epoch (11 steps each) sent nothing; it costs bytes in the first epoch only. Measured with
    ``bench/python/bench_convergence.py`` (the numbers: the Performance guide, "Gradient sharing: how the
    workers' updates combine"); DL4J's start is ``start_at_target=False``."""
    return TargetSparsityThresholdAlgorithm(
        DEFAULT_INITIAL_THRESHOLD, DEFAULT_SPARSITY_TARGET, start_at_target=True
    )


# What a worker applies to its own replica of its own update (bench/python/bench_convergence.py's "+encoded"
# contenders measure DL4J's choice against the default):
# - "full" (default): the whole scaled update, at once; only the peers see it through the threshold. The
#   replica runs ahead of the controller's parameters by exactly its unsent residual, which it keeps when it
#   takes the controller's parameters (take_params). Its own steps are then never held back by its encoder,
#   so momentum builds on the steps it took: with Nesterov momentum it needed fewer epochs than "encoded"
#   and never fell after reaching the target (docs/guides/performance.md, "A worker's own update").
# - "encoded": only what its message carries, as DL4J's and Strom's workers do: every replica applies the
#   same messages, and an element of the update moves the replica by one threshold a step however large it
#   is, a delay that momentum turns into overshoot.
OWN_UPDATES = ("full", "encoded")
"""What a gradient-sharing worker applies to its own replica of its own update (:func:`share_update`)."""
DEFAULT_OWN_UPDATE = "full"
"""A worker applies its whole (scaled) update to its own replica at once."""


def check_own_update(own_update: Any) -> str:
    """``own_update`` if it is one of :data:`OWN_UPDATES`, else a ValueError naming the argument."""
    if own_update not in OWN_UPDATES:
        raise ValueError(f"own_update: expected one of {', '.join(OWN_UPDATES)}, got {own_update!r}")
    return str(own_update)


def share_update(
    handler: EncodingHandler,
    network: Any,
    update: Array,
    iteration: int,
    epoch: int,
    own_update: str,
    scratch: Array,
    *,
    decode_sparse: bool = True,
) -> np.ndarray | None:
    """A gradient-sharing worker's own step: encodes ``update`` with ``handler`` and applies it to the
    worker's replica as ``own_update`` says (:data:`OWN_UPDATES`). SharedTrainingMaster's workers and
    ParallelWrapper's threads both take their step here. On a device the codecs have no kernels for
    (neither the CPU nor a CUDA GPU) the update is encoded on the host, downloaded with the replica's
    ``device.to_host``, and the decoded message is uploaded with its ``from_host``.

    Args:
        handler: the worker's encoder (its ``update_scale`` scales what the replica applies too).
        network: the worker's replica (``apply_update`` on ``update``'s device).
        update: the update the replica's updater computed (its own buffer after a row-sparse step: only
            where that step wrote it joins the residual, ``network.update_support``, and the replica
            applies it there, scaled by ``apply_update(update, scale=)``).
        iteration: the replica's iteration count (drives the threshold algorithm).
        epoch: the replica's epoch count.
        own_update: ``"full"`` or ``"encoded"``.
        scratch: the decode buffer on the replica's device; holds the message decoded afterwards, unless
            it is sparse and ``decode_sparse`` is False (then its contents are undefined).
        decode_sparse: decode a sparse message into ``scratch`` too (a bitmap always is), for a caller
            that reads it (momentum masking); False saves a pass over the parameters' size: ``"encoded"``
            then applies a sparse message in place (:func:`apply_message`).

    Returns:
        The message to send to the peers, or None when nothing reached the threshold.
    """
    support = None
    # a device the codecs have no kernels for: the residual lives on the host, the update goes there
    # through the device's counted download
    if _without_codec(update):
        message = handler.encode(network.device.to_host(update), iteration, epoch)
    else:  # after a row-sparse step only the rows it wrote join the residual (the update is zero elsewhere)
        support_of = getattr(network, "update_support", None)
        support = None if support_of is None else support_of(update)
        message = handler.encode(update, iteration, epoch, support=support)
    if own_update == "full":
        scale = handler.update_scale
        if scale == 1.0:
            network.apply_update(update)
        elif support is not None:  # a network with update_support takes the factor: the row-sparse
            # apply scales only where the step wrote, no scaled copy of every parameter
            network.apply_update(update, scale=scale)
        else:
            network.apply_update(update * update.dtype.type(scale))
    if message is None:
        return None
    if not decode_sparse and _is_sparse(message):
        if own_update == "encoded":
            apply_message(message, network, scratch)
        return message
    _decode_on_device(message, network, scratch)  # the caller's momentum masking and counts read it
    if own_update == "encoded":
        network.apply_update(scratch)
    return message


def apply_message(message: np.ndarray, network: Any, scratch: Array) -> None:
    """Applies a host message (from a peer or off the network) to a replica, the step every
    gradient-sharing replica takes for each message. A sparse message goes straight into the parameters
    with ``network.apply_sparse_message`` where the network has it and ``scratch`` is a NumPy or CuPy array
    (O(entries), bit-identical to the dense path: :func:`~sparkgrad.compress.subtract_message`); otherwise
    (a bitmap, another device, a network with ``apply_update`` only) ``scratch`` receives the decoded
    message on its device (:func:`decode_message_into`), then ``network.apply_update(scratch)``. The
    scratch's contents afterwards are therefore undefined.

    Args:
        message: 1-D int32 numpy message.
        network: anything with ``apply_update`` taking an array of ``scratch``'s device (and optionally
            ``apply_sparse_message``, as sparkgrad's networks have).
        scratch: 1-D float32/float64 numpy or CuPy array of the network's parameter length (or an array
            of ``network.device`` that the codecs have no kernels for: decoded on the host, uploaded).
    """
    sparse_apply = getattr(network, "apply_sparse_message", None)
    if sparse_apply is not None and _is_sparse(message) and not _without_codec(scratch):
        sparse_apply(message)
        return
    _decode_on_device(message, network, scratch)
    network.apply_update(scratch)


def take_params(network: Any, params: Array, handler: EncodingHandler, own_update: str) -> None:
    """A worker's replica takes the controller's (or the wrapped network's) parameters: with ``"full"``
    its own unsent residual, which it already applied and has not sent, stays applied."""
    network.set_params(params)
    if own_update == "full" and handler.device is not None:  # None: no update yet, the residual is zero
        network.apply_update(handler.residual)


def _decode_on_device(message: np.ndarray, network: Any, scratch: Array) -> None:
    """:func:`decode_message_into` for the scratch of ``network``'s device: decoded on the host and
    uploaded (``device.from_host``) for a device the codecs have no kernels for."""
    if not _without_codec(scratch):
        decode_message_into(message, scratch)
        return
    device = network.device
    host = np.zeros(scratch.shape, scratch.dtype)
    decode_host_message(message, host)
    with device.scope():
        device.xp.copyto(scratch, device.from_host(host))


def _is_sparse(message: np.ndarray) -> bool:
    """Whether a host message's flag (word 3) says sparse; a message too short for a header is not (the
    decoder's validation names what is wrong with it)."""
    return message.shape[0] > 3 and message[3] == FLAG_SPARSE


def _without_codec(arr: Any) -> bool:
    """Whether ``arr`` is an array of a device the codecs have no kernels for: neither NumPy nor a CUDA
    array (another backend behind :class:`~sparkgrad.device.Device`, such as the tests' emulated device).
    Its data crosses to the host explicitly, through its device's ``to_host`` / ``from_host``."""
    return not isinstance(arr, np.ndarray) and not is_gpu_array(arr)


__all__ = [
    "DEFAULT_INITIAL_THRESHOLD",
    "DEFAULT_OWN_UPDATE",
    "DEFAULT_SPARSITY_TARGET",
    "DEFAULT_UPDATE_COMBINATION",
    "OWN_UPDATES",
    "SUMMED_UPDATERS",
    "UPDATE_COMBINATIONS",
    "apply_message",
    "check_own_update",
    "default_threshold_algorithm",
    "share_update",
    "take_params",
    "update_combination_for",
    "update_scale",
]
