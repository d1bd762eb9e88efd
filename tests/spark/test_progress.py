"""The live progress line of a fit, Spark's output during sparkgrad jobs, executor failures, interpreters."""

from __future__ import annotations

import io
import logging
import math
import re
import subprocess
import sys

import pytest
from helpers import mlp_conf, port, subset

import sparkgrad.spark.progress as progress_mod
import sparkgrad.spark.shared as shared_mod
from sparkgrad.errors import TrainingError
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
)
from sparkgrad.spark.common import SHIP_HINT, executor_error, use_driver_interpreter
from sparkgrad.spark.progress import FitProgress, estimate_minibatches

_LINE = re.compile(
    r"epoch (\d+)/(\d+) \| (\d+)/(\d+) minibatches \| loss (\S+) \| ([\d,]+) examples/s"
    r"(?: \| ([\d.]+) (B|kB|MB|GB) on the wire(?: \| density (\S+) \| threshold (\S+))?)?"
)


def _lines(caplog: pytest.LogCaptureFixture) -> list[re.Match]:
    found = [_LINE.search(r.getMessage()) for r in caplog.records if r.name == progress_mod.__name__]
    return [m for m in found if m is not None]


@pytest.fixture
def every_refresh_logs(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(progress_mod, "LOG_INTERVAL_S", 0.0)
    monkeypatch.setattr(shared_mod, "PROGRESS_REPORT_INTERVAL_S", 0.05)  # read when the job is built
    caplog.set_level(logging.INFO, logger=progress_mod.__name__)


def test_shared_fit_shows_live_progress(spark, digits, every_refresh_logs, caplog) -> None:
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=8,
        rdd_data_set_num_examples=8,  # declared: the first epoch's total is exact too
        debug_longer_iterations=20,  # slow steps: the driver sees the epoch while it runs
        rng_seed=1,
    )
    rdd = spark.sparkContext.parallelize(subset(digits[0], 320).split(8), 2)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as sm:
        sm.fit(rdd, epochs=2)
    lines = _lines(caplog)
    assert lines, "no progress line was logged"
    epochs = {int(m.group(1)) for m in lines}
    assert epochs == {1, 2} and all(m.group(2) == "2" for m in lines)
    # 320 examples over 2 partitions in minibatches of 8: 40 per epoch
    assert {int(m.group(4)) for m in lines} == {40}
    # some line was drawn in the middle of an epoch, fed by the controller while the job ran
    assert any(0 < int(m.group(3)) < 40 for m in lines)
    last = lines[-1]
    assert int(last.group(3)) <= 40
    loss = float(last.group(5))
    assert math.isfinite(loss) and 0 < loss < 10
    assert float(last.group(7)) > 0  # bytes on the wire
    density, threshold = float(last.group(9)), float(last.group(10))
    assert 0 < density <= 1 and 0 < threshold < 1


@pytest.mark.parametrize("jobs", ["one", "per_round"])
def test_parameter_averaging_fit_shows_progress_per_round(
    spark, digits, every_refresh_logs, caplog, jobs
) -> None:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16, averaging_frequency=2, num_workers=2, rng_seed=0, averaging_jobs=jobs
    )
    rdd = spark.sparkContext.parallelize(subset(digits[0], 256).split(16), 2)
    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as sm:
        sm.fit(rdd, epochs=2)
        final_score = sm.score()
    lines = _lines(caplog)
    assert {int(m.group(1)) for m in lines} == {1, 2}
    assert all(m.group(9) is None for m in lines)  # no update density or threshold for averaging
    if jobs == "one":  # averaging over the transport: its bytes
        assert all(m.group(7) is not None for m in lines) and float(lines[-1].group(7)) > 0
    else:
        assert all(m.group(7) is None for m in lines)
    # every example once per epoch: 256 / 16 = 16 minibatches, reported when the epoch ends
    assert int(lines[-1].group(3)) == 16
    assert float(lines[-1].group(5)) == pytest.approx(final_score, rel=1e-3)


