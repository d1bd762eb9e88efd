"""Data preparation of a fit: the AUTO training approach (direct within the memory budget, export above),
EXPORT and DIRECT, the size estimate and the choice recorded in the stats."""

from __future__ import annotations

import glob
import logging
import os

import numpy as np
import pytest
from helpers import NpzLoader, mlp_conf, port, subset

from sparkgrad.data import DataSet
from sparkgrad.spark import (
    DefaultRepartitioner,
    ParameterAveragingTrainingMaster,
    RDDTrainingApproach,
    SharedTrainingMaster,
    SparkMultiLayer,
    VoidConfiguration,
    ZmqTransportConfiguration,
)
from sparkgrad.spark.common import APPROACH_EXPORT_COUNTER
from sparkgrad.spark.partitioning import partition_sizes

EXAMPLES, BATCH = 160, 16


def _master(name: str, **kw):
    if name == "pa":
        return ParameterAveragingTrainingMaster(
            batch_size_per_worker=BATCH, averaging_frequency=10, rng_seed=1, collect_training_stats=True, **kw
        )
    return SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=BATCH,
        repartitioner=DefaultRepartitioner(max_partitions=2),
        transport=ZmqTransportConfiguration(
            connect_timeout_ms=3000, sync_timeout_ms=30000, poll_interval_ms=10
        ),
        collect_training_stats=True,
        **kw,
    )


@pytest.fixture(scope="module")
def data(digits):
    return subset(digits[0], EXAMPLES)


@pytest.fixture(scope="module")
def rdd(spark, data):
    out = spark.sparkContext.parallelize(data.split(1), 2)
    yield out
    out.unpersist()


def _exported_files(root) -> list[str]:
    return glob.glob(os.path.join(str(root), "**", "part-*"), recursive=True)


@pytest.mark.parametrize("master", ["pa", "shared"])
def test_auto_is_the_default_with_a_512_mib_budget(master) -> None:
    m = _master(master)
    assert m.rdd_training_approach is RDDTrainingApproach.AUTO
    assert m.direct_memory_budget_mb == 512
    assert RDDTrainingApproach("auto") is RDDTrainingApproach.AUTO


def test_partition_sizes_count_elements_array_bytes_and_examples(spark) -> None:
    rng = np.random.default_rng(0)
    sets = [
        DataSet(rng.random((3, 5), dtype=np.float32), np.eye(4, dtype=np.float32)[:3]),
        DataSet(rng.random((2, 5)), None, np.ones((2, 5), np.float32)),  # float64 features + a mask
        DataSet(np.zeros((1, 7), np.float16), np.zeros((1, 2), np.int64), None, np.ones((1, 2), np.float32)),
    ]
    sizes = partition_sizes(spark.sparkContext.parallelize(sets, 2))
    # parallelize puts 1 element in the first partition and 2 in the second
    assert sizes == [(1, 3 * 5 * 4 + 3 * 4 * 4, 3), (2, 2 * 5 * 8 + 2 * 5 * 4 + 7 * 2 + 2 * 8 + 2 * 4, 3)]
    assert partition_sizes(spark.sparkContext.parallelize(["a", "b", "c"], 3)) == [(1, 0, 0)] * 3


@pytest.mark.parametrize("master", ["pa", "shared"])
def test_datasets_larger_than_rdd_data_set_num_examples_are_named_in_a_warning(
    spark, data, caplog, master
) -> None:
    # DataSets of 16 examples: the default rdd_data_set_num_examples=1 sizes partitions (and averaging
    # rounds) as if each held one, so a fit would train fewer workers (or average less often) than its
    # settings say; the count that sizes the data says so, and is silent when the setting is right
    batched = spark.sparkContext.parallelize(data.split(16), 2)
    for per_set, warned in ((1, True), (8, True), (9, False), (16, False)):
        m = _master(master, rdd_data_set_num_examples=per_set)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sparkgrad.spark.common"):
            m.prepare(spark.sparkContext, batched, "dataset", None, None, "timer")
        messages = [r.getMessage() for r in caplog.records if "rdd_data_set_num_examples" in r.getMessage()]
        assert messages == (
            [
                "the RDD's DataSets hold 16 examples each on average but "
                f"rdd_data_set_num_examples={per_set}: partitions and averaging rounds are sized as if each "
                f"held {per_set} (fewer workers train, or parameters are averaged less often, than "
                "batch_size_per_worker and averaging_frequency suggest); set rdd_data_set_num_examples to "
                "the examples of one DataSet"
            ]
            if warned
            else []
        )
        m._unpersist()


