"""Pieces shared by both training masters and SparkMultiLayer: network snapshots shipped to executors,
user code shipped by value, data preparation (Export/Direct/Auto), error translation and Hadoop file-system
helpers."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad.data import rebatch
from sparkgrad.errors import EnvironmentNotReadyError, TrainingError
from sparkgrad.spark.config import RDDTrainingApproach, storage_level
from sparkgrad.spark.partitioning import partition_sizes
from sparkgrad.spark.stats import SparkTrainingStats, Timer

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

    from sparkgrad._config import Config
    from sparkgrad.nn._flat_network import FlatNetwork


_log = logging.getLogger(__name__)


@dataclass
class NetworkSnapshot:
    """What an executor needs to rebuild a network: its type, conf JSON, parameters, updater state and
    counters. Every network type with a flat parameter buffer (``MultiLayerNetwork``,
    ``ComputationGraph``) travels the same way, so both training masters serve all of them."""

    network_type: str
    conf_json: str
    params: np.ndarray
    updater_state: np.ndarray | None
    iteration: int
    epoch: int

    @classmethod
    def of(cls, network: Any, with_updater: bool = True) -> NetworkSnapshot:
        """Snapshot ``network`` (arrays copied)."""
        state = network.updater_state().copy() if with_updater else None
        return cls(
            type(network).__name__,
            network.conf.to_json(),
            network.params().copy(),
            state,
            int(network.iteration_count),
            int(network.epoch_count),
        )

    def build(self, params: np.ndarray | None = None, device: str = "cpu") -> Any:
        """A fresh network from this snapshot.

        Args:
            params: overrides the snapshot's parameters.
            device: ``"cpu"`` or ``"cuda:N"`` (see :mod:`sparkgrad.spark.devices`): the network is built
                in host memory and moved there, parameters, gradients and updater state.

        Returns:
            The network.
        """
        network_cls, conf_cls = network_classes(self.network_type)
        net = network_cls(conf_cls.from_json(self.conf_json))
        # both copy into the network's own buffers: a 17M-parameter model's snapshot is 200 MB
        net.init(self.params if params is None else params)
        if self.updater_state is not None and self.updater_state.size:
            net.set_updater_state(self.updater_state)
        net.iteration_count, net.epoch_count = self.iteration, self.epoch
        if device != "cpu":
            net.to(device)
        return net


_CONFIGURATION_OF = {
    "MultiLayerNetwork": "MultiLayerConfiguration",
    "ComputationGraph": "ComputationGraphConfiguration",
}


def network_classes(network_type: str) -> tuple[type[FlatNetwork], type[Config]]:
    """``(network class, configuration class)`` of a network type name."""
    from sparkgrad import nn

    if network_type not in _CONFIGURATION_OF:
        raise ValueError(f"network type: expected one of {sorted(_CONFIGURATION_OF)}, got {network_type!r}")
    return getattr(nn, network_type), getattr(nn, _CONFIGURATION_OF[network_type])


class ByValue:
    """A user object (loader, hook) that travels to the executors pickled with cloudpickle.

    Spark broadcasts use the standard pickle, which stores functions and classes by module name, so a
    lambda, a closure or anything defined in a notebook or ``__main__`` cannot be loaded on an
    executor. cloudpickle (``pyspark.cloudpickle``, shipped with pyspark) stores those by value and
    keeps importable ones by reference. The wrapper calls and forwards attributes to the object, and
    unpickles as the bare object.

    Args:
        obj: the object to ship.
    """

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.obj(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "obj":  # not set yet (copy/unpickle probing): avoid recursing into ourselves
            raise AttributeError(name)
        return getattr(self.obj, name)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        from pyspark import cloudpickle

        return cloudpickle.loads, (cloudpickle.dumps(self.obj),)


def by_value(obj: Any) -> Any:
    """``obj`` wrapped in :class:`ByValue` (None and already wrapped objects are returned as they are)."""
    return obj if obj is None or isinstance(obj, ByValue) else ByValue(obj)


def spark_context(spark: Any) -> SparkContext:
    """The SparkContext of a SparkSession or SparkContext."""
    from pyspark import SparkContext

    if isinstance(spark, SparkContext):
        return spark
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        raise EnvironmentNotReadyError(
            "spark: a Spark Connect session (SparkSession.builder.remote(...), Databricks shared or "
            "serverless compute) has no SparkContext, which this operation needs (RDDs, broadcasts); "
            "over Connect, fit DataFrames (SparkMultiLayer/SparkComputationGraph.fit(df), the sparkgrad.ml "
            "estimators), or use a classic SparkSession (a dedicated cluster, spark-submit, pyspark without "
            "remote()); see docs/guides/cluster.md (Running on managed Spark)"
        )
    sc = getattr(spark, "sparkContext", None)
    if isinstance(sc, SparkContext):
        return sc
    raise TypeError(f"spark: expected a SparkSession or SparkContext, got {type(spark).__name__}")


_PY_ERROR = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception)): (.*)$", re.MULTILINE)
_MISSING_MODULE = re.compile(
    r"^(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'", re.MULTILINE
)
# Spark loggers that print a task's whole Python and Java trace (once per failed or killed task)
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.internal.io.SparkHadoopWriter",  # a failed export's task, reported by run_spark
)
_quiet_lock = threading.Lock()
_quiet_depth = 0
_quiet_saved: dict[str, Any] = {}

SHIP_HINT = (
    "every executor needs the driver's Python environment: on YARN/Kubernetes/standalone, pack the "
    "virtualenv (venv-pack -o env.tar.gz) and submit with --archives env.tar.gz#env and "
    "--conf spark.pyspark.python=./env/bin/python, or install the same sparkgrad wheel (and its "
    "dependencies) on every node; see docs/guides/cluster.md (Running on a cluster)"
)


def executor_error(what: str, text: str) -> TrainingError:
    """The TrainingError for an executor failure Spark reported as ``text``.

    Its first line is the Python exception raised on the executor (``ValueError: ...``); then what
    failed, and the executor's Python frames outside PySpark. An executor whose Python cannot import
    sparkgrad or one of its dependencies gets :data:`SHIP_HINT` instead.

    Args:
        what: what was running ("training", "evaluation", ...).
        text: Spark's report of the failure (a PythonException or Py4JJavaError message).
    """
    missing = _MISSING_MODULE.search(text)
    if missing is not None:
        return TrainingError(
            f"ModuleNotFoundError: No module named {missing.group(1)!r} on an executor\n"
            f"{what} failed: the executors' Python cannot import a module the job needs (sparkgrad, its "
            f"dependencies or your own code); {SHIP_HINT}"
        )
    found = _PY_ERROR.findall(text)
    cause = f"{found[-1][0]}: {found[-1][1]}" if found else text.strip().splitlines()[0]
    frames = _user_frames(text)
    lines = [cause, f"({what} failed on an executor; Spark's Java trace is logged at DEBUG level)"]
    if frames:
        lines.append("executor traceback (most recent call last):")
        lines.extend(frames)
    return TrainingError("\n".join(lines))


def _user_frames(text: str) -> list[str]:
    """The ``File ...`` lines (with their source line) of the last Python traceback, PySpark's dropped."""
    tail = text.rsplit("Traceback (most recent call last):", 1)
    if len(tail) < 2:
        return []
    out: list[str] = []
    keep = False
    for line in tail[1].lstrip("\n").splitlines():
        if line.startswith("  File "):
            keep = "pyspark" not in line
            if keep:
                out.append(line)
        elif keep and line.startswith("    ") and line.strip().strip("^~") != "":
            out.append(line)
        elif not line.startswith(" "):
            break
    return out


