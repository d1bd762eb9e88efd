"""Both training masters reach 95% on digits; options, stats, export and the HTML report."""

from __future__ import annotations

import dataclasses
import enum
import glob
import os

import numpy as np
import pytest
from helpers import RecordingHook, accuracy, foreign_address, mlp_conf, port, subset

from sparkgrad.compress import HEADER_WORDS, AdaptiveThresholdAlgorithm
from sparkgrad.data import DataSet
from sparkgrad.nn import MultiLayerNetwork, updaters
from sparkgrad.spark import (
    DefaultRepartitioner,
    EqualRepartitioner,
    NoOpRepartitioner,
    ParameterAveragingTrainingMaster,
    SharedTrainingMaster,
    SparkMultiLayer,
    TrainingHook,
    VoidConfiguration,
    ZmqTransportConfiguration,
)
from sparkgrad.transport import HEADER_SIZE

EPOCHS = 12


def _fit_until(sm: SparkMultiLayer, rdd, test: DataSet, target: float = 0.95) -> list[float]:
    accs = []
    for _ in range(EPOCHS):
        sm.reset_training_stats()  # the stats tests below look at the last fit only
        sm.fit(rdd)
        accs.append(accuracy(sm.network, test))
        if accs[-1] >= target and len(accs) >= 2:
            break
    return accs


@pytest.fixture(scope="module")
def train_rdd(spark, digits):
    rdd = spark.sparkContext.parallelize(digits[0].split(1), 2)
    yield rdd
    rdd.unpersist()


@pytest.fixture(scope="module")
def shared_fit(spark, digits, train_rdd, tmp_path_factory):
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=port(), controller_address="127.0.0.1"),
        batch_size_per_worker=16,
        threshold_algorithm=AdaptiveThresholdAlgorithm(
            1e-3, min_target_sparsity=1e-3, max_target_sparsity=5e-2
        ),
        repartitioner=DefaultRepartitioner(max_partitions=2),
        rdd_training_approach="export",  # test_shared_export_is_reused_and_deleted checks the export
        export_directory=str(tmp_path_factory.mktemp("export")),
        collect_training_stats=True,
        rng_seed=3,
    )
    sm = SparkMultiLayer(spark, mlp_conf(), master)
    accs = _fit_until(sm, train_rdd, digits[1])
    return sm, accs


@pytest.fixture(scope="module")
def pa_fit(spark, digits, train_rdd):
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=10,
        rng_seed=1,
        collect_training_stats=True,
        averaging_jobs="per_round",  # DL4J's stats (broadcast, aggregate); one job: test_averaging_jobs
    )
    sm = SparkMultiLayer(spark, mlp_conf(), master)
    accs = _fit_until(sm, train_rdd, digits[1])
    return sm, accs