def test_progress_false_shows_nothing(spark, digits, caplog, monkeypatch) -> None:
    monkeypatch.setattr(progress_mod, "LOG_INTERVAL_S", 0.0)
    caplog.set_level(logging.INFO, logger=progress_mod.__name__)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, progress=False)
    rdd = spark.sparkContext.parallelize(subset(digits[0], 64).split(16), 2)
    with SparkMultiLayer(spark, mlp_conf(hidden=8), master) as sm:
        sm.fit(rdd)
    assert _lines(caplog) == []
    with pytest.raises(ValueError, match="progress: expected a bool"):
        ParameterAveragingTrainingMaster(progress="no")


def test_epoch_figures_leave_out_what_is_unknown() -> None:
    p = FitProgress(1, 0, 4, 8, enabled=False)  # parameter averaging: no traffic; no loss reported yet
    p.minibatches(2)
    assert set(p.end_epoch(0)) == {"examples_per_second"}


def test_progress_line_values() -> None:
    seen = []
    p = FitProgress(
        3, 5, 10, 32, enabled=False, traffic=lambda: 2_500_000.0, on_epoch=lambda e, f: seen.append((e, f))
    )
    p.update(0.002, 0.01, "a", 5)
    p.update(0.004, 0.02, "a", 5)
    p.update(0.5, 0.5, "b", 4)  # a stale epoch: ignored
    p.loss(0.5, "a")
    p.loss(1.5, "b")
    p.loss(math.nan, "c")  # ignored
    m = _LINE.search(p.describe())
    assert m is not None
    assert (m.group(1), m.group(2), m.group(3), m.group(4)) == ("1", "3", "2", "10")
    assert float(m.group(5)) == 1.0
    assert (m.group(7), m.group(8)) == ("2.5", "MB")
    assert float(m.group(9)) == pytest.approx(0.002 * 0.95 + 0.004 * 0.05)
    assert float(m.group(10)) == 0.02
    p.trained("b", 5, 1)  # b trained one minibatch whose update encoded nothing
    p.trained("a", 5, 1)  # a's count is behind its applied updates: the larger one counts
    assert p.done == 3
    figures = p.end_epoch(5)
    assert seen == [(5, figures)]  # the epoch's figures, for experiment tracking
    assert set(figures) == {"loss", "examples_per_second", "bytes_on_wire", "update_density", "threshold"}
    assert (figures["loss"], figures["bytes_on_wire"], figures["threshold"]) == (1.0, 2_500_000.0, 0.02)
    assert figures["update_density"] == pytest.approx(0.002 * 0.95 + 0.004 * 0.05)
    assert figures["examples_per_second"] > 0  # 3 minibatches of 32 over the epoch's wall time
    # the next epoch expects what this one trained (3), not the estimate (10)
    assert _LINE.search(p.describe()).group(1, 3, 4) == ("2", "0", "3")