def _quiet_log4j(sc: Any, levels: dict[str, str]) -> dict[str, Any]:
    """Raise log4j2 loggers to at least the given levels (a logger already as quiet is left alone).

    Returns:
        What :func:`_restore_log4j` needs: per changed logger its own previous level, or None when it had
        no configuration of its own (it is removed again, so Spark's console threshold and a later
        ``sc.setLogLevel`` treat it as before). Empty without log4j2.
    """
    from py4j.protocol import Py4JError

    try:
        jvm = sc._jvm
        manager = jvm.org.apache.logging.log4j.LogManager
        config = manager.getContext(False).getConfiguration()
        wanted = {name: jvm.org.apache.logging.log4j.Level.getLevel(level) for name, level in levels.items()}
        # log4j2: a smaller intLevel is quieter
        wanted = {
            n: lv for n, lv in wanted.items() if manager.getLogger(n).getLevel().intLevel() > lv.intLevel()
        }
        saved = {}
        for name in wanted:  # all read before anything changes: a failure leaves every level as it was
            own = config.getLoggerConfig(name)
            saved[name] = own.getExplicitLevel() if own.getName() == name else None
        for name, level in wanted.items():
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
        return saved
    except Py4JError:  # another logging backend: Spark's own output stays as configured
        return {}