@pytest.mark.parametrize("master", ["pa", "shared"])
@pytest.mark.parametrize("budget, exported", [(512, False), (0, True)])
def test_auto_trains_directly_within_the_budget_and_exports_above(
    spark, data, rdd, tmp_path, caplog, master, budget, exported
) -> None:
    m = _master(
        master, rdd_training_approach="auto", direct_memory_budget_mb=budget, export_directory=str(tmp_path)
    )
    with SparkMultiLayer(spark, mlp_conf(hidden=8), m) as sm:
        before = sm.network.score(data)
        with caplog.at_level(logging.INFO, logger="sparkgrad.spark.common"):
            sm.fit(rdd, epochs=2)
        assert sm.training_stats.counters[APPROACH_EXPORT_COUNTER] == float(exported)
        assert sm.network.score(data) < before and sm.network.epoch_count == 2
        # the arrays of the 160 one-example DataSets: float32 features (64) and one-hot labels (10)
        size = f"{EXAMPLES} DataSets, {EXAMPLES * 74 * 4 / 2**20:.1f} MiB of arrays"
        decision = "exporting it to files" if exported else "training directly from the RDD"
        assert [r.getMessage() for r in caplog.records if size in r.getMessage()] == [
            f"training data: {size}, "
            + (f"above direct_memory_budget_mb={budget}: " if exported else "rdd_training_approach=auto: ")
            + decision
        ]
        assert bool(_exported_files(tmp_path)) == exported
        kept = m._prepared[1].rdd  # what the workers read: the persisted RDD, or the files read again
        assert kept.is_cached != exported and (kept is rdd) != exported
        if exported:  # one record per batch of 16 examples in each of the 2 partitions
            assert m._export_state[2] == 2 * -(-EXAMPLES // 2 // BATCH)
            assert not rdd.is_cached  # the source, persisted for the size estimate, was released
        caplog.clear()
        sm.reset_training_stats()  # the counter of the next fit alone
        with caplog.at_level(logging.INFO, logger="sparkgrad.spark.common"):
            sm.fit(rdd)  # the same RDD again: prepared data reused, the choice still recorded
        assert not caplog.records
        assert sm.training_stats.counters[APPROACH_EXPORT_COUNTER] == float(exported)
    assert not _exported_files(tmp_path) and not kept.is_cached  # close() released everything


@pytest.mark.parametrize("approach, exported", [("export", True), ("direct", False)])
def test_explicit_export_and_direct_keep_their_meaning(
    spark, data, rdd, tmp_path, approach, exported
) -> None:
    # the budget does not matter to them
    budget = 512 if exported else 0
    m = _master(
        "pa", rdd_training_approach=approach, direct_memory_budget_mb=budget, export_directory=str(tmp_path)
    )
    with SparkMultiLayer(spark, mlp_conf(hidden=8), m) as sm:
        before = sm.network.score(data)
        sm.fit(rdd, epochs=2)
        assert sm.training_stats.counters[APPROACH_EXPORT_COUNTER] == float(exported)
        assert bool(_exported_files(tmp_path)) == exported
        assert sm.network.score(data) < before
        worker_examples = sm.training_stats.events("ParameterAveragingWorkerFitTimesMs")
        assert sum(e.extra["examples"] for e in worker_examples) == 2 * EXAMPLES


def test_paths_and_directories_are_never_exported(spark, data, tmp_path) -> None:
    files = tmp_path / "data"
    files.mkdir()
    paths = []
    for i, part in enumerate(data.split(40)):
        np.savez(files / f"ds{i}.npz", x=part.features, y=part.labels)
        paths.append(str(files / f"ds{i}.npz"))
        part.save(str(files / f"ds{i}.bin"))
    export = tmp_path / "export"
    m = _master("pa", direct_memory_budget_mb=0, export_directory=str(export), rdd_data_set_num_examples=40)
    with SparkMultiLayer(spark, mlp_conf(hidden=8), m) as sm:
        sm.fit_paths(spark.sparkContext.parallelize(paths, 2), loader=NpzLoader())
        assert sm.training_stats.counters[APPROACH_EXPORT_COUNTER] == 0.0
        sm.fit(f"file://{files}/*.bin")
        assert sm.training_stats.counters[APPROACH_EXPORT_COUNTER] == 0.0
        assert sm.network.epoch_count == 2
    assert not _exported_files(export)


@pytest.mark.parametrize("value", [-1, True, 1.5, "512"])
def test_bad_memory_budget_names_the_field(value) -> None:
    with pytest.raises(ValueError, match="^direct_memory_budget_mb: "):
        ParameterAveragingTrainingMaster(direct_memory_budget_mb=value)


def test_auto_and_the_budget_round_trip_json_and_yaml() -> None:
    m = ParameterAveragingTrainingMaster(rdd_training_approach="auto", direct_memory_budget_mb=7)
    for back in (
        ParameterAveragingTrainingMaster.from_json(m.to_json()),
        ParameterAveragingTrainingMaster.from_yaml(m.to_yaml()),
    ):
        assert back == m and back.rdd_training_approach is RDDTrainingApproach.AUTO
        assert back.direct_memory_budget_mb == 7
