"""sparkgrad.spark.threads without Spark: the native thread count is set for a block and restored after
it, also when it raises; a task's count is the master's option, else the task's CPUs."""

from __future__ import annotations

import pytest

import sparkgrad
from sparkgrad.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster
from sparkgrad.spark.threads import (
    check_task_threads,
    in_task_threads,
    native_threads,
    task_cpus,
    task_threads,
)


class _Task:
    """What TaskContext.get() returns inside a Spark task, as far as the threads are concerned."""

    def __init__(self, cpus: int) -> None:
        self._cpus = cpus

    def cpus(self) -> int:
        return self._cpus


@pytest.fixture
def in_a_task(monkeypatch):
    """Pretend to run in a Spark task with 3 CPUs."""
    from pyspark import TaskContext

    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: _Task(3)))


def test_native_threads_sets_the_count_for_the_block_and_restores_it() -> None:
    before = sparkgrad.get_num_threads()
    with native_threads(before + 1) as count:
        assert count == sparkgrad.get_num_threads() == before + 1
    assert sparkgrad.get_num_threads() == before


def test_native_threads_restores_the_count_when_the_block_raises() -> None:
    before = sparkgrad.get_num_threads()
    with pytest.raises(RuntimeError, match="kernel failed"), native_threads(before + 2):
        raise RuntimeError("kernel failed")
    assert sparkgrad.get_num_threads() == before


def test_none_leaves_the_count_alone() -> None:
    before = sparkgrad.get_num_threads()
    with native_threads(None) as count:
        assert count is None and sparkgrad.get_num_threads() == before
    with task_threads(None) as count:  # outside a Spark task, without an option: nothing to set
        assert count is None and sparkgrad.get_num_threads() == before


def test_a_task_takes_its_cpus_unless_the_option_says_otherwise(in_a_task) -> None:
    before = sparkgrad.get_num_threads()
    assert (task_cpus(None), task_cpus(5)) == (3, 5)
    with task_threads(None) as count:
        assert count == sparkgrad.get_num_threads() == 3
    with task_threads(2) as count:
        assert count == sparkgrad.get_num_threads() == 2
    assert sparkgrad.get_num_threads() == before


def test_a_partition_function_runs_with_the_task_threads_and_restores_them_when_it_fails(in_a_task) -> None:
    before = sparkgrad.get_num_threads()

    def part(elements):
        for x in elements:
            yield x, sparkgrad.get_num_threads()
        raise ValueError("bad record")

    results = in_task_threads(None, part)([7, 8])
    assert next(results) == (7, 3)
    assert next(results) == (8, 3)
    with pytest.raises(ValueError, match="bad record"):
        next(results)
    assert sparkgrad.get_num_threads() == before


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True])
def test_a_bad_task_threads_option_is_refused(value) -> None:
    with pytest.raises(ValueError, match="task_threads"):
        check_task_threads("task_threads", value)
    for master in (SharedTrainingMaster, ParameterAveragingTrainingMaster):
        with pytest.raises(ValueError, match="task_threads"):
            master(task_threads=value)


def test_task_threads_round_trips_with_the_masters() -> None:
    assert check_task_threads("task_threads", None) is None
    for master in (SharedTrainingMaster(task_threads=4), ParameterAveragingTrainingMaster(task_threads=1)):
        cls = type(master)
        assert cls.from_json(master.to_json()).task_threads == master.task_threads
        assert cls.from_yaml(master.to_yaml()) == master
    assert SharedTrainingMaster().task_threads is None
