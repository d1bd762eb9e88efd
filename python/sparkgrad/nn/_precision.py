"""Mixed precision (a network configuration's ``precision``): the GEMM mode and fp16's loss scaler.

"bf16" and "fp16" change only how the GPU's float32 GEMMs compute: on the tensor cores, their operands
losing at most what 16 bits lose (cuBLAS's TF32 path, or operands rounded to bfloat16 / float16 for large
products), with float32 accumulation (cuda/common/blas.cu). Every buffer stays float32:
parameters (the master weights), gradients, activations, updater state and the residual of threshold
encoding. The mode is a thread-local, per-device setting of the native module; a network sets it around
each of its entry points on a GPU (:func:`gemm_precision`) and restores the previous one after, so
networks of different precisions in different threads, or one running inside another's listener, do not
interfere.

float16 holds magnitudes from 2**-24 to 65504: small loss gradients would round to zero in a backward
GEMM with float16 operands. :class:`LossScaler` is PyTorch's GradScaler for the network's flat gradient:
the output layers multiply the loss gradient by ``scale``; the training step checks the flat gradient
once (a non-finite element: the step is skipped, the scale halves) and multiplies it by ``1 / scale``
(exact: the scale is a power of two) before gradient normalization, l1/l2, the updater and weight decay.
bfloat16 has float32's exponent range and needs no scaling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator

import numpy as np

from sparkgrad._native import _core

# torch.amp.GradScaler's defaults
INITIAL_SCALE = 2.0**16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000
_MAX_SCALE = float(np.finfo(np.float32).max)  # the scale multiplies float32 loss gradients


@contextlib.contextmanager
def gemm_precision(precision: str) -> Iterator[None]:
    """The calling thread's GEMM precision on the current GPU is ``precision`` inside the block; the
    previous one is restored after it."""
    previous = _core.cuda_precision()
    if previous == precision:
        yield
        return
    _core.cuda_set_precision(precision)
    try:
        yield
    finally:
        _core.cuda_set_precision(previous)


@dataclasses.dataclass
class LossScaler:
    """Dynamic loss scaling as torch.amp.GradScaler: initial scale 2**16, doubled after 2000 consecutive
    steps with a finite gradient, halved (and the step skipped) at every non-finite one.

    Attributes:
        scale: the factor the loss gradient is multiplied by.
        good_steps: consecutive finite steps since the scale last changed (GradScaler's growth tracker).
        skipped_steps: steps skipped for a non-finite gradient, in total.
    """

    scale: float = INITIAL_SCALE
    good_steps: int = 0
    skipped_steps: int = 0

    def update(self, finite: bool) -> None:
        """Account for one step whose (scaled) gradient was ``finite`` or not."""
        if not finite:
            self.scale *= BACKOFF_FACTOR
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps == GROWTH_INTERVAL:
            self.good_steps = 0
            if self.scale * GROWTH_FACTOR <= _MAX_SCALE:
                self.scale *= GROWTH_FACTOR

    def state(self) -> dict[str, Any]:
        """The state as a JSON-ready mapping (model files keep it beside the updater state)."""
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps}

    @classmethod
    def from_state(cls, state: Any) -> LossScaler:
        """A scaler with the state :meth:`state` returned; ValueError naming the key on a bad one."""
        if not isinstance(state, dict) or set(state) != {"scale", "good_steps", "skipped_steps"}:
            raise ValueError(f"loss scaler: expected keys scale, good_steps, skipped_steps, got {state!r}")
        scale = state["scale"]
        if type(scale) not in (int, float) or not (math.isfinite(scale) and 0 < scale <= _MAX_SCALE):
            raise ValueError(f"loss scaler: scale must be a finite number in (0, 3.4e38], got {scale!r}")
        for key, limit in (("good_steps", GROWTH_INTERVAL), ("skipped_steps", 2**63)):
            value = state[key]
            if type(value) is not int or not 0 <= value < limit:
                raise ValueError(f"loss scaler: {key} must be an integer in [0, {limit}), got {value!r}")
        return cls(float(scale), state["good_steps"], state["skipped_steps"])


__all__ = ["LossScaler", "gemm_precision"]
