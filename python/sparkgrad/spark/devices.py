"""Which device a Spark training worker trains on: CPU driver, CPU or GPU workers.

Resolution, first match wins (:func:`resolve_worker_device`, run inside the task on the executor):

1. the training master's ``worker_device`` when it is explicit: ``"cpu"``, or ``"cuda:N"``;
2. the GPU Spark assigned to the task (``TaskContext.get().resources()["gpu"].addresses``, scheduled
   with ``spark.executor.resource.gpu.amount`` and ``spark.task.resource.gpu.amount``): its first
   address, a CUDA device ordinal as the executor sees it;
3. the executor's ``SPARKGRAD_DEVICE`` environment variable (``"cpu"``, ``"cuda"``, ``"cuda:N"``; set it
   with ``spark.executorEnv.SPARKGRAD_DEVICE``);
4. ``"cpu"`` for ``worker_device="auto"``; ``"cuda:0"`` for ``worker_device="cuda"``.

A worker that resolves to a GPU its sparkgrad cannot use (built without CUDA, no CuPy, ordinal not
visible) fails its task with a :class:`~sparkgrad.errors.TrainingError` naming the executor and the fix,
rather than training on the CPU while Spark holds a GPU for it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from sparkgrad.device import is_gpu_array, resolve_device
from sparkgrad.errors import TrainingError

DEVICE_ENV = "SPARKGRAD_DEVICE"
WORKER_DEVICES = ("auto", "cpu", "cuda", "cuda:N")
_CUDA_N = re.compile(r"cuda:(\d+)")


def check_worker_device(field: str, value: Any, allow_auto: bool = True) -> str:
    """A validated device option: ``"auto"`` (if allowed), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Args:
        field: the option's name, for the error message.
        value: the user's value (case and surrounding blanks are ignored).
        allow_auto: whether ``"auto"`` is accepted.

    Returns:
        The normalised spelling (``"cuda:01"`` becomes ``"cuda:1"``).
    """
    allowed = WORKER_DEVICES if allow_auto else WORKER_DEVICES[1:]
    text = value.strip().lower() if isinstance(value, str) else None
    if text in ("cpu", "cuda") or (text == "auto" and allow_auto):
        return text
    match = _CUDA_N.fullmatch(text or "")
    if match is None:
        raise ValueError(f"{field}: expected one of {', '.join(allowed)}, got {value!r}")
    return f"cuda:{int(match.group(1))}"


def assigned_gpus(task_context: Any) -> list[str]:
    """The GPU addresses Spark assigned to a task (empty without a task or a GPU resource).

    Args:
        task_context: ``pyspark.TaskContext.get()`` (None outside a task).
    """
    if task_context is None:
        return []
    gpu = task_context.resources().get("gpu")
    return list(gpu.addresses) if gpu is not None else []


def device_index(device: str) -> int:
    """The GPU ordinal of a resolved device, -1 for ``"cpu"`` (how training stats record it)."""
    return -1 if device == "cpu" else int(device.split(":", 1)[1])


def to_host(arr: Any) -> np.ndarray:
    """A host numpy copy of a numpy or GPU array (what a worker sends to the driver)."""
    if is_gpu_array(arr):
        import cupy

        return cupy.asnumpy(arr)
    return np.array(arr, copy=True)


def resolve_worker_device(
    option: str = "auto", task_context: Any = None, environ: Mapping[str, str] | None = None
) -> str:
    """The device this task's worker trains on, in the order of the module docstring.

    Args:
        option: the training master's ``worker_device``: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        task_context: the running task's ``TaskContext`` (default: ``pyspark.TaskContext.get()``).
        environ: the environment to read ``SPARKGRAD_DEVICE`` from (default ``os.environ``).

    Returns:
        ``"cpu"`` or ``"cuda:N"``.

    Raises:
        TrainingError: the device is a GPU this executor's sparkgrad cannot use.
        ValueError: ``option``, ``SPARKGRAD_DEVICE`` or a GPU address Spark assigned is malformed.
    """
    option = check_worker_device("worker_device", option)
    if option == "cpu":
        return "cpu"
    if option != "cuda" and option != "auto":  # an explicit cuda:N needs no task context (nor pyspark)
        return _usable(option, f"worker_device={option!r}")
    if task_context is None:
        from pyspark import TaskContext

        task_context = TaskContext.get()
    gpus = assigned_gpus(task_context)
    if gpus:
        address = gpus[0]
        if not address.isdigit():
            raise ValueError(
                f"Spark assigned GPU address {address!r}: sparkgrad needs CUDA device ordinals (0, 1, ...) "
                "from the GPU discovery script"
            )
        return _usable(f"cuda:{int(address)}", f"Spark assigned GPU {address} to the task")
    env = (os.environ if environ is None else environ).get(DEVICE_ENV)
    if env:
        device = check_worker_device(DEVICE_ENV, env, allow_auto=False)
        if device == "cpu" and option == "auto":
            return "cpu"
        if device != "cpu":
            device = "cuda:0" if device == "cuda" else device
            return _usable(device, f"{DEVICE_ENV}={env}")
    if option == "auto":
        return "cpu"
    return _usable("cuda:0", "worker_device='cuda'")


def _usable(device: str, source: str) -> str:
    """``device`` if this process can train on it, else a TrainingError naming the executor and the fix."""
    try:
        resolve_device(device)
    except RuntimeError as exc:  # no CUDA build, no CuPy or no such GPU: the message says which
        from sparkgrad.spark.common import process_tag

        raise TrainingError(
            f"executor {process_tag()} cannot train on {device} ({source}): {exc}; or set "
            "worker_device='cpu' on the training master"
        ) from exc
    return device


__all__ = [
    "DEVICE_ENV",
    "WORKER_DEVICES",
    "assigned_gpus",
    "check_worker_device",
    "device_index",
    "resolve_worker_device",
    "to_host",
]