@pytest.mark.parametrize(
    ("examples", "partitions", "batch", "expected"),
    [(320, 2, 8, 40), (10, 3, 4, 3), (100, 1, 32, 4), (5, 8, 2, 5), (0, 2, 4, 0)],
)
def test_estimate_minibatches(examples: int, partitions: int, batch: int, expected: int) -> None:
    sizes = [examples // partitions + (i < examples % partitions) for i in range(partitions)]
    assert estimate_minibatches(examples, partitions, batch) == expected
    if examples >= partitions:
        assert expected == sum(-(-n // batch) for n in sizes)


class ExplodingLoader:
    def __call__(self, path: str):
        raise ValueError(f"cannot parse {path}: bad header")


def test_executor_failure_is_one_training_error(spark, digits, tmp_path) -> None:
    from sparkgrad.data import DataSet

    paths = []
    for i, ds in enumerate(subset(digits[0], 32).split(16)):
        paths.append(str(tmp_path / f"b{i}.bin"))
        DataSet(ds.features, ds.labels).save(paths[-1])
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, progress=False)
    with SparkMultiLayer(spark, mlp_conf(hidden=8), master) as sm:
        rdd = spark.sparkContext.parallelize(paths[1:], 1)
        # the driver checks the first path itself, with a loader that works there
        loader = ExplodingLoader()
        with pytest.raises(TrainingError) as info:
            sm.fit_paths(rdd, loader=_FirstOk(loader, paths[1]))
    text = str(info.value)
    assert text.splitlines()[0] == f"ValueError: cannot parse {paths[1]}: bad header"
    assert "at org.apache" not in text and "Py4J" not in text
    assert "test_progress.py" in text  # the executor's own frames, PySpark's dropped
    assert "pyspark" not in text
    assert info.value.__cause__ is None and info.value.__suppress_context__ is False
    assert info.value.__context__ is None


class _FirstOk:
    """Loads ``first`` normally on the driver's check, and explodes on the executors."""

    def __init__(self, loader, first: str) -> None:
        self.loader, self.first, self.on_driver = loader, first, True

    def __call__(self, path: str):
        from sparkgrad.data import SerializedDataSetLoader

        if self.on_driver:
            self.on_driver = False  # the copy shipped to the executors is pickled after this call
            return SerializedDataSetLoader()(path)
        return self.loader(path)


def test_missing_module_on_an_executor_says_how_to_ship() -> None:
    text = (
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        '  File "/x/pyspark/serializers.py", line 1, in loads\n'
        "ModuleNotFoundError: No module named 'sparkgrad'\n\tat org.apache.spark.api.python.X(X.scala:1)"
    )
    error = executor_error("training", text)
    first, second = str(error).splitlines()[:2]
    assert first == "ModuleNotFoundError: No module named 'sparkgrad' on an executor"
    assert second.endswith(SHIP_HINT) and "--archives" in second


def test_executor_python_without_the_packages_says_how_to_ship(spark, digits, tmp_path, monkeypatch) -> None:
    # a bare virtualenv of the same Python version: PySpark runs in it, numpy and pyzmq are missing
    bare = tmp_path / "bare"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    # The workers inherit a PYTHONPATH naming the driver's site-packages when sparkgrad is installed (see
    # conftest.py), which would lend the bare interpreter every package: it runs without those entries
    # (pyspark's own zips stay).
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'PYTHONPATH=$(printf %s "$PYTHONPATH" | tr : "\\n" | grep -v "site-packages/*$" | paste -sd: -)\n'
        f'export PYTHONPATH\nexec "{bare / "bin" / "python"}" "$@"\n'
    )
    python.chmod(0o755)
    sc = spark.sparkContext
    monkeypatch.setattr(sc, "pythonExec", str(python))
    monkeypatch.setenv("PYSPARK_PYTHON", str(python))  # the user's choice: kept
    rdd = sc.parallelize(subset(digits[0], 32).split(16), 2)
    with pytest.raises(TrainingError) as info:
        SparkMultiLayer(spark, mlp_conf(hidden=8), ParameterAveragingTrainingMaster(progress=False)).fit(rdd)
    first, second = str(info.value).splitlines()[:2]
    assert re.fullmatch(r"ModuleNotFoundError: No module named '\w+' on an executor", first), first
    assert second.endswith(SHIP_HINT)


def test_local_master_uses_the_driver_interpreter(spark, monkeypatch) -> None:
    sc = spark.sparkContext
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(sc, "pythonExec", "python3")
    use_driver_interpreter(sc)
    assert sc.pythonExec == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/custom/python")
    monkeypatch.setattr(sc, "pythonExec", "/opt/custom/python")
    use_driver_interpreter(sc)  # the user's choice is kept
    assert sc.pythonExec == "/opt/custom/python"


def test_spark_logs_warn_and_above_during_sparkgrad_jobs(spark) -> None:
    from sparkgrad.spark.common import run_spark

    manager = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager

    def level(name: str) -> str:
        return manager.getLogger(name).getLevel().toString()

    spark.sparkContext.setLogLevel("INFO")
    try:
        assert run_spark("probe", lambda: level("org.apache.spark.scheduler.DAGScheduler")) == "WARN"
        assert run_spark("probe", lambda: level("org.apache.spark.scheduler.TaskSetManager")) == "FATAL"
        assert level("org.apache.spark.scheduler.DAGScheduler") == "INFO"  # restored afterwards
    finally:
        spark.sparkContext.setLogLevel("ERROR")
    # the loggers inherit again: a later setLogLevel reaches them, and no configuration of sparkgrad's is
    # left behind (Spark's console threshold would let a logger with its own configuration through)
    assert level("org.apache.spark.scheduler.TaskSetManager") == "ERROR"
    config = manager.getContext(False).getConfiguration()
    for name in ("org.apache.spark", "org.apache.spark.scheduler.TaskSetManager"):
        assert config.getLoggerConfig(name).getName() != name


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_one_tqdm_line() -> None:
    pytest.importorskip("tqdm")
    screen = _Terminal()
    p = FitProgress(2, 0, 4, 8, stream=screen, traffic=lambda: 1500.0)
    p.update(0.01, 0.02, "w", 0)
    p.loss(0.25, "w")
    p.refresh()
    p.end_epoch(0)
    p.close()
    text = screen.getvalue()
    assert "\n" not in text.rstrip("\n")  # one line, redrawn in place with carriage returns
    frames = [f for f in text.rstrip("\n").split("\r") if f]
    ended = [f for f in frames if f.startswith("epoch 1/2") and "| 1/4 [" in f]  # estimate: 4
    assert ended and "loss 0.25" in ended[-1] and "1.5 kB on the wire" in ended[-1]
    assert "density 1.00e-02" in ended[-1] and "threshold 2.00e-02" in ended[-1]
    assert frames[-1].startswith("epoch 2/2") and "| 0/1 [" in frames[-1]  # the next epoch expects 1


def _fail_partition_1_and_let_0_run(rows):
    import time

    from pyspark import BarrierTaskContext

    if BarrierTaskContext.get().partitionId() == 1:
        raise ValueError("task 1 failed")
    time.sleep(3)
    return rows


def test_a_failed_action_returns_once_its_other_tasks_have_ended(spark) -> None:
    # Spark fails a barrier job at its first failed task and kills the others after that; callers release
    # the job's broadcasts when run_spark returns, and a killed task that still held one logged Spark's
    # internal error with a Java trace ("Block broadcast_N does not exist")
    from sparkgrad.spark.common import run_spark

    sc = spark.sparkContext
    job = sc.parallelize(range(2), 2).barrier().mapPartitions(_fail_partition_1_and_let_0_run)
    tracker = sc.statusTracker()
    known = set(tracker.getJobIdsForGroup())  # jobs outside any group: the fixture's and earlier tests'
    with pytest.raises(TrainingError, match="ValueError: task 1 failed"):
        run_spark("probe", job.collect)
    assert sc.getLocalProperty("spark.jobGroup.id") is None  # its own job group was the action's only
    assert set(tracker.getJobIdsForGroup()) == known  # the job ran in that group
    sc.setJobGroup("sparkgrad-test-failed-action", "the caller's own group")
    try:
        with pytest.raises(TrainingError, match="ValueError: task 1 failed"):
            run_spark("probe", job.collect)
        assert sc.getLocalProperty("spark.jobGroup.id") == "sparkgrad-test-failed-action"
        (failed,) = tracker.getJobIdsForGroup("sparkgrad-test-failed-action")
        stages = tracker.getJobInfo(failed).stageIds
        assert stages and all(tracker.getStageInfo(stage).numActiveTasks == 0 for stage in stages)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