def test_shared_training_master_reaches_95_percent(shared_fit, digits) -> None:
    sm, accs = shared_fit
    master = sm.training_master
    traffic = master.last_traffic
    n = sm.network.num_params()
    assert traffic["workers"] >= 1 and traffic["updates_applied"] >= 1
    assert traffic["controller_frames_rejected"] == 0  # every frame of a clean fit authenticates
    # the last fit is one epoch over the export's batches of 16: every batch trained once, none twice
    # (1,438 examples exported per partition, 2 of 719: 45 + 45 batches, as many as ceil(1438 / 16))
    assert traffic["epochs"] == 1
    steps = traffic["worker_minibatches"]
    assert steps == master._export_state[2] == -(-digits[0].num_examples() // 16) == 90
    # at most one UPDATE frame per minibatch, its payload the smaller of the sparse and bitmap messages,
    # so never more than the bitmap's 4 header words + N // 16 + 1 words (compress.py's format): a
    # guarantee, not a measured margin (one run sent 30,135 bytes against 225,360 here)
    largest_frame = HEADER_SIZE + 4 * (HEADER_WORDS + n // 16 + 1)
    assert 0 < traffic["worker_update_bytes_sent"] <= steps * largest_frame
    state = master.current_threshold_algorithm
    assert isinstance(state, AdaptiveThresholdAlgorithm) and np.isfinite(state.last_threshold)
    assert accs[-1] >= 0.95, accs  # last: a fit that breaks the checks above should fail on them
    assert sm.network.epoch_count == len(accs)


def test_shared_stats_cover_every_example_and_render_html(shared_fit, digits, tmp_path) -> None:
    sm, _ = shared_fit
    stats = sm.training_stats
    compute = stats.events("SharedWorkerComputeUpdateTimesMs")
    assert sum(e.extra["examples"] for e in compute) == digits[0].num_examples()
    series = stats.series()
    assert series and all(
        {"threshold", "density", "bytes_sent"} <= set(r) for recs in series.values() for r in recs
    )
    assert stats.counters["worker_bytes_sent"] > 0 and stats.counters["worker_messages_sent"] > 0
    path = tmp_path / "stats.html"
    stats.export_html(path)
    text = path.read_text()
    assert "<svg" in text and "Timeline" in text and "Threshold" in text and "Bytes sent" in text
    assert "<script" not in text and "src=" not in text and "href=" not in text
    assert "SharedWorkerComputeUpdateTimesMs" in stats.summary()


def test_shared_export_is_reused_and_deleted(shared_fit, spark) -> None:
    sm, accs = shared_fit
    master = sm.training_master
    _, path, batches = master._export_state
    assert batches == 90 and glob.glob(os.path.join(path, "part-*"))
    assert "SharedMasterExportTimesMs" not in sm.training_stats.keys()  # last fit reused the export
    kept = master._prepared[1].rdd  # the export is read again by every fit: nothing held in memory
    assert not kept.is_cached and master._prepared[1].exported
    assert master.delete_temp_files(spark) and not os.path.exists(path)
    assert master._prepared is None


def test_parameter_averaging_reaches_95_percent(pa_fit, digits) -> None:
    sm, accs = pa_fit
    assert accs[-1] >= 0.95, accs
    stats = sm.training_stats
    for key in (
        "ParameterAveragingMasterBroadcastCreateTimesMs",
        "ParameterAveragingMasterAggregateTimesMs",
        "ParameterAveragingWorkerFitTimesMs",
        "ParameterAveragingMasterFitTimesMs",
    ):
        assert stats.events(key)
    fits = stats.events("ParameterAveragingWorkerFitTimesMs")
    assert sum(e.extra["examples"] for e in fits) == digits[0].num_examples()  # no example dropped
    assert np.isfinite(sm.score()) and sm.network.epoch_count == len(accs)


@pytest.mark.parametrize(
    "options",
    [
        dict(
            rdd_training_approach="direct",
            rdd_data_set_num_examples=3,
            repartition="never",  # the RDD's 3 partitions are the workers: more than local[2]'s slots
            storage_level="NONE",
            averaging_jobs="per_round",
        ),
        dict(
            rdd_training_approach="direct",
            rdd_data_set_num_examples=3,
            repartition_strategy="spark_default",
            save_updater=False,
            worker_prefetch_num_batches=2,
            aggregation_depth=3,
        ),
        dict(
            rdd_training_approach="export",
            repartition="num_partitions_workers_differs",
            num_workers=3,
            averaging_jobs="per_round",
        ),
        dict(rdd_training_approach="export", repartition="num_partitions_workers_differs"),
    ],
)
def test_parameter_averaging_options_use_every_example(spark, digits, tmp_path, options) -> None:
    data = subset(digits[0], 200)
    rdd = spark.sparkContext.parallelize(data.split(3), 3)
    master = ParameterAveragingTrainingMaster(
        batch_size_per_worker=8, averaging_frequency=3, rng_seed=5, **options
    )
    master.add_hook(RecordingHook(str(tmp_path)))
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    before_updater = sm.network.updater_state().copy()
    before = sm.network.params().copy()
    sm.fit(rdd)
    seen = sum(int(name.rsplit("-", 1)[1]) for name in os.listdir(tmp_path))
    assert seen == 200
    assert not np.array_equal(before, sm.network.params())
    if not master.save_updater:
        np.testing.assert_array_equal(before_updater, sm.network.updater_state())
    else:
        assert not np.array_equal(before_updater, sm.network.updater_state())
    master.remove_hook(master.training_hooks[0])
    assert master.training_hooks == ()


def test_shared_direct_with_workers_per_node_and_debug(spark, digits, free_port, caplog) -> None:
    data = subset(digits[0], 160)
    rdd = spark.sparkContext.parallelize(data.split(10), 2)
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=free_port, controller_address="127.0.0.1"),
        batch_size_per_worker=10,
        rdd_data_set_num_examples=10,
        rdd_training_approach="direct",
        storage_level="MEMORY_AND_DISK",
        workers_per_node=1,
        worker_prefetch_num_batches=0,
        encoding_debug_mode=True,
        debug_longer_iterations=1,
        residual_post_processor=None,
        collect_training_stats=True,
    )
    sm = SparkMultiLayer(spark, mlp_conf(hidden=16), master)
    sm.fit(rdd)
    # one worker per host: local[2]'s two task slots train as one worker, in one barrier job
    assert (master.last_traffic["workers"], master.last_traffic["spark_jobs"]) == (1, 1)
    assert master.last_traffic["worker_minibatches"] == 16
    assert (
        sum(e.extra["examples"] for e in sm.training_stats.events("SharedWorkerComputeUpdateTimesMs")) == 160
    )


