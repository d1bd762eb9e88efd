"""SparkMultiLayer.close()/with release what the model holds; loaders and hooks travel with cloudpickle;
a non-finite training step fails the ParameterAveraging fit naming the worker."""

from __future__ import annotations

import gc
import glob
import os
import pickle

import numpy as np
import pytest
from helpers import mlp_conf, subset

from sparkgrad.data import DataSet
from sparkgrad.errors import TrainingError
from sparkgrad.spark import ParameterAveragingTrainingMaster, SparkMultiLayer


def _pa(tmp_path, **kw) -> ParameterAveragingTrainingMaster:
    return ParameterAveragingTrainingMaster(
        batch_size_per_worker=16,
        averaging_frequency=4,
        rng_seed=3,
        export_directory=f"file://{tmp_path}/exports",
        **kw,
    )


def _exported(tmp_path) -> list[str]:
    return glob.glob(os.path.join(str(tmp_path), "exports", "*", "*", "part-*"))


def _npz_files(data: DataSet, directory, per_file: int) -> list[str]:
    paths = []
    for i, part in enumerate(data.split(per_file)):
        path = str(directory / f"ds{i}.npz")
        np.savez(path, x=part.features, y=part.labels)
        paths.append(path)
    return paths


def test_close_and_with_release_persisted_data_exports_and_broadcasts(spark, digits, tmp_path) -> None:
    sc = spark.sparkContext
    rdd = sc.parallelize(subset(digits[0], 128).split(16), 2)
    test = subset(digits[1], 30)
    # explicit export (the default, auto, trains this small RDD directly), its files read back persisted
    # (DL4J's storage_level_streams; the default streams them): close() must delete and release them
    master = _pa(tmp_path, rdd_training_approach="export", storage_level_streams="MEMORY_ONLY")
    with SparkMultiLayer(spark, mlp_conf(hidden=16), master) as sm:
        sm.fit(rdd)
        sm.fit(rdd)  # same RDD: the export and the persisted read-back are reused
        kept = sm.training_master._prepared[1].rdd
        assert kept.is_cached and len(_exported(tmp_path)) == 2
        scores_rdd = sm.score_examples(sc.parallelize(test.split(10), 2))
        before = scores_rdd.collect()
        assert len(sm._broadcasts) == 1
    assert not kept.is_cached and sm.training_master._prepared is None
    assert _exported(tmp_path) == [] and os.listdir(tmp_path / "exports") == []
    assert sm._broadcasts == []
    # lazy results stay computable: the network is broadcast again on use
    assert scores_rdd.collect() == before
    sm.close()  # idempotent

    # the model stays usable: a later fit prepares (exports and persists) its data again
    sm.fit(rdd)
    again = sm.training_master._prepared[1].rdd
    assert again.is_cached and len(_exported(tmp_path)) == 2 and sm.network.epoch_count == 3
    sm.close()
    assert not again.is_cached and _exported(tmp_path) == []


def test_dropped_model_releases_its_resources(spark, digits, tmp_path) -> None:
    rdd = spark.sparkContext.parallelize(subset(digits[0], 64).split(16), 2)
    master = _pa(tmp_path, rdd_training_approach="export", storage_level_streams="MEMORY_ONLY")
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), master)
    sm.fit(rdd)
    kept = sm.training_master._prepared[1].rdd
    assert kept.is_cached and _exported(tmp_path)
    del sm
    gc.collect()
    assert not kept.is_cached and _exported(tmp_path) == []


def _main_loader():
    """A loader whose module is ``__main__`` (as if defined in a script or notebook)."""
    namespace = {"__name__": "__main__"}
    exec(
        "import numpy as np\n"
        "from sparkgrad.data import DataSet\n"
        "def main_loader(path):\n"
        "    with np.load(path) as z:\n"
        "        return DataSet(z['x'], z['y'])\n",
        namespace,
    )
    loader = namespace["main_loader"]
    assert loader.__module__ == "__main__"
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(loader)  # the standard pickle (Spark broadcasts) cannot ship it
    return loader


def _lambda_loader():
    return lambda path: DataSet(np.load(path)["x"], np.load(path)["y"])