def _restore_log4j(sc: Any, saved: dict[str, Any]) -> None:
    """Undo :func:`_quiet_log4j`."""
    from py4j.protocol import Py4JError

    try:
        jvm = sc._jvm
        context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
        for name, level in saved.items():
            if level is None:
                context.getConfiguration().removeLogger(name)
            else:
                jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
        context.updateLoggers()
    except Py4JError as exc:  # the JVM went away meanwhile: nothing left to restore
        _log.debug("restoring Spark's log levels failed: %s", exc)


@contextmanager
def quiet_task_failures(sc: Any) -> Iterator[None]:
    """While sparkgrad's Spark jobs run, Spark logs at WARN and above only, and does not print the
    Python + Java trace of every failed task: the failure reaches the caller as one TrainingError
    (:func:`executor_error`). With the ``sparkgrad`` logger at DEBUG, Spark's output is left as it is.
    Nested and concurrent uses restore the levels once, when the last one ends.
    """
    global _quiet_depth, _quiet_saved
    if _log.isEnabledFor(logging.DEBUG) or getattr(sc, "_jvm", None) is None:
        yield
        return
    with _quiet_lock:
        if _quiet_depth == 0:
            _quiet_saved = _quiet_log4j(
                sc, {"org.apache.spark": "WARN", **dict.fromkeys(_TASK_FAILURE_LOGGERS, "FATAL")}
            )
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0 and _quiet_saved and getattr(sc, "_jvm", None) is not None:
                _restore_log4j(sc, _quiet_saved)
                _quiet_saved = {}


def run_spark(what: str, action: Callable[[], Any]) -> Any:
    """Run a Spark action; an executor-side Python error becomes one TrainingError quoting it.

    The TrainingError's first line is the executor's Python exception (:func:`executor_error`); Spark's
    own report with the Java trace goes to this module's logger at DEBUG level, and is not chained, so an
    uncaught failure prints a few lines, not a JVM stack trace.

    Args:
        what: short description for the message ("training", "evaluation", ...).
        action: the zero-argument callable running the Spark action.

    Returns:
        The action's result.
    """
    from py4j.protocol import Py4JJavaError
    from pyspark import SparkContext
    from pyspark.errors import PySparkException, PythonException

    sc = SparkContext._active_spark_context
    with quiet_task_failures(sc), _job_group(sc) as group:
        try:
            return action()
        except (Py4JJavaError, PySparkException) as exc:
            # a Spark Connect client gets an executor's error as a SparkException carrying its text
            connect = type(exc).__module__.startswith("pyspark.errors.exceptions.connect")
            if not (isinstance(exc, (Py4JJavaError, PythonException)) or connect):
                raise
            text = str(exc.java_exception) if isinstance(exc, Py4JJavaError) else str(exc)
            _log.debug("%s failed on an executor; Spark's report:\n%s", what, exc)
            error = executor_error(what, text)
            # Spark kills the failed job's other tasks after failing it: a caller that then destroyed the
            # broadcasts they read made Spark log internal errors with Java traces ("Block broadcast_N
            # does not exist") as they ended, after the quiet logging above was over
            _await_job_tasks(sc, group)
    raise error


# how long a failed action waits for its job's remaining tasks to end (Python tasks are killed within
# spark.python.task.killTimeout, 2 s by default, of their cancellation)
_TASKS_END_WAIT_S = 30.0


@contextmanager
def _job_group(sc: Any) -> Iterator[str | None]:
    """The job group of the calling thread's Spark jobs: its own when it has one, else a fresh one for the
    duration (None without a SparkContext)."""
    if getattr(sc, "_jsc", None) is None:
        yield None
        return
    current = sc.getLocalProperty("spark.jobGroup.id")
    if current is not None:
        yield current
        return
    group = f"sparkgrad-{uuid.uuid4().hex}"
    sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield group
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