def test_barrier_tasks_beyond_workers_per_node_on_a_host_fail(spark) -> None:
    from sparkgrad.spark.shared_worker import check_barrier_placement

    def placed(limit: int):
        def check(it):
            check_barrier_placement(limit)
            yield 1

        return check

    rdd = spark.sparkContext.parallelize(range(2), 2)
    assert rdd.barrier().mapPartitions(placed(2)).collect() == [1, 1]  # local[2]: both on this host
    with pytest.raises(Exception, match=r"workers_per_node=1: Spark placed 2 of this barrier job's 2 tasks"):
        rdd.barrier().mapPartitions(placed(1)).collect()


def test_masters_round_trip_json_and_yaml() -> None:
    from sparkgrad.compress import FixedThresholdAlgorithm, NoOpResidualPostProcessor

    shared = SharedTrainingMaster(
        VoidConfiguration(unicast_port=40200, controller_address="127.0.0.1", network_mask="10.0.0.0/8"),
        batch_size_per_worker=7,
        workers_per_node=2,
        threshold_algorithm=FixedThresholdAlgorithm(0.01),
        residual_post_processor=NoOpResidualPostProcessor(),
        rdd_training_approach="direct",
        repartitioner=DefaultRepartitioner(100),
        transport=ZmqTransportConfiguration(connect_timeout_ms=500),
        storage_level="memory_and_disk",
        rng_seed=4,
        encoding_debug_mode=True,
        momentum_masking=True,
        own_update="encoded",
        task_threads=2,
    )
    dl4j = SharedTrainingMaster(updates_threshold=1e-3, workers_per_node=4, repartitioner=NoOpRepartitioner())
    pa = ParameterAveragingTrainingMaster(
        num_workers=3,
        averaging_frequency=2,
        repartition="never",
        repartition_strategy="spark_default",
        training_hooks=(TrainingHook(),),
    )
    equal = ParameterAveragingTrainingMaster(repartition_strategy=EqualRepartitioner(), task_threads=1)
    for master in (shared, dl4j, pa, equal):
        cls = type(master)
        assert cls.from_json(master.to_json()) == master
        assert cls.from_yaml(master.to_yaml()) == master
        assert (
            cls.from_json(
                cls().to_json()
                if cls is ParameterAveragingTrainingMaster
                else SharedTrainingMaster().to_json()
            )
            == cls()
        )


def _field_values(config) -> dict:
    """Every dataclass field of ``config`` by value: enums as their values, nested configs as dicts."""
    values = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, enum.Enum):
            value = value.value
        elif isinstance(value, VoidConfiguration):
            value = _field_values(value)
        values[f.name] = value
    return values


VOID_DEFAULTS = {"unicast_port": 0, "controller_address": None, "network_mask": None, "secret": None}