def _closure_loader():
    opened = []

    def load(path: str) -> DataSet:
        opened.append(path)
        with np.load(path) as z:
            return DataSet(z["x"], z["y"])

    return load


@pytest.mark.parametrize("make_loader", [_lambda_loader, _closure_loader, _main_loader])
def test_lambda_closure_and_main_loaders_work_in_fit_paths_and_evaluate(
    spark, digits, tmp_path, make_loader
) -> None:
    sc = spark.sparkContext
    loader = make_loader()
    train_paths = _npz_files(subset(digits[0], 96), tmp_path, 16)
    (tmp_path / "test").mkdir()
    test = subset(digits[1], 60)
    test_paths = _npz_files(test, tmp_path / "test", 20)
    with SparkMultiLayer(
        spark, mlp_conf(hidden=16), _pa(tmp_path, rdd_data_set_num_examples=16, collect_training_stats=True)
    ) as sm:
        sm.fit_paths(sc.parallelize(train_paths, 2), loader=loader)
        events = sm.training_stats.events("ParameterAveragingWorkerFitTimesMs")
        assert sum(e.extra["examples"] for e in events) == 96
        dist = sm.evaluate(sc.parallelize(test_paths, 2), loader=loader)
        local = sm.network.evaluate(test)
        np.testing.assert_array_equal(dist.confusion_matrix(), local.confusion_matrix())


def test_locally_defined_hook_runs_on_the_workers(spark, digits, tmp_path) -> None:
    class CountingHook:  # defined in a function: the standard pickle cannot ship this class
        def __init__(self, directory: str) -> None:
            self.directory = directory

        def pre_update(self, dataset, network) -> None:
            open(
                os.path.join(self.directory, f"pre-{os.getpid()}-{id(dataset)}-{network.iteration_count}"),
                "w",
            ).close()

        def post_update(self, dataset, network) -> None:
            pass

    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    hook = CountingHook(str(hook_dir))
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(hook)
    master = _pa(tmp_path, rdd_training_approach="direct", rdd_data_set_num_examples=16)
    master.add_hook(hook)
    with SparkMultiLayer(spark, mlp_conf(hidden=8), master) as sm:
        sm.fit(spark.sparkContext.parallelize(subset(digits[0], 128).split(16), 2))
    # 128 examples in minibatches of 16: one pre_update per minibatch
    assert len(os.listdir(hook_dir)) == 8
    assert master.training_hooks == (hook,)  # the master keeps the hook itself (to_json, remove_hook)


def test_non_finite_features_fail_naming_the_worker(spark, digits, tmp_path) -> None:
    """Depends on MultiLayerNetwork.compute_update raising TrainingError on non-finite input."""
    train = subset(digits[0], 64)
    features = train.features.copy()
    features[37, 5] = np.nan
    rdd = spark.sparkContext.parallelize(DataSet(features, train.labels).split(16), 2)
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), _pa(tmp_path, rdd_training_approach="direct"))
    start = sm.network.params().copy()
    with pytest.raises(TrainingError, match=r"worker \d+ \([^)]*:\d+\): .*iteration.*features"):
        sm.fit(rdd)
    np.testing.assert_array_equal(sm.network.params(), start)  # NaN never reached the driver's model
    sm.close()


def test_worker_training_error_is_reraised_naming_the_worker(spark, digits, tmp_path) -> None:
    class FailingHook:
        def pre_update(self, dataset, network) -> None:
            raise TrainingError(f"iteration {network.iteration_count}: simulated non-finite update")

        def post_update(self, dataset, network) -> None:
            pass

    master = _pa(tmp_path, rdd_training_approach="direct", training_hooks=(FailingHook(),))
    sm = SparkMultiLayer(spark, mlp_conf(hidden=8), master)
    start = sm.network.params().copy()
    rdd = spark.sparkContext.parallelize(subset(digits[0], 32).split(16), 2)
    with pytest.raises(
        TrainingError,
        # the first line is the executor's exception, as Python printed it there
        match=r"^sparkgrad\.errors\.TrainingError: worker [01] \([^)]+:\d+\): "
        r"iteration 0: simulated non-finite update\n\(training failed on an executor",
    ):
        sm.fit(rdd)
    np.testing.assert_array_equal(sm.network.params(), start)
    sm.close()