def _await_job_tasks(sc: Any, group: str | None) -> None:
    """Wait, at most _TASKS_END_WAIT_S, until no task of the group's jobs runs (a caller's group may hold
    earlier jobs too: their stages have none)."""
    if group is None:
        return
    tracker = sc.statusTracker()
    jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    stages = [stage for info in jobs if info is not None for stage in info.stageIds]
    deadline = time.monotonic() + _TASKS_END_WAIT_S
    while time.monotonic() < deadline:
        infos = [tracker.getStageInfo(stage) for stage in stages]
        if all(info is None or info.numActiveTasks == 0 for info in infos):
            return
        time.sleep(0.05)
    _log.debug("tasks of job group %s still running %.0f s after it failed", group, _TASKS_END_WAIT_S)


def use_driver_interpreter(sc: SparkContext) -> None:
    """With a local master, run the Python workers with the driver's interpreter.

    PySpark starts its workers with ``python3`` from the PATH unless PYSPARK_PYTHON or
    ``spark.pyspark.python`` says otherwise; a driver started as ``venv/bin/python`` without activating
    the venv then gets workers that cannot import sparkgrad's dependencies. In local mode the workers
    run on this machine, so the driver's own interpreter is always right; a choice the user made (either
    setting) is kept. On a cluster nothing changes (see :data:`SHIP_HINT`).
    """
    if not str(sc.master).startswith("local"):
        return
    if os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python"):
        return
    if sc.pythonExec != sys.executable:
        _log.info("local master: Python workers use the driver's interpreter %s", sys.executable)
        sc.pythonExec = sys.executable  # read for every new Python RDD


def ensure_logging() -> None:
    """Show sparkgrad's INFO messages (progress, data preparation) when the application configured no
    logging: a stderr handler on the ``sparkgrad`` logger, added once. An application that configures
    logging (a handler on the root logger or on ``sparkgrad``) keeps full control."""
    root, ours = logging.getLogger(), logging.getLogger("sparkgrad")
    if root.handlers or ours.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s sparkgrad %(levelname)s %(message)s", "%H:%M:%S"))
    ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)


def hadoop_delete(sc: SparkContext, path: str) -> bool:
    """Recursively delete ``path`` through the Hadoop FileSystem API (any file system Spark can use).

    Returns:
        True when something was deleted (False when ``path`` did not exist).
    """
    jvm: Any = sc._jvm
    jpath = jvm.org.apache.hadoop.fs.Path(path)
    return bool(jpath.getFileSystem(sc._jsc.hadoopConfiguration()).delete(jpath, True))


def default_export_root(sc: SparkContext) -> str:
    """``hadoop.tmp.dir/sparkgrad`` (DL4J's default export location)."""
    tmp = sc._jsc.hadoopConfiguration().get("hadoop.tmp.dir")
    return f"{tmp or '/tmp'}/sparkgrad"


def first_element(rdd: RDD, what: str) -> Any:
    """The first element of ``rdd``; ValueError naming ``what`` when the RDD is empty."""
    got = run_spark(f"reading {what}", lambda: rdd.take(1))
    if not got:
        raise ValueError(f"{what}: the RDD is empty, there is nothing to train on")
    return got[0]


def check_dataset_matches(network: Any, sample: Any, what: str) -> None:
    """Fail on the driver, before any training, when ``sample`` does not fit ``network``.

    Args:
        network: the network to train (a MultiLayerNetwork trains on DataSets, a ComputationGraph on
            DataSets when it has one input and one output, and on MultiDataSets).
        sample: the first element of the data.
        what: the argument name for messages.
    """
    from sparkgrad.data import DataSet, MultiDataSet

    accepted = (DataSet, MultiDataSet) if type(network).__name__ == "ComputationGraph" else (DataSet,)
    if not isinstance(sample, accepted):
        from pyspark.sql import Row

        names = " or ".join(f"sparkgrad.data.{c.__name__}" for c in accepted)
        # df.rdd holds Rows: the DataFrame itself is what fit converts
        hint = (
            "; to train on a DataFrame, pass the DataFrame itself: fit(df, features_col=..., label_col=...)"
            if isinstance(sample, Row)
            else ""
        )
        raise TypeError(
            f"{what}: expected an RDD of {names}, found elements of type {type(sample).__name__}{hint}"
        )
    multi = isinstance(sample, MultiDataSet)
    features = sample.features if multi else [sample.features]
    labels = (sample.labels if multi else [sample.labels]) if sample.labels is not None else []
    if not labels or any(y is None for y in labels):
        raise ValueError(f"{what}: the {type(sample).__name__}s have no labels, training needs labels")
    try:
        outputs = network.output(*[f[:1] for f in features])
    except (ValueError, TypeError) as exc:
        shapes = ", ".join(str(np.shape(f)) for f in features)
        raise ValueError(f"{what}: features of shape {shapes} do not fit the network: {exc}") from exc
    outputs = outputs if isinstance(outputs, list) else [outputs]
    if len(labels) != len(outputs):
        raise ValueError(f"{what}: {len(labels)} labels arrays, the network has {len(outputs)} outputs")
    for i, (y, out) in enumerate(zip(labels, outputs)):
        if y.ndim == out.ndim and y.shape[1] != out.shape[1]:
            name = f"labels[{i}]" if multi else "labels"
            raise ValueError(f"{what}: {name} have {y.shape[1]} columns, the network outputs {out.shape[1]}")