def test_every_default_of_both_masters_is_pinned_by_value() -> None:
    """A changed default fails here, naming the field; a new field fails until it is listed."""
    shared = {
        "void_configuration": VOID_DEFAULTS,
        "batch_size_per_worker": 32,
        "rdd_data_set_num_examples": 1,
        "workers_per_node": -1,
        "threshold_algorithm": None,  # resolved below
        "residual_post_processor": None,  # resolved below
        "mesh_build_mode": "plain",
        "staleness_bound": 4,
        "rdd_training_approach": "auto",
        "direct_memory_budget_mb": 512,
        "export_directory": None,
        "storage_level": "DISK_ONLY",
        "storage_level_streams": "NONE",
        "repartitioner": None,
        "worker_prefetch_num_batches": 2,
        "encoding_debug_mode": False,
        "collect_training_stats": False,
        "debug_longer_iterations": 0,
        "rng_seed": None,
        "transport": None,
        "progress": True,
        "worker_device": "auto",
        "update_combination": "auto",
        "momentum_masking": False,
        "own_update": "full",
        "updates_threshold": None,
        "task_threads": None,
    }
    averaging = {
        "rdd_data_set_num_examples": 1,
        "num_workers": None,
        "batch_size_per_worker": 16,
        "averaging_frequency": 5,
        "aggregation_depth": 2,
        "save_updater": True,
        "worker_prefetch_num_batches": 0,
        "repartition": "always",
        "repartition_strategy": "balanced",
        "storage_level": "DISK_ONLY",
        "storage_level_streams": "NONE",
        "rdd_training_approach": "auto",
        "direct_memory_budget_mb": 512,
        "export_directory": None,
        "rng_seed": None,
        "collect_training_stats": False,
        "training_hooks": (),
        "progress": True,
        "worker_device": "auto",
        "averaging_jobs": "one",
        "void_configuration": VOID_DEFAULTS,
        "transport": None,
        "task_threads": None,
    }
    for master, expected in (
        (SharedTrainingMaster(), shared),
        (ParameterAveragingTrainingMaster(), averaging),
    ):
        actual = _field_values(master)
        assert sorted(actual) == sorted(expected), type(master).__name__
        for name, value in expected.items():
            assert actual[name] == value and type(actual[name]) is type(value), (type(master).__name__, name)
    # what the None defaults of SharedTrainingMaster resolve to, compared by value: the threshold algorithm
    # is compress.default_threshold_algorithm(), TargetSparsityThresholdAlgorithm(2e-2, 3e-3) starting at
    # the first update's target quantile; no residual post-processing; a staleness window of 4 // 2
    from sparkgrad.compress import NoOpResidualPostProcessor, TargetSparsityThresholdAlgorithm

    master = SharedTrainingMaster()
    for algorithm in (
        master.current_threshold_algorithm,
        master._job_options(_adam_net(), 2, 2)["threshold_algorithm"],
    ):
        assert type(algorithm) is TargetSparsityThresholdAlgorithm
        assert (algorithm.initial_threshold, algorithm.sparsity_target) == (2e-2, 3e-3)
        assert (algorithm.decay_rate, algorithm.start_at_target, algorithm.written_cap) == (
            0.5 ** (1 / 20),
            True,
            True,
        )
        assert np.isnan(algorithm.last_threshold) and np.isnan(algorithm.last_sparsity)
    options = master._job_options(_adam_net(), 2, 2)
    assert type(options["residual_post_processor"]) is NoOpResidualPostProcessor
    assert options["staleness_window"] == 2 and options["workers_per_node"] == -1
    assert (options["own_update"], options["momentum_masking"], options["mesh"]) == ("full", False, False)
    assert (options["encoding_debug_mode"], options["debug_longer_iterations"]) == (False, 0)
    assert options["progress_interval_s"] == 2.0 and options["update_scale"] == 1.0  # Adam: summed


def _adam_net() -> MultiLayerNetwork:
    return MultiLayerNetwork(mlp_conf()).init()


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (ParameterAveragingTrainingMaster, {"averaging_frequency": 0}, "averaging_frequency"),
        (ParameterAveragingTrainingMaster, {"repartition": "sometimes"}, "repartition"),
        (ParameterAveragingTrainingMaster, {"storage_level": "IN_THE_CLOUD"}, "storage_level"),
        (SharedTrainingMaster, {"workers_per_node": 0}, "workers_per_node"),
        (SharedTrainingMaster, {"batch_size_per_worker": -1}, "batch_size_per_worker"),
        (SharedTrainingMaster, {"mesh_build_mode": "ring"}, "mesh_build_mode"),
        (SharedTrainingMaster, {"staleness_bound": 1}, "staleness_bound"),
        (SharedTrainingMaster, {"staleness_bound": -2}, "staleness_bound"),
        (SharedTrainingMaster, {"momentum_masking": 1}, "momentum_masking"),
        (SharedTrainingMaster, {"own_update": "sent"}, "own_update"),
        (SharedTrainingMaster, {"task_threads": 0}, "task_threads"),
        (SharedTrainingMaster, {"repartitioner": "default"}, "repartitioner"),
        (ParameterAveragingTrainingMaster, {"task_threads": 1.5}, "task_threads"),
        (ParameterAveragingTrainingMaster, {"repartition_strategy": "approximate"}, "repartition_strategy"),
        (VoidConfiguration, {"unicast_port": 70000}, "unicast_port"),
        (VoidConfiguration, {"network_mask": "not-a-net"}, "network_mask"),
    ],
)
def test_bad_master_options_name_the_field(cls, kwargs, field) -> None:
    with pytest.raises(ValueError, match=field):
        cls(**kwargs)
    if cls is not VoidConfiguration:
        text = cls().to_json().replace('"rng_seed"', '"no_such_field"')
        with pytest.raises(ValueError, match="no_such_field"):
            cls.from_json(text)


def test_momentum_masking_and_own_update_reach_the_workers_job() -> None:
    """The options travel in the job the executors train by (the worker's use of them:
    tests/distributed/test_worker_masking.py)."""
    net = MultiLayerNetwork(mlp_conf()).init()
    for masking in (True, False):
        options = SharedTrainingMaster(momentum_masking=masking)._job_options(net, 2, 2)
        assert options["momentum_masking"] is masking
    assert SharedTrainingMaster()._job_options(net, 2, 2)["own_update"] == "full"
    assert SharedTrainingMaster(own_update="encoded")._job_options(net, 2, 2)["own_update"] == "encoded"


