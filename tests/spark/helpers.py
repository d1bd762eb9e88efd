"""Small networks and data helpers shared by the Spark tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sparkgrad.data import DataSet
from sparkgrad.nn import (
    ComputationGraphConfiguration,
    DenseLayer,
    ElementWiseVertex,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
)
from sparkgrad.nn.updaters import Adam
from sparkgrad.spark import TrainingHook


def mlp_conf(
    hidden: int = 128, seed: int = 1, n_out: int = 10, loss: str = "mcxent", activation: str = "softmax"
) -> MultiLayerConfiguration:
    return MultiLayerConfiguration(
        [DenseLayer(hidden, activation="relu"), OutputLayer(n_out, activation=activation, loss=loss)],
        input_type=InputType.feed_forward(64),
        updater=Adam(1e-2),
        seed=seed,
    )


def residual_graph(
    n_in: int, n_out: int, activation: str = "softmax", loss: str = "mcxent"
) -> ComputationGraphConfiguration:
    """input -> dense -> dense, added back to the first dense (a skip connection) -> output; for 64
    inputs and 10 outputs the graph example of docs/guides/spark-ml.md."""
    return (
        ComputationGraphConfiguration.builder(updater=Adam(5e-3), seed=42)
        .add_inputs("pixels")
        .set_input_types(InputType.feed_forward(n_in))
        .add_layer("d1", DenseLayer(128, activation="relu"), "pixels")
        .add_layer("d2", DenseLayer(128, activation="relu"), "d1")
        .add_vertex("skip", ElementWiseVertex("add"), "d1", "d2")
        .add_layer("digit", OutputLayer(n_out, activation=activation, loss=loss), "skip")
        .set_outputs("digit")
        .build()
    )


def local_network(train: DataSet, epochs: int = 2) -> MultiLayerNetwork:
    """A network trained locally (fast) for the inference/evaluation tests."""
    net = MultiLayerNetwork(mlp_conf()).init()
    for _ in range(epochs):
        net.fit(train.split(32))
    return net


def subset(ds: DataSet, n: int) -> DataSet:
    return DataSet(ds.features[:n], ds.labels[:n])


def accuracy(net: MultiLayerNetwork, test: DataSet) -> float:
    return float(np.mean(net.output(test.features).argmax(1) == test.labels.argmax(1)))


def port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RecordingHook(TrainingHook):
    """Writes one file per update (hooks run on the executors): pre-<unique id>-<examples>."""

    directory: str = ""

    def pre_update(self, dataset, network) -> None:
        name = f"pre-{uuid.uuid4().hex}-{dataset.num_examples()}"
        open(os.path.join(self.directory, name), "w").close()

    def post_update(self, dataset, network) -> None:
        if network.iteration_count < 1:
            raise AssertionError("post_update before any iteration")


class ThreadsSeen:
    """An evaluation recording the native thread count (sparkgrad.get_num_threads) of every thread that
    evaluated a batch: what an executor's evaluation task ran with."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def eval(self, labels, predictions, mask=None) -> None:
        import sparkgrad

        self.seen.add(sparkgrad.get_num_threads())

    def merge(self, other: ThreadsSeen) -> None:
        self.seen |= other.seen


def threads_column(out: np.ndarray) -> dict[str, np.ndarray]:
    """with_network_outputs' ``outputs``: the native thread count of the task, once per row."""
    import sparkgrad

    return {"threads": np.full(len(out), float(sparkgrad.get_num_threads()))}


def small_network() -> MultiLayerNetwork:
    """A small digits MLP, built where it is called (an executor's ``network_of``)."""
    return MultiLayerNetwork(mlp_conf(hidden=8)).init()


class NpzLoader:
    """A custom fit_paths loader: .npz files with arrays x and y."""

    def __call__(self, path: str) -> DataSet:
        with np.load(path) as z:
            return DataSet(z["x"], z["y"])


def foreign_address() -> str:
    """A documentation (TEST-NET) address that is not one of this machine's: never bindable here."""
    from sparkgrad.spark.config import _local_addresses

    local = set(_local_addresses())
    return next(a for a in ("192.0.2.1", "198.51.100.1", "203.0.113.1") if a not in local)


# -- float32 rounding bounds ----------------------------------------------------------------------
# Spark workers and the driver run the same network on different batch shapes and thread counts, so
# BLAS sums the dot products in different orders. Tests compare the two against a bound derived from
# float32 rounding (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., section 3.1):
# a dot product of n terms computed in ANY order in precision u differs from the exact value by at most
#     gamma(n) * sum_i |a_i b_i|,   gamma(n) = n u / (1 - n u),   u = 2^-24 (float32 unit roundoff).
# Two computations that are each within that bound of the exact value differ by at most twice it.
U32 = float(np.finfo(np.float32).eps) / 2


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n: relative error bound of n chained float roundings."""
    return n * u / (1 - n * u)


def dense_logit_error_bound(net: MultiLayerNetwork, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(z, bound): the output layer's pre-activations z of ``x`` (float64) and a bound on the float32
    rounding error of each, for a stack of dense layers with 1-Lipschitz hidden activations (relu).

    Layer l computes a = h W + b with a dot product of n_in products plus the bias (n_in + 1 roundings
    per component), so with the incoming error e of h:
        |error of a| <= gamma(n_in + 1) * (|h| |W| + |b|) + e |W|
    and relu passes e on unchanged (it is 1-Lipschitz).
    """
    from sparkgrad.nn import Activation

    flat = net.params().astype(np.float64)
    h = x.astype(np.float64)
    err = np.zeros_like(h)
    offset = 0
    for i, layer in enumerate(net.conf.layers):
        specs = layer.param_specs(net.conf.layer_input_types[i])
        (w_spec, b_spec) = specs
        w = flat[offset : offset + int(np.prod(w_spec.shape))].reshape(w_spec.shape)
        offset += w.size
        b = flat[offset : offset + b_spec.shape[0]]
        offset += b.size
        a = h @ w + b
        err = gamma(w.shape[0] + 1) * (np.abs(h) @ np.abs(w) + np.abs(b)) + err @ np.abs(w)
        if i == len(net.conf.layers) - 1:
            return a, err
        assert net.conf.setting(i, "activation") is Activation.RELU, "the bound assumes relu"
        h = np.maximum(a, 0.0)
    raise AssertionError("no output layer")


