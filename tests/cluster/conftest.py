"""A 2-worker Spark standalone cluster in network namespaces (bench/cluster/cluster.py) for this directory.

The cluster and its SparkSession live for the module that uses them. Only one SparkContext can exist per
process, so the session fixture stops any active session first and stops its own at teardown, after which
tests/spark's local[2] session can start.

A test module sets the environment of its cluster's Worker daemons (and so of their executors' Python
workers) with a module-level ``CLUSTER_WORKER_ENV``, passed to ``harness.up(worker_env=...)``: e.g.
``CLUSTER_WORKER_ENV = {0: {"SPARKGRAD_DEVICE": "cuda:0"}}`` gives only the first host a GPU device.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prerequisites import require_or_skip

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# the harness (bench/cluster/cluster.py: `import cluster`) and the Spark tests' helpers (`from helpers ...`)
sys.path.insert(0, str(ROOT / "bench" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "spark"))

import cluster as harness  # noqa: E402

WORKERS = 2
BATCH = 16


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.ClusterInfo]:
    """A running 2-worker cluster, links shaped to 1 Gbit/s, Worker environments from the module's
    ``CLUSTER_WORKER_ENV`` (none by default); always torn down, also when a test fails."""
    require_or_skip("cluster", importlib.util.find_spec("pyspark") is not None, "pyspark is not installed")
    reason = harness.unavailable_reason()
    require_or_skip("cluster", reason is None, str(reason))
    state_dir = str(tmp_path_factory.mktemp("cluster") / "state")
    try:
        # The Workers inherit this process's environment: a SPARKGRAD_DEVICE of the machine running the
        # tests must not put executors on a device the module did not ask for.
        with pytest.MonkeyPatch.context() as env:
            env.delenv("SPARKGRAD_DEVICE", raising=False)
            # no added delay: it needs netem, which not every kernel has; the rate works with netem or tbf
            info = harness.up(
                WORKERS,
                rate="1gbit",
                delay=None,
                state_dir=state_dir,
                worker_env=getattr(request.module, "CLUSTER_WORKER_ENV", None),
            )
    except harness.ClusterUnavailable as exc:
        require_or_skip("cluster", False, str(exc))
    try:
        yield info
    finally:
        harness.down(state_dir)


@pytest.fixture(scope="module")
def cluster_spark(cluster: harness.ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A SparkSession on the cluster, driver in the root namespace, both executors registered."""
    from pyspark.sql import SparkSession

    import sparkgrad

    # The first SparkContext launches the JVM that every later one in this process reuses, and local-mode
    # Python workers inherit that JVM's environment: give it the PYTHONPATH that tests/spark's local[2]
    # session (which may run after this module) needs for its helpers and this sparkgrad.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests" / "spark"), str(Path(sparkgrad.__file__).resolve().parents[1])]
        + [os.environ.get("PYTHONPATH", "")]
    )
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    local_dir = str(tmp_path_factory.mktemp("cluster-driver"))
    session = harness.spark_session(cluster, "sparkgrad-cluster-tests", local_dir)
    try:
        session.sparkContext.setLogLevel("ERROR")
        harness.wait_for_executors(session, WORKERS)
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def digits():
    """(train, test) DataSets of scikit-learn's digits, flat features (as tests/spark's fixture)."""
    from sparkgrad.datasets import load_digits

    return load_digits(test_fraction=0.2, seed=0, shape="flat")


@pytest.fixture(scope="module")
def shared_master(cluster: harness.ClusterInfo):
    """``shared_master(**kwargs)``: a SharedTrainingMaster whose controller listens on a free port (the
    default) of the bridge address (found through the bridge's network mask), minibatches of 16, training
    stats on."""
    from sparkgrad.spark import SharedTrainingMaster, VoidConfiguration

    def make(**kwargs):
        options = {"batch_size_per_worker": BATCH, "collect_training_stats": True, "rng_seed": 3, **kwargs}
        return SharedTrainingMaster(VoidConfiguration(network_mask=str(harness.SUBNET)), **options)

    return make