# -- data preparation ------------------------------------------------------------------------------------
def load_unit(kind: str, loader: Any, unit: Any) -> Any:
    """Turn one element of a training RDD into a (Multi)DataSet.

    Kinds: "dataset" (the element itself), "bytes" (a ``(name, saved bytes)`` pair, read with the
    ``loader`` of the saved kind, ``SerializedDataSetLoader()`` or ``SerializedMultiDataSetLoader()``)
    or "path" (``loader(path)``).
    """
    if kind == "dataset":
        return unit
    if kind == "bytes":
        return loader.load_bytes(unit[1], source=unit[0])
    return loader(unit)


def worker_batches(
    units: Iterable[Any], kind: str, loader: Any, batch_size: int, prefetch: int
) -> Iterator[Any]:
    """The minibatches a worker trains on: load, re-batch to ``batch_size``, optionally prefetch."""
    batches = rebatch((load_unit(kind, loader, u) for u in units), batch_size)
    if prefetch > 0:
        from sparkgrad.data import AsyncDataSetIterator

        return iter(AsyncDataSetIterator(batches, prefetch=prefetch))
    return batches


@dataclass
class TrainingData:
    """A training RDD ready for the workers.

    ``kind`` says what the elements are ("dataset", "bytes" = (name, exported DataSet bytes), "path"),
    ``examples_per_unit`` how many examples each element holds (for split and partition sizing),
    ``counts`` the number of elements in every partition of ``rdd``, ``exported`` whether the data was
    exported to files (``rdd`` then reads them back).
    """

    rdd: RDD
    kind: str
    loader: Any
    examples_per_unit: int
    num_units: int
    counts: list[int]
    exported: bool = False


# Default of the masters' ``direct_memory_budget_mb``: AUTO trains directly from RDDs up to this size.
DEFAULT_DIRECT_MEMORY_BUDGET_MB = 512
MIB = 1 << 20
# Stats counter of every fit: 1 when the data was exported to files, 0 when trained directly.
APPROACH_EXPORT_COUNTER = "training_approach_export"