def softmax_xent_score_bound(z: np.ndarray, z_err: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Bound on |score(float32, one order) - score(float32, another order)| per example for softmax +
    MCXENT with one-hot labels, given logits z and their rounding-error bounds z_err.

    score = lse(z) - sum_j y_j z_j with lse(z) = max z + log(sum_j exp(z_j - max z)). Its gradient in z
    is p - y, whose 1-norm is at most sum|y| + 1 = 2, so logit errors move it by <= 2 max_j z_err_j.
    Evaluating it from z takes C + 6 roundings (C-term sum, subtract, exp and log at most 1 ulp = 2
    roundings each, add the maximum, subtract z_label), each on a quantity at most
    M = 2 max|z| + log C + |score| + 1. Both computations obey the bound, so their difference obeys
    twice it.
    """
    c = z.shape[1]
    score = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - (labels * z).sum(1)
    m = 2 * np.abs(z).max(1) + np.log(c) + np.abs(score) + 1
    one_side = (np.abs(labels).sum(1) + 1) * z_err.max(1) + gamma(c + 6) * m
    return 2 * one_side


def softmax_output_bound(z: np.ndarray, z_err: np.ndarray) -> np.ndarray:
    """Bound on the difference of two float32 softmax outputs p of logits z (per element).

    d p_k = p_k (d z_k - sum_j p_j d z_j), so logit errors move p_k by <= 2 p_k max_j z_err_j; the
    evaluation itself (subtract max, exp, C-term sum, divide) takes C + 5 roundings relative to p_k.
    Twice the one-sided bound covers two computations.
    """
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return 2 * p * (2 * z_err.max(1, keepdims=True) + gamma(z.shape[1] + 5))


def ambiguous_argmax(z: np.ndarray, z_err: np.ndarray) -> np.ndarray:
    """Examples whose predicted class two float32 computations may disagree on: the top two logits are
    closer than the two computations' logits can differ (2 z_err each, for either logit)."""
    top2 = np.sort(z, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0] <= 4 * z_err.max(1)


def auc_bound(p: np.ndarray, p_err: np.ndarray, positive: np.ndarray) -> float:
    """Largest change of an exact ROC AUC when the scores p of two computations differ by <= p_err:
    only (positive, negative) pairs closer than their combined error can change order (or tie), and
    each changes the AUC by at most 1 / (#pos * #neg)."""
    pos, neg = p[positive], p[~positive]
    close = np.abs(pos[:, None] - neg[None, :]) <= p_err[positive][:, None] + p_err[~positive][None, :]
    return float(close.sum()) / max(pos.size * neg.size, 1)


def submit_output(result: subprocess.CompletedProcess, chars: int = 4000) -> str:
    """What a spark-submit job said, for a failed test's message: the end of its stdout, where
    spark-submit passes its Python driver's stdout and stderr (a traceback included), and the JVM's own
    log lines (its stderr) that are not INFO."""
    jvm = [line for line in result.stderr.splitlines() if " INFO " not in line]
    return f"driver output:\n{result.stdout[-chars:]}\nJVM log, INFO left out:\n" + "\n".join(jvm)[-chars:]


def spark_submit() -> tuple[list[str], dict[str, str]]:
    """A ``spark-submit --master local[2]`` command (pip's, its Python workers on this interpreter, no UI)
    to extend with options and the job, and the environment the job needs to import this sparkgrad;
    skips the test without pyspark or Java 17+ (fails instead with SPARKGRAD_REQUIRE=java)."""
    # imported here: executors and spark-submit jobs import this module without tests/ on their path
    from prerequisites import require_java, require_or_skip

    require_java()
    import pyspark

    import sparkgrad

    here = Path(sys.executable).parent / "spark-submit"  # pip's pyspark installs it beside the interpreter
    submit = str(here) if here.exists() else shutil.which("spark-submit")
    require_or_skip("java", submit is not None, "pyspark's spark-submit is neither on PATH nor beside python")
    env = dict(os.environ)
    # the source tree in development (the installed package in CI): what the driver imports here
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(sparkgrad.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]
    )
    env["SPARK_HOME"] = str(Path(pyspark.__file__).resolve().parent)  # pip's pyspark is a Spark home
    env.pop("PYSPARK_PYTHON", None)
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    command = [submit, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}"]
    return [*command, "--conf", "spark.ui.enabled=false"], env
