"""``sparkgrad demo``: a convolutional network on the digits data with SharedTrainingMaster on local[2]."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from sparkgrad.errors import EnvironmentNotReadyError

MIN_JAVA = 17


def java_major_version() -> int | None:
    """Major version of the ``java`` Spark would start (JAVA_HOME first, else PATH); None if absent."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" means Java 8


def check_environment(remote: str | None = None) -> None:
    """Raise EnvironmentNotReadyError unless Java 17+, pyspark, pyzmq and scikit-learn are available;
    with ``remote`` (a Spark Connect URL) pyspark's Connect client instead of Java, unless the URL
    starts a local server (``local[...]``)."""
    if remote is not None:
        try:
            __import__("grpc")
        except ImportError:
            raise EnvironmentNotReadyError(
                "--remote needs pyspark's Spark Connect client: pip install 'sparkgrad[connect]'"
            ) from None
    version = java_major_version() if remote is None or remote.startswith("local") else MIN_JAVA
    if version is None or version < MIN_JAVA:
        found = (
            "no java executable was found (JAVA_HOME / PATH)" if version is None else f"found Java {version}"
        )
        raise EnvironmentNotReadyError(
            f"Java {MIN_JAVA}+ is required to run Spark; {found}. Install a JDK {MIN_JAVA} or newer "
            "and put it on PATH or set JAVA_HOME."
        )
    missing = []
    for module, package in (("pyspark", "pyspark"), ("zmq", "pyzmq"), ("sklearn", "scikit-learn")):
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise EnvironmentNotReadyError(f"the demo needs {', '.join(missing)}: pip install 'sparkgrad[demo]'")


@dataclass
class DemoResult:
    """What the demo measured."""

    accuracy: float
    epochs: int
    steps: int
    bytes_sent: int
    dense_bytes: int
    wall_s: float
    model_path: str
    stats_path: str


def demo_network(epochs: int = 6) -> Any:
    """conv 3x3 (16) -> max pool -> dense 64 -> softmax 10 on 1x8x8 digit images.

    Adam's learning rate is 5e-3, annealed to 1e-3 for the last of ``epochs`` epochs: over 30 runs
    (bench/results/demo_anneal/) the last epoch's test accuracy fell below the one before in 1 on Spark
    against 4 with a constant rate, and in none trained locally against 5.
    """
    from sparkgrad.nn import (
        ConvolutionLayer,
        DenseLayer,
        InputType,
        MultiLayerConfiguration,
        MultiLayerNetwork,
        OutputLayer,
        SubsamplingLayer,
    )
    from sparkgrad.nn.schedules import MapSchedule
    from sparkgrad.nn.updaters import Adam

    rates = {0: 5e-3}
    if epochs > 1:
        rates[epochs - 1] = 1e-3
    conf = MultiLayerConfiguration(
        [
            ConvolutionLayer(16, kernel_size=(3, 3), convolution_mode="same", activation="relu"),
            SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)),
            DenseLayer(64, activation="relu"),
            OutputLayer(10),
        ],
        input_type=InputType.convolutional(8, 8, 1),
        updater=Adam(MapSchedule("epoch", rates)),
        seed=12345,
    )
    return MultiLayerNetwork(conf).init()


def run_demo(output_dir: str, epochs: int = 6, port: int = 0, remote: str | None = None) -> DemoResult:
    """Train the demo network and write the model and the stats HTML into ``output_dir``.

    Args:
        output_dir: where model.zip and training-stats.html go (created if needed).
        epochs: passes over the training data.
        port: the controller's port (0: a free port); on 127.0.0.1 without ``remote``.
        remote: a Spark Connect URL (``sc://host:port``): train there, from a DataFrame, with the
            controller inside the first training task (:mod:`sparkgrad.spark.connect`; no accuracy per
            epoch then: the epochs end in that task). None: a local[2] Spark in this process.

    Returns:
        The measurements.
    """
    check_environment(remote)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from sparkgrad.datasets import load_digits
    from sparkgrad.spark import SharedTrainingMaster, SparkMultiLayer, VoidConfiguration

    os.makedirs(output_dir, exist_ok=True)
    start = time.monotonic()
    local_dir = tempfile.mkdtemp(prefix="sparkgrad-demo-")
    if remote is None:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("sparkgrad-demo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.local.dir", local_dir)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    else:
        spark = SparkSession.builder.remote(remote).getOrCreate()
    try:
        train, test = load_digits(test_fraction=0.2, seed=0, shape="image")
        master = SharedTrainingMaster(
            VoidConfiguration(unicast_port=port, controller_address=None if remote else "127.0.0.1"),
            batch_size_per_worker=16,
            collect_training_stats=True,
            rng_seed=7,
        )

        with SparkMultiLayer(spark, demo_network(epochs), master) as model:
            if remote is None:
                # accuracy after every epoch: logged, and charted in the report
                model.evaluation_data = test
                model.fit(spark.sparkContext.parallelize(train.split(1), 2), epochs=epochs)
                accuracy = model.evaluate(spark.sparkContext.parallelize(test.split(64), 2)).accuracy()
            else:
                model.fit(_digits_frame(spark, train).repartition(2), epochs=epochs)
                accuracy = model.evaluate(_digits_frame(spark, test)).accuracy()
            traffic = master.last_traffic  # every epoch in one Spark job, both ways
            steps = int(traffic["worker_minibatches"])
            sent = int(traffic["worker_bytes_sent"] + traffic["controller_bytes_sent"])
            stats = model.training_stats
    finally:
        spark.stop()
        shutil.rmtree(local_dir, ignore_errors=True)
    n = model.network.num_params()
    # a dense exchange of the same steps: every worker step sends N float32 values and the controller
    # relays them to the other worker
    dense = steps * n * 4 * 2
    model_path = os.path.join(output_dir, "model.zip")
    stats_path = os.path.join(output_dir, "training-stats.html")
    model.network.save(model_path)
    assert stats is not None  # the master collects training stats
    stats.export_html(stats_path)
    return DemoResult(accuracy, epochs, steps, sent, dense, time.monotonic() - start, model_path, stats_path)


def _digits_frame(spark: Any, data: Any) -> Any:
    """The digits as a DataFrame: each image's 64 values (channel, height, width order) and its class."""
    rows = [(x.ravel().tolist(), int(y)) for x, y in zip(data.features, data.labels.argmax(1))]
    return spark.createDataFrame(rows, "features array<float>, label int")


__all__ = ["DemoResult", "check_environment", "demo_network", "java_major_version", "run_demo"]
