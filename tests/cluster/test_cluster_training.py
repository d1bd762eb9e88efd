"""Both training masters and distributed evaluation on a real 2-worker Spark standalone cluster.

The driver runs in the root namespace on the bridge address; each executor runs in its own network
namespace, so every task, broadcast and gradient-sharing frame crosses a shaped veth link.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal

import numpy as np
import pytest
from helpers import accuracy, ambiguous_argmax, dense_logit_error_bound, mlp_conf

import cluster as harness  # bench/cluster/cluster.py, on sys.path through conftest.py
from sparkgrad.nn import MultiLayerConfiguration
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SparkMultiLayer,
    progress,
)

EPOCHS = 5
SHARED_EPOCHS = 10  # asynchronous runs differ by 1-3% from epoch to epoch: judge the best of the last 4
BATCH = 16
WORKERS = 2
FAULT_EPOCHS = 20  # long enough for both runs of a fault test to spend 8 epochs on their plateau


def conf() -> MultiLayerConfiguration:
    """tests/spark's MLP with a smaller step: with 2 asynchronous workers Adam(1e-2) makes the test accuracy
    swing by a few percent from epoch to epoch, Adam(3e-3) climbs steadily past 0.92 within 5 epochs."""
    return dataclasses.replace(mlp_conf(), updater=Adam(3e-3))


@pytest.fixture(scope="module")
def train_rdd(cluster_spark, digits):
    rdd = cluster_spark.sparkContext.parallelize(digits[0].split(1), 2)
    yield rdd
    rdd.unpersist()


@pytest.fixture(scope="module")
def shared_model(cluster_spark, shared_master, train_rdd, digits):
    """A SharedTrainingMaster fit whose controller address comes from the bridge's network mask, with the
    test accuracy after every epoch (``sm.accuracies``)."""
    sm = SparkMultiLayer(cluster_spark, conf(), shared_master())
    sm.accuracies = []
    sm.fit(
        train_rdd,
        epochs=SHARED_EPOCHS,
        epoch_callback=lambda e, net: sm.accuracies.append(accuracy(net, digits[1])),
    )
    return sm


def test_executors_run_in_the_worker_namespaces(cluster_spark, cluster) -> None:
    infos = cluster_spark.sparkContext.statusTracker()._jtracker.getExecutorInfos()
    hosts = sorted(str(info.host()) for info in infos)
    # the driver (on the bridge address) and one executor per worker namespace
    assert hosts == sorted([cluster.driver_host] + [h.address for h in cluster.hosts])


def test_shared_training_master_trains_on_the_cluster(shared_model, digits) -> None:
    master = shared_model.training_master
    traffic = master.last_traffic
    assert max(shared_model.accuracies[-4:]) >= 0.9, shared_model.accuracies
    assert traffic["workers"] == 2  # both executors joined the controller across the bridge
    assert traffic["controller_frames_rejected"] == 0
    assert traffic["updates_applied"] >= 1 and traffic["worker_bytes_sent"] > 0
    compute = shared_model.training_stats.events("SharedWorkerComputeUpdateTimesMs")
    assert sum(e.extra["examples"] for e in compute) == SHARED_EPOCHS * digits[0].num_examples()
    assert shared_model.network.epoch_count == SHARED_EPOCHS


def test_parameter_averaging_trains_on_the_cluster(cluster_spark, digits, train_rdd) -> None:
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=BATCH, averaging_frequency=10, rng_seed=1, collect_training_stats=True
    )
    sm = SparkMultiLayer(cluster_spark, conf(), master)
    sm.fit(train_rdd, epochs=EPOCHS)
    assert accuracy(sm.network, digits[1]) >= 0.9
    fits = sm.training_stats.events("ParameterAveragingWorkerFitTimesMs")
    assert sum(e.extra["examples"] for e in fits) == EPOCHS * digits[0].num_examples()
    assert len({(e.machine, e.process) for e in fits}) >= 2  # both executors trained
    assert np.isfinite(sm.score()) and sm.network.epoch_count == EPOCHS


def test_distributed_evaluation_equals_local(shared_model, cluster_spark, digits) -> None:
    test = digits[1]
    net = shared_model.network
    test_rdd = cluster_spark.sparkContext.parallelize(test.split(7), 2)
    dist = shared_model.evaluate(test_rdd)
    local = net.evaluate(test)
    # other batch shapes than the local pass: only examples whose argmax float32 rounding may flip can differ
    z, z_err = dense_logit_error_bound(net, test.features)
    flippable = int(ambiguous_argmax(z, z_err).sum())
    assert dist.confusion_matrix().sum() == local.confusion_matrix().sum() == test.num_examples()
    assert np.abs(dist.confusion_matrix() - local.confusion_matrix()).sum() <= 2 * flippable
    assert abs(dist.accuracy() - local.accuracy()) <= flippable / test.num_examples()


# -- faults: one executor JVM killed by PID mid-fit (these run last: they cost the cluster an executor) ----


def test_shared_fit_survives_a_killed_executor(
    cluster_spark, cluster, shared_master, train_rdd, digits, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[int] = []
    kill_in_epoch, kill_after_updates = 2, 10  # mid-epoch: about 90 minibatches make an epoch here
    counted = {"updates": 0, "armed": False}
    update = progress.FitProgress.update

    def update_and_maybe_kill(self, density, threshold, source, epoch) -> None:
        """On the controller's thread, as it applies updates: kill one executor JVM part-way through
        the epoch, while both workers train (not at the epoch barrier)."""
        update(self, density, threshold, source, epoch)
        if counted["armed"] and epoch == kill_in_epoch and not killed:
            counted["updates"] += 1
            if counted["updates"] == kill_after_updates:
                pid = harness.executor_pids(cluster.hosts[1])[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    monkeypatch.setattr(progress.FitProgress, "update", update_and_maybe_kill)

    def fit(kill: bool) -> tuple[SparkMultiLayer, list[float]]:
        accuracies: list[float] = []
        counted["armed"] = kill

        def callback(epoch, network) -> None:
            accuracies.append(accuracy(network, digits[1]))

        sm = SparkMultiLayer(cluster_spark, conf(), shared_master())
        sm.fit(train_rdd, epochs=FAULT_EPOCHS, epoch_callback=callback)
        return sm, accuracies

    clean, clean_curve = fit(kill=False)
    faulty, faulty_curve = fit(kill=True)
    traffic = faulty.training_master.last_traffic
    assert killed and faulty.network.epoch_count == FAULT_EPOCHS and len(faulty_curve) == FAULT_EPOCHS
    # Asynchronous runs differ by 1-3% from epoch to epoch (bench/cluster/bench_staleness.py: at most
    # 0.033 below an earlier epoch with the default staleness bound), so compare the best accuracy of the
    # last 8 epochs. Two healthy runs differed by 0.011 there (0.961 against 0.972), more than the 1%
    # this test once allowed: the margin is 3 standard errors of the difference of two accuracies on
    # these n test digits, 3 sqrt(2 p (1 - p) / n), about 0.038 at p = 0.97 and n = 359.
    plateau = slice(-8, None)
    faulty_best, clean_best = max(faulty_curve[plateau]), max(clean_curve[plateau])
    margin = 3 * math.sqrt(2 * clean_best * (1 - clean_best) / digits[1].num_examples())
    assert faulty_best >= clean_best - margin, (faulty_curve, clean_curve, traffic)
    # the killed worker's updates stay in the model and are counted; the re-run stage's workers joined
    # and trained the killed epoch's partitions again, which is counted too
    assert traffic["workers_lost"] >= 1 and traffic["updates_from_lost_workers"] >= 1
    assert traffic["workers"] >= 3 and traffic["retrained_minibatches"] >= 1, traffic
    harness.wait_for_executors(cluster_spark, WORKERS)  # the worker started a new executor


def test_parameter_averaging_fit_survives_a_killed_executor(
    cluster_spark, digits, train_rdd, tmp_path
) -> None:
    class KillOwnExecutorOnce:  # defined here: it travels to the executors by value (cloudpickle)
        """SIGKILLs the executor JVM running the first task whose network reaches ``at_update``."""

        def __init__(self, marker: str, at_update: int = 3) -> None:
            self.marker, self.at_update = marker, at_update

        def pre_update(self, dataset, network) -> None:
            if network.iteration_count < self.at_update:
                return
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))  # the first task here kills
            except FileExistsError:
                return
            pid = os.getpid()  # Python worker -> pyspark daemon -> executor JVM
            while pid > 1:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"CoarseGrainedExecutorBackend" in f.read():
                        os.kill(pid, signal.SIGKILL)
                        return
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])

        def post_update(self, dataset, network) -> None:
            pass

    def fit(hooks) -> SparkMultiLayer:
        # DL4J's job per round re-runs a lost task for its round; in one job a lost task fails the fit
        master = ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH,
            averaging_frequency=10,
            rng_seed=1,
            training_hooks=hooks,
            averaging_jobs="per_round",
        )
        sm = SparkMultiLayer(cluster_spark, conf(), master)
        sm.fit(train_rdd, epochs=FAULT_EPOCHS)
        return sm

    clean = fit(())
    marker = str(tmp_path / "killed")
    faulty = fit((KillOwnExecutorOnce(marker),))
    assert os.path.exists(marker) and faulty.network.epoch_count == FAULT_EPOCHS
    # the lost task is re-run from the same broadcast parameters on a live executor, and counted; averaging
    # sums in partition order (float64) whichever task ends first, so the fits agree exactly
    np.testing.assert_array_equal(faulty.network.params(), clean.network.params())
    np.testing.assert_array_equal(faulty.network.updater_state(), clean.network.updater_state())
    assert clean.training_master.last_retries == {"retried_tasks": 0, "retrained_minibatches": 0}
    retries = faulty.training_master.last_retries
    assert retries["retried_tasks"] >= 1 and retries["retrained_minibatches"] >= 1, retries
    harness.wait_for_executors(cluster_spark, WORKERS)