class TrainingMasterBase:
    """Export/Direct/Auto data handling and temp-file bookkeeping common to both training masters.

    Subclasses are dataclasses with the fields ``batch_size_per_worker``, ``rdd_data_set_num_examples``,
    ``rdd_training_approach``, ``export_directory``, ``storage_level``, ``storage_level_streams`` and
    ``direct_memory_budget_mb``
    (a subclass without the last field uses :data:`DEFAULT_DIRECT_MEMORY_BUDGET_MB`).
    """

    batch_size_per_worker: int
    rdd_data_set_num_examples: int
    rdd_training_approach: RDDTrainingApproach
    export_directory: str | None
    storage_level: str
    storage_level_streams: str
    direct_memory_budget_mb: int = DEFAULT_DIRECT_MEMORY_BUDGET_MB

    def _runtime_init(self) -> None:
        self._uid = uuid.uuid4().hex[:12]
        self._export_state: tuple[int, str, int] | None = None  # (rdd id, directory, batch count)
        self._export_root: str | None = None  # this master's export directory once an export started
        self._persisted: list[RDD] = []
        self._prepared: tuple[tuple[Any, ...], TrainingData] | None = None  # (source key, data)
        self.last_stats: SparkTrainingStats | None = None

    def delete_temp_files(self, spark: Any) -> bool:
        """Delete this master's export files (through the Hadoop FileSystem API), including those of an
        export that failed half-way, and release the training data kept persisted between fits of the
        same RDD. Idempotent; the next fit prepares its data again.

        Args:
            spark: SparkSession or SparkContext.

        Returns:
            True when files were deleted.
        """
        self._unpersist()
        self._export_state = None
        root, self._export_root = self._export_root, None
        return root is not None and hadoop_delete(spark_context(spark), root)

    def _export_dir(self, sc: SparkContext) -> str:
        root = self.export_directory or default_export_root(sc)
        return f"{root.rstrip('/')}/{self._uid}"

    def _storage_level_for(self, kind: str) -> str:
        """Storage level of a training RDD whose elements are of ``kind``: files are streamed again."""
        return self.storage_level if kind == "dataset" else self.storage_level_streams

    def _export(
        self, sc: SparkContext, rdd: RDD, stats: SparkTrainingStats | None, timer_key: str
    ) -> tuple[str, int]:
        """Batch ``rdd`` into records of ``batch_size_per_worker`` examples once per RDD; reuse afterwards."""
        if self._export_state is None or self._export_state[0] != rdd.id():
            if self._export_root is not None:  # files of another RDD, or of an export that failed
                hadoop_delete(sc, self._export_root)
            self._export_state = None
            self._export_root = self._export_dir(sc)
            path = f"{self._export_root}/{rdd.id()}"
            from sparkgrad.spark.storage import export_minibatches  # storage imports this module

            with Timer(stats, timer_key):
                count = export_minibatches(rdd, path, batch_size=self.batch_size_per_worker)
            self._export_state = (rdd.id(), path, count)
        return self._export_state[1], self._export_state[2]

    def prepare(
        self,
        sc: SparkContext,
        rdd: RDD,
        kind: str,
        loader: Any,
        stats: SparkTrainingStats | None,
        timer_key: str,
        count_key: str | None = None,
    ) -> TrainingData:
        """The training data of one fit.

        A DataSet RDD is exported (batched and written once as sequence files of DataSet bytes
        through Spark's Hadoop I/O, so any file system works, then read back) in EXPORT mode, and in
        AUTO mode when the size of its arrays exceeds ``direct_memory_budget_mb``; otherwise, and for
        every RDD of paths, the RDD is used as is. The result is persisted at the master's storage
        level for its element kind and counted (the counting job also sums the arrays' sizes, so AUTO
        decides without an extra job), and kept (persisted, counts known)
        for the next fits of the same RDD, so those start no Spark job here; it is released when a
        fit uses other data or by :meth:`delete_temp_files`. ``timer_key`` and ``count_key`` name the
        stats of the export and of the count; every fit also counts
        :data:`APPROACH_EXPORT_COUNTER` (1 exported, 0 direct) in ``stats``. With a Spark Connect
        session ``rdd`` is a DataFrame of serialized DataSets, persisted and counted as it is
        (:func:`sparkgrad.spark.connect.connect_training_data`).
        """
        from sparkgrad.spark.connect import connect_training_data, is_connect

        if is_connect(sc):  # persisted until the next fit or the model's close(), not reused
            self._unpersist()
            data = connect_training_data(rdd, kind, loader, self.rdd_data_set_num_examples)
            self._persisted.append(data.rdd)
            return data
        key = (
            sc.applicationId,
            rdd.id(),
            kind,
            self.rdd_training_approach,
            self.direct_memory_budget_mb,
            self.batch_size_per_worker,
            self.rdd_data_set_num_examples,
            self._storage_level_for(kind),
        )
        if self._prepared is not None and self._prepared[0] == key:
            data = replace(self._prepared[1], loader=loader)
        else:
            self._unpersist()
            data = self._prepare_new(sc, rdd, kind, loader, stats, timer_key, count_key)
            self._prepared = (key, data)
        if stats is not None:
            stats.count(APPROACH_EXPORT_COUNTER, float(data.exported))
        return data

    def _prepare_new(
        self,
        sc: SparkContext,
        rdd: RDD,
        kind: str,
        loader: Any,
        stats: SparkTrainingStats | None,
        timer_key: str,
        count_key: str | None,
    ) -> TrainingData:
        approach = self.rdd_training_approach if kind == "dataset" else RDDTrainingApproach.DIRECT
        if approach != RDDTrainingApproach.EXPORT:
            data, nbytes = self._persist_and_count(
                rdd, kind, loader, self.rdd_data_set_num_examples, count_key, stats
            )
            budget = self.direct_memory_budget_mb * MIB
            if approach == RDDTrainingApproach.DIRECT or nbytes <= budget:
                if kind == "dataset":
                    _log.info(
                        "training data: %d DataSets, %.1f MiB of arrays, rdd_training_approach=%s: "
                        "training directly from the RDD",
                        data.num_units,
                        nbytes / MIB,
                        approach.value,
                    )
                return data
            _log.info(
                "training data: %d DataSets, %.1f MiB of arrays, above direct_memory_budget_mb=%d: "
                "exporting it to files",
                data.num_units,
                nbytes / MIB,
                self.direct_memory_budget_mb,
            )
            rdd = data.rdd
        else:
            _log.info("training data: rdd_training_approach=export: exporting it to files")
        from sparkgrad.spark.storage import read_saved  # storage imports this module

        path, _ = self._export(sc, rdd, stats, timer_key)
        self._unpersist()  # the source (if persisted for the size estimate) is no longer needed
        data, _ = self._persist_and_count(
            read_saved(sc, path), "bytes", loader, self.batch_size_per_worker, count_key, stats
        )
        return replace(data, exported=True)

    def _persist_and_count(
        self,
        rdd: RDD,
        kind: str,
        loader: Any,
        per_unit: int,
        count_key: str | None,
        stats: SparkTrainingStats | None,
    ) -> tuple[TrainingData, int]:
        """Persist ``rdd`` (unless cached already) and count it: the data and the bytes of its arrays."""
        if not rdd.is_cached:
            level = storage_level(self._storage_level_for(kind))
            if level != storage_level("NONE"):
                rdd = rdd.persist(level)
                self._persisted.append(rdd)
        with Timer(stats if count_key else None, count_key or ""):
            sizes = run_spark("counting the data", lambda: partition_sizes(rdd))
        counts = [c for c, _, _ in sizes]
        if sum(counts) == 0:
            raise ValueError("data: the RDD is empty, there is nothing to train on")
        examples = sum(e for _, _, e in sizes)
        if kind == "dataset" and examples >= 2 * per_unit * sum(counts):
            # DL4J's meaning kept (the setting sizes partitions and averaging rounds), but said: with
            # DataSets of a minibatch each and the default 1, a fit trains fewer workers or averages less
            # often than its settings suggest
            _log.warning(
                "the RDD's DataSets hold %.4g examples each on average but rdd_data_set_num_examples=%d: "
                "partitions and averaging rounds are sized as if each held %d (fewer workers train, or "
                "parameters are averaged less often, than batch_size_per_worker and averaging_frequency "
                "suggest); set rdd_data_set_num_examples to the examples of one DataSet",
                examples / sum(counts),
                per_unit,
                per_unit,
            )
        return TrainingData(rdd, kind, loader, per_unit, sum(counts), counts), sum(b for _, b, _ in sizes)

    def _unpersist(self) -> None:
        """Release the training data persisted by :meth:`prepare`."""
        for rdd in self._persisted:
            rdd.unpersist()
        self._persisted = []
        self._prepared = None


