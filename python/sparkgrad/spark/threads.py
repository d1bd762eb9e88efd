"""Native threads of the Spark tasks that run sparkgrad's kernels.

Spark runs one task per ``spark.task.cpus`` cores, each in a Python worker process, and OpenMP and
OpenBLAS would start a thread per core in every one of them: on an 8-core executor, 8 tasks of 8 threads
each. Every executor-side entry point (training, evaluation, scoring, inference, the Spark ML models'
``transform``) therefore runs inside :func:`task_threads`, which sets the task's native thread count (the
masters' ``task_threads`` option, else the task's CPUs from Spark) and restores the previous count when
the task's code ends, also when it fails.

OpenMP thread counts belong to a thread (a new thread starts from the process default), the OpenBLAS
count to the process: a task that trains in threads of its own sets the count in each of them
(:func:`native_threads`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sparkgrad import get_num_threads, set_num_threads
from sparkgrad._config import check_int

E = TypeVar("E")  # what a partition function takes: an iterator or iterable of elements
T = TypeVar("T")


def check_task_threads(field: str, value: Any) -> int | None:
    """Validate a ``task_threads`` option: None (the task's CPUs, ``spark.task.cpus``) or an int >= 1."""
    return None if value is None else check_int(field, value, minimum=1)


def task_cpus(option: int | None) -> int | None:
    """The native thread count of the running Spark task.

    Args:
        option: a master's ``task_threads`` (None: the task's CPUs).

    Returns:
        ``option``, else the CPUs Spark gave the running task (``spark.task.cpus``, rounded up), else
        None outside a Spark task.
    """
    if option is not None:
        return option
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else max(1, int(context.cpus()))


@contextmanager
def native_threads(count: int | None) -> Iterator[int | None]:
    """Run the block with ``count`` native threads: OpenMP in this thread, OpenBLAS in this process.

    The previous count is restored when the block ends, also when it raises. None leaves the count
    as it is.

    Args:
        count: threads, at least 1, or None.

    Yields:
        ``count``.
    """
    if count is None:
        yield None
        return
    previous = get_num_threads()
    set_num_threads(count)
    try:
        yield count
    finally:
        set_num_threads(previous)


@contextmanager
def task_threads(option: int | None) -> Iterator[int | None]:
    """Run a Spark task's code with the task's native thread count (:func:`task_cpus` of ``option``),
    restored afterwards (:func:`native_threads`).

    Yields:
        The count set (None outside a Spark task without ``option``: nothing changed).
    """
    with native_threads(task_cpus(option)) as count:
        yield count


def in_task_threads(option: int | None, part: Callable[[E], Iterator[T]]) -> Callable[[E], Iterator[T]]:
    """``part``, a ``mapPartitions`` function, run with the task's native threads (:func:`task_threads`).

    Args:
        option: a master's ``task_threads`` (None: the task's CPUs).
        part: iterator of a partition's elements -> iterator of results.

    Returns:
        The wrapped function.
    """

    def run(elements: E) -> Iterator[T]:
        with task_threads(option):
            yield from part(elements)

    return run


__all__ = ["check_task_threads", "in_task_threads", "native_threads", "task_cpus", "task_threads"]