def test_the_workers_update_scale_follows_the_combination_and_the_networks_updaters() -> None:
    """ "auto" sums an Adam network's updates and scales an Sgd one's (or one with an Sgd layer) by
    1/sqrt(workers), the workers being as many as the fit's task slots allow."""
    adam = MultiLayerNetwork(mlp_conf()).init()
    sgd = MultiLayerNetwork(dataclasses.replace(mlp_conf(), updater=updaters.Sgd(0.1))).init()
    conf = mlp_conf()
    mixed = MultiLayerNetwork(
        dataclasses.replace(
            conf, layers=[dataclasses.replace(conf.layers[0], updater=updaters.Sgd(0.1)), conf.layers[1]]
        )
    ).init()
    assert [u.kind for u in mixed.updaters] == ["sgd", "adam"]
    master = SharedTrainingMaster()
    assert master._job_options(adam, 4, 4)["update_scale"] == 1.0
    assert master._job_options(sgd, 4, 4)["update_scale"] == 0.5
    assert master._job_options(mixed, 4, 4)["update_scale"] == 0.5
    assert master._job_options(sgd, 8, 4)["update_scale"] == 0.5  # 4 slots: 4 workers at once
    assert SharedTrainingMaster(update_combination="sqrt")._job_options(adam, 4, 4)["update_scale"] == 0.5
    assert SharedTrainingMaster(update_combination="mean")._job_options(adam, 4, 4)["update_scale"] == 0.25


def test_controller_address_resolution_order(monkeypatch) -> None:
    monkeypatch.delenv("SPARKGRAD_VOID_IP", raising=False)
    assert (
        VoidConfiguration(controller_address="127.0.0.1").resolve_controller_address("10.1.2.3")
        == "127.0.0.1"
    )
    assert VoidConfiguration().resolve_controller_address("127.0.0.1") == "127.0.0.1"
    assert VoidConfiguration(network_mask="127.0.0.0/8").resolve_controller_address("10.1.2.3") == "127.0.0.1"
    foreign = f"{foreign_address()}/32"
    with pytest.raises(ValueError, match="network_mask"):
        VoidConfiguration(network_mask=foreign).resolve_controller_address(None)
    monkeypatch.setenv("SPARKGRAD_VOID_IP", "127.0.0.1")
    assert VoidConfiguration(network_mask=foreign).resolve_controller_address("10.1.2.3") == "127.0.0.1"


def test_parameter_averaging_stats_html_and_properties(pa_fit, tmp_path) -> None:
    sm, _ = pa_fit
    path = tmp_path / "pa.html"
    sm.training_stats.export_html(path)
    text = path.read_text()
    assert "ParameterAveragingMasterAggregateTimesMs" in text and "<svg" in text and "<script" not in text
    assert set(sm.training_stats.to_dict()) == {"events", "series", "scores", "epochs", "counters"}
    sm.collect_training_stats = False
    assert sm.training_master.collect_training_stats is False
    with pytest.raises(ValueError, match="collect_training_stats"):
        sm.collect_training_stats = "yes"
    with pytest.raises(TypeError, match="network"):
        sm.network = "not a network"
    assert sm.spark_context is not None and sm.training_master is not None


def test_a_network_built_from_a_snapshot_owns_its_buffers() -> None:
    """NetworkSnapshot.build copies the parameters and updater state into the new network's buffers
    once: training it leaves the snapshot (shared by every task of a fit) as it was."""
    from sparkgrad.spark.common import NetworkSnapshot

    source = MultiLayerNetwork(mlp_conf(hidden=8)).init()
    source.set_updater_state(np.linspace(-1, 1, source.updater_state().size, dtype=np.float32))
    snapshot = NetworkSnapshot.of(source)
    params, state = snapshot.params.copy(), snapshot.updater_state.copy()
    built = snapshot.build()
    np.testing.assert_array_equal(built.params(), params)
    np.testing.assert_array_equal(built.updater_state(), state)
    rng = np.random.default_rng(0)
    built.fit(
        DataSet(
            rng.normal(size=(16, 64)).astype(np.float32),
            np.eye(10, dtype=np.float32)[rng.integers(0, 10, 16)],
        )
    )
    assert not np.array_equal(built.params(), params) and not np.array_equal(built.updater_state(), state)
    np.testing.assert_array_equal(snapshot.params, params)
    np.testing.assert_array_equal(snapshot.updater_state, state)