def fit_minibatch(net: Any, ds: Any, hooks: Iterable[Any]) -> float:
    """Parameter averaging's local step on a worker: the hooks' ``pre_update``, one update per segment
    (truncated BPTT), the hooks' ``post_update``; returns the last segment's score."""
    for hook in hooks:
        hook.pre_update(ds, net)
    for batch in net._training_batches([ds]):
        score, _ = net._fit_step(batch)  # in place: an embedding table's step stays row-sparse
    for hook in hooks:
        hook.post_update(ds, net)
    return float(score)


def ceil_div(a: int, b: int) -> int:
    """Ceiling of a / b for non-negative integers."""
    return -(-a // b)


def mean_or_none(total: np.ndarray | None, count: int) -> np.ndarray | None:
    """``total / count`` or None."""
    return None if total is None or count == 0 else total / count


def process_tag() -> str:
    """host:pid of this process (names workers in logs and stats)."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


__all__ = [
    "APPROACH_EXPORT_COUNTER",
    "DEFAULT_DIRECT_MEMORY_BUDGET_MB",
    "ByValue",
    "NetworkSnapshot",
    "TrainingData",
    "TrainingMasterBase",
    "by_value",
    "ceil_div",
    "check_dataset_matches",
    "ensure_logging",
    "executor_error",
    "first_element",
    "fit_minibatch",
    "hadoop_delete",
    "load_unit",
    "network_classes",
    "mean_or_none",
    "process_tag",
    "quiet_task_failures",
    "run_spark",
    "spark_context",
    "use_driver_interpreter",
    "worker_batches",
]
