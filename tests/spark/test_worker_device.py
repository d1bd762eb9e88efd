"""Worker devices on Spark: the resolution order (option > Spark's GPU > SPARKGRAD_DEVICE > cpu), the
error of a GPU task without CUDA, the device each worker used in the training stats, and Spark's real
GPU assignment on a local-cluster with a fake GPU discovery script."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import mlp_conf, port, subset

import sparkgrad
from prerequisites import require_java
from sparkgrad import cuda
from sparkgrad.errors import TrainingError
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    devices,
)
from sparkgrad.spark.devices import check_worker_device, resolve_worker_device


class _Task:
    """The part of pyspark's TaskContext the resolution reads."""

    def __init__(self, *gpus: str) -> None:
        self._resources = {"gpu": SimpleNamespace(name="gpu", addresses=list(gpus))} if gpus else {}

    def resources(self) -> dict:
        return self._resources


@pytest.fixture
def usable_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GPU ordinal counts as usable (what a CUDA build on a GPU executor reports)."""
    monkeypatch.setattr(devices, "resolve_device", lambda spec: None)


@pytest.mark.parametrize(
    ("option", "gpus", "env", "expected"),
    [
        ("cpu", ("1",), "cuda:0", "cpu"),  # the master's explicit option first
        ("cuda:3", ("1",), "cuda:0", "cuda:3"),
        ("auto", ("1", "2"), "cuda:0", "cuda:1"),  # then the GPU Spark assigned (its first address)
        ("cuda", ("2",), None, "cuda:2"),
        ("auto", (), "cuda:2", "cuda:2"),  # then SPARKGRAD_DEVICE
        ("auto", (), " CUDA ", "cuda:0"),
        ("auto", (), "cpu", "cpu"),
        ("cuda", (), "cpu", "cuda:0"),  # an explicit GPU request is not overridden by the variable
        ("auto", (), None, "cpu"),  # then the CPU
        ("cuda", (), None, "cuda:0"),
    ],
)
def test_resolution_order(usable_gpus, option, gpus, env, expected) -> None:
    environ = {} if env is None else {"SPARKGRAD_DEVICE": env}
    assert resolve_worker_device(option, _Task(*gpus), environ) == expected


def test_assigned_gpu_without_cuda_names_the_executor_and_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "built", lambda: False)
    with pytest.raises(TrainingError) as err:
        resolve_worker_device("auto", _Task("1"), {})
    text = str(err.value)
    assert text.startswith(f"executor {socket.gethostname()}:{os.getpid()} cannot train on cuda:1 ")
    assert "(Spark assigned GPU 1 to the task): device 'cuda:1': sparkgrad was built without CUDA" in text
    assert "SPARKGRAD_ENABLE_CUDA=ON pip install ." in text and "worker_device='cpu'" in text
    assert resolve_worker_device("cpu", _Task("1"), {}) == "cpu"  # the way out the message names


def test_gpu_problems_are_named(monkeypatch) -> None:
    monkeypatch.setattr(cuda, "built", lambda: True)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(TrainingError, match=r"cuda:0 \(SPARKGRAD_DEVICE=cuda\): .*need CuPy"):
        resolve_worker_device("auto", _Task(), {"SPARKGRAD_DEVICE": "cuda"})
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace())
    monkeypatch.setattr(cuda, "devices", lambda: [object()])
    with pytest.raises(TrainingError, match=r"no such GPU, the CUDA runtime sees GPUs 0..0"):
        resolve_worker_device("cuda:1", _Task(), {})


def test_an_explicit_device_needs_no_task_context(usable_gpus, monkeypatch) -> None:
    """worker_device="cuda:N" or "cpu" resolves outside a Spark task, without pyspark (a worker driven
    directly, as tests/distributed/test_mixed_device_fit.py does); "auto" still asks the task."""
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark raises ImportError
    assert resolve_worker_device("cuda:1", environ={}) == "cuda:1"
    assert resolve_worker_device("cpu", environ={}) == "cpu"
    with pytest.raises(ImportError):
        resolve_worker_device("auto", environ={})


def test_malformed_devices_are_rejected(usable_gpus) -> None:
    with pytest.raises(
        ValueError, match=r"worker_device: expected one of auto, cpu, cuda, cuda:N, got 'tpu'"
    ):
        resolve_worker_device("tpu", _Task(), {})
    with pytest.raises(ValueError, match=r"SPARKGRAD_DEVICE: expected one of cpu, cuda, cuda:N, got 'auto'"):
        resolve_worker_device("auto", _Task(), {"SPARKGRAD_DEVICE": "auto"})
    with pytest.raises(ValueError, match=r"GPU address 'GPU-5f1e'.*CUDA device ordinals"):
        resolve_worker_device("auto", _Task("GPU-5f1e"), {})


@pytest.mark.parametrize("cls", [ParameterAveragingTrainingMaster, SharedTrainingMaster])
def test_worker_device_option(cls) -> None:
    master = cls(worker_device=" CUDA:01 ")
    assert master.worker_device == "cuda:1"
    assert cls.from_json(master.to_json()).worker_device == "cuda:1"
    assert cls().worker_device == "auto"
    assert check_worker_device("worker_device", "Auto") == "auto"
    for bad in ("gpu", "cuda:-1", "cuda:", 0, None):
        with pytest.raises(ValueError, match="worker_device: expected one of auto, cpu, cuda, cuda:N"):
            cls(worker_device=bad)


# -- fits on the shared local[2] session --------------------------------------------------------------


@pytest.fixture(scope="module")
def small_rdd(spark, digits):
    rdd = spark.sparkContext.parallelize(subset(digits[0], 256).split(16), 2)
    yield rdd
    rdd.unpersist()


@pytest.mark.parametrize(
    ("master", "init_key"),
    [
        (
            lambda: ParameterAveragingTrainingMaster(batch_size_per_worker=16, collect_training_stats=True),
            "ParameterAveragingWorkerInitTimeMs",
        ),
        (
            lambda: SharedTrainingMaster(
                VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
                batch_size_per_worker=16,
                collect_training_stats=True,
                rdd_training_approach="direct",
            ),
            "SharedWorkerGetInitialModelTimeMs",
        ),
    ],
    ids=["parameter_averaging", "shared"],
)
def test_stats_record_each_workers_device(spark, small_rdd, master, init_key) -> None:
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master())
    sm.fit(small_rdd)
    events = sm.training_stats.events(init_key)
    assert events, "no worker recorded its initialisation"
    assert [e.extra["gpu"] for e in events] == [-1.0] * len(events)  # no GPU here: every worker on the CPU


@pytest.mark.skipif(sparkgrad.cuda_available(), reason="needs an executor whose sparkgrad lacks CUDA")
def test_gpu_worker_without_cuda_fails_the_fit_with_the_fix(spark, small_rdd) -> None:
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, worker_device="cuda")
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    with pytest.raises(
        TrainingError, match=r"cannot train on cuda:0 \(worker_device='cuda'\): .*worker_device='cpu'"
    ):
        sm.fit(small_rdd)


# -- Spark's own GPU scheduling -----------------------------------------------------------------------

_GPU_JOB = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession

    def task(_):
        from pyspark import TaskContext
        from sparkgrad.spark import devices
        ctx = TaskContext.get()
        real = devices.resolve_device
        devices.resolve_device = lambda spec: None  # as on a GPU executor with a CUDA build
        usable = devices.resolve_worker_device("auto")
        devices.resolve_device = real  # this executor's sparkgrad: built without CUDA
        try:
            devices.resolve_worker_device("auto")
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        return [(devices.assigned_gpus(ctx), usable, devices.resolve_worker_device("cpu"), error)]

    script = sys.argv[1]
    builder = SparkSession.builder.master("local-cluster[1,2,1024]").appName("sparkgrad-gpu-resources")
    for key, value in {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": script,
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": script,
        "spark.task.resource.gpu.amount": "1",
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.sparkContext.parallelize(range(2), 2).mapPartitions(task).collect()
    spark.stop()
    print("RESULT " + json.dumps(rows))
    """
)


def test_task_resolves_the_gpu_spark_assigned(tmp_path) -> None:
    require_java()
    discovery = tmp_path / "gpus.sh"
    discovery.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    discovery.chmod(0o755)
    job = tmp_path / "gpu_job.py"
    job.write_text(_GPU_JOB)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(sparkgrad.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    env.pop("SPARKGRAD_DEVICE", None)
    done = subprocess.run(
        [sys.executable, str(job), str(discovery)], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    rows = sorted(json.loads(lines[0][len("RESULT ") :]))
    assert [row[:3] for row in rows] == [[["0"], "cuda:0", "cpu"], [["1"], "cuda:1", "cpu"]]
    for gpus, _, _, error in rows:
        assert error.startswith("TrainingError: executor ")
        assert f"cannot train on cuda:{gpus[0]} (Spark assigned GPU {gpus[0]} to the task)" in error
        assert "sparkgrad was built without CUDA" in error and "worker_device='cpu'" in error
