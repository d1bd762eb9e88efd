"""GPU workers on the shared local[2] session (marker ``cuda``: a CUDA build, CuPy and a GPU): both
masters train digits to the CPU tests' 95% with every worker on cuda:0, and the stats say so."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import accuracy, mlp_conf, port

from prerequisites import require_gpu
from sparkgrad.compress import AdaptiveThresholdAlgorithm
from sparkgrad.spark import (
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
)

pytestmark = pytest.mark.cuda

EPOCHS = 12


@pytest.fixture(autouse=True)
def _gpu() -> None:
    require_gpu()


@pytest.mark.parametrize(
    ("master", "init_key"),
    [
        (
            lambda: ParameterAveragingTrainingMaster(
                batch_size_per_worker=16,
                averaging_frequency=10,
                rng_seed=1,
                collect_training_stats=True,
                worker_device="cuda:0",
            ),
            "ParameterAveragingWorkerInitTimeMs",
        ),
        (
            lambda: SharedTrainingMaster(
                VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
                batch_size_per_worker=16,
                threshold_algorithm=AdaptiveThresholdAlgorithm(
                    1e-3, min_target_sparsity=1e-3, max_target_sparsity=5e-2
                ),
                collect_training_stats=True,
                rng_seed=3,
                worker_device="cuda:0",
            ),
            "SharedWorkerGetInitialModelTimeMs",
        ),
    ],
    ids=["parameter_averaging", "shared"],
)
def test_gpu_workers_reach_95_percent(spark, digits, master, init_key) -> None:
    rdd = spark.sparkContext.parallelize(digits[0].split(1), 2)
    sm = SparkMultiLayer(spark, mlp_conf(), master())
    accs = []
    try:
        for _ in range(EPOCHS):
            sm.reset_training_stats()
            sm.fit(rdd)
            accs.append(accuracy(sm.network, digits[1]))
            events = sm.training_stats.events(init_key)
            assert events and [e.extra["gpu"] for e in events] == [0.0] * len(events)
            if accs[-1] >= 0.95 and len(accs) >= 2:
                break
    finally:
        rdd.unpersist()
    assert accs[-1] >= 0.95, accs
    assert isinstance(sm.network.params(), np.ndarray)  # the driver's network stays on the CPU
