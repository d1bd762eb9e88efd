"""One SharedTrainingMaster fit across a GPU host and a CPU host of a real 2-worker standalone cluster.

Only the first worker host's Worker daemon runs with ``SPARKGRAD_DEVICE=cuda:0`` (conftest's ``cluster``
fixture passes this module's ``CLUSTER_WORKER_ENV`` to the harness), as ``spark-env.sh`` on one GPU host
of a real cluster would set it: its executor's Python workers inherit it, the other host's do not. With
the default ``worker_device="auto"`` the first host's worker then trains on GPU 0 and the second on the
CPU, both in one fit, exchanging the same wire format. On a machine without a usable GPU the first host's
worker must refuse instead, naming that host, where cuda:0 came from and the fix.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable

import numpy as np
import pytest
from helpers import accuracy, mlp_conf

import cluster as harness  # bench/cluster/cluster.py, on sys.path through conftest.py
import sparkgrad
from prerequisites import require_gpu
from sparkgrad.compress import FixedThresholdAlgorithm
from sparkgrad.errors import TrainingError
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import SparkMultiLayer

GPU_HOST = 0  # index into cluster.hosts: namespace sgc-w1
CLUSTER_WORKER_ENV = {GPU_HOST: {"SPARKGRAD_DEVICE": "cuda:0"}}  # read by conftest's `cluster` fixture
WORKERS = 2
FAILING_FIT_EXAMPLES = 64  # 2 minibatches per worker: the GPU host's fails before its first
ACCURACY = 0.95  # tests/spark/test_worker_device_cuda.py's bar for GPU workers
# On this cluster 2 CPU workers with test_cluster_training's Adam(3e-3) passed 0.95 in epochs 9-12 of 12
# (3 runs): up to 20, stopping at the first epoch that reaches it.
GPU_EPOCHS = 20
# Spark's default log4j layout: "yy/MM/dd HH:mm:ss LEVEL logger: message", a trace's lines follow untimed
_TASK_EXCEPTION = re.compile(
    r"^\S+ \S+ ERROR Executor: Exception in task [^\n]*\n((?:(?!\d\d/\d\d/\d\d \d\d:)[^\n]*\n)*)", re.M
)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _task_exceptions(log: str) -> list[str]:
    """The exceptions an executor's log reports for its failed tasks (``ERROR Executor: Exception in task
    ...`` and the trace below it, up to the next timestamped line)."""
    return _TASK_EXCEPTION.findall(log)


def test_only_the_gpu_host_resolves_cuda_and_fails_without_a_gpu(
    cluster_spark, cluster, shared_master, digits
) -> None:
    if sparkgrad.cuda_available():
        pytest.skip("this sparkgrad can train on a GPU: test_gpu_and_cpu_workers_share_one_fit runs instead")
    gpu_host, cpu_host = cluster.hosts[GPU_HOST], cluster.hosts[1 - GPU_HOST]
    rdd = cluster_spark.sparkContext.parallelize(digits[0].split(1)[:FAILING_FIT_EXAMPLES], WORKERS)
    # a threshold below Adam(1e-2)'s first steps, so every minibatch sends and an epoch that finished has
    # moved the parameters (the default starts at 2e-2: two minibatches of a worker may send nothing)
    sm = SparkMultiLayer(
        cluster_spark, mlp_conf(), shared_master(threshold_algorithm=FixedThresholdAlgorithm(1e-3))
    )
    before = sm.network.params().copy()
    try:
        with pytest.raises(TrainingError) as failure:
            sm.fit(rdd)
    finally:
        rdd.unpersist()
    message = str(failure.value)
    first = message.splitlines()[0]
    # the executor's own exception, naming the executor (host:pid) and where cuda:0 came from
    named = re.match(
        r"(?:sparkgrad\.errors\.)?TrainingError: executor (\S+:\d+) cannot train on cuda:0 ", first
    )
    assert named is not None and "(SPARKGRAD_DEVICE=cuda:0)" in first, message
    # why (sparkgrad.device: no CUDA build, no CuPy, or no GPU)
    assert any(why in first for why in ("built without CUDA", "need CuPy", "no such GPU")), message
    assert "worker_device='cpu'" in first, message  # the fix
    # One hostname serves every namespace here (no UTS namespaces): the executor logs say which host's
    # executor raised exactly this exception (host:pid). No task on the CPU host failed to get a device:
    # its tasks were killed (or failed otherwise) when the barrier stage failed; a kill reason quotes the
    # error, but it is not a task exception of that executor.
    tag = f"executor {named.group(1)} cannot train on cuda:0"
    assert _wait_for(
        lambda: any(tag in e for e in _task_exceptions(harness.executor_log(cluster, gpu_host)))
    ), (
        tag,
        harness.executor_log(cluster, gpu_host)[-3000:],
    )
    cpu_failures = _task_exceptions(harness.executor_log(cluster, cpu_host))
    assert not [e for e in cpu_failures if "cannot train on" in e], cpu_failures
    # The driver's network holds the epochs every partition finished, and nothing else. Spark re-runs the
    # failed barrier stage and may place the partitions on the other hosts, so across attempts the CPU host
    # may train both partitions of an epoch; an epoch whose partitions did not all report stays out
    # (a re-run worker reporting a partition again counts once).
    params = sm.network.params()
    if sm.network.epoch_count == 0:
        np.testing.assert_array_equal(params, before)
        assert sm.network.iteration_count == 0
    else:
        assert np.isfinite(params).all() and not np.array_equal(params, before)
        assert sm.network.iteration_count > 0


@pytest.mark.cuda
def test_gpu_and_cpu_workers_share_one_fit(cluster_spark, shared_master, digits) -> None:
    require_gpu()
    rdd = cluster_spark.sparkContext.parallelize(digits[0].split(1), WORKERS)
    # test_cluster_training's configuration: Adam(3e-3) climbs steadily with 2 asynchronous workers
    sm = SparkMultiLayer(cluster_spark, dataclasses.replace(mlp_conf(), updater=Adam(3e-3)), shared_master())
    accuracies: list[float] = []

    def until_accurate(epoch, network) -> bool:
        accuracies.append(accuracy(network, digits[1]))
        return accuracies[-1] >= ACCURACY  # stop after the first epoch at the bar

    try:
        sm.fit(rdd, epochs=GPU_EPOCHS, epoch_callback=until_accurate)
    finally:
        rdd.unpersist()
    assert accuracies[-1] >= ACCURACY, accuracies
    # one worker trained on GPU 0 (the host with SPARKGRAD_DEVICE=cuda:0), the other on the CPU (-1)
    init = sm.training_stats.events("SharedWorkerGetInitialModelTimeMs")
    assert sorted(e.extra["gpu"] for e in init) == [-1, 0], [(e.machine, e.process, e.extra) for e in init]
    # both trained every epoch's partitions and exchanged updates over the one wire format
    compute = sm.training_stats.events("SharedWorkerComputeUpdateTimesMs")
    assert sum(e.extra["examples"] for e in compute) == len(accuracies) * digits[0].num_examples()
    assert len({(e.machine, e.process) for e in compute}) == WORKERS
    traffic = sm.training_master.last_traffic
    assert traffic["workers"] == WORKERS and traffic["controller_frames_rejected"] == 0, traffic
    assert traffic["updates_applied"] >= 1, traffic
    assert sm.network.epoch_count == len(accuracies)
    assert isinstance(sm.network.params(), np.ndarray)  # the driver's network stays on the CPU
