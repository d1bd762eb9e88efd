"""SparkNetwork, the Spark layer every network type shares (:class:`~sparkgrad.spark.SparkMultiLayer`,
:class:`~sparkgrad.spark.SparkComputationGraph`): training, distributed evaluation, scoring and keyed
inference."""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import pickle
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar, cast

import numpy as np

from sparkgrad import get_num_threads, set_num_threads
from sparkgrad._config import check_int
from sparkgrad.data import SerializedDataSetLoader, rebatch
from sparkgrad.errors import EnvironmentNotReadyError
from sparkgrad.spark.checkpoint import Checkpoint, CheckpointConfig, FitCheckpoints
from sparkgrad.spark.columns import (
    dataframe_dataset_frame,
    dataframe_datasets,
    is_dataframe,
    linalg_rows,
    network_output,
    with_example_scores,
    with_network_outputs,
)
from sparkgrad.spark.common import (
    NetworkSnapshot,
    by_value,
    check_dataset_matches,
    ensure_logging,
    first_element,
    load_unit,
    network_classes,
    run_spark,
    spark_context,
    use_driver_interpreter,
)
from sparkgrad.spark.connect import Held, is_connect
from sparkgrad.spark.parameter_averaging import ParameterAveragingTrainingMaster
from sparkgrad.spark.shared import SharedTrainingMaster
from sparkgrad.spark.stats import SparkTrainingStats, epoch_callback_result
from sparkgrad.spark.storage import read_files, read_saved, reads_through_spark
from sparkgrad.spark.threads import in_task_threads
from sparkgrad.spark.tracking import FitListener, FitObservers, fit_listeners

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame

    from sparkgrad.nn import MultiLayerNetwork
    from sparkgrad.nn._flat_network import FlatNetwork

DEFAULT_EVAL_BATCH_SIZE = 64
_log = logging.getLogger(__name__)

# epoch_callback(epoch, network) -> truthy to stop after that epoch, or a mapping of metrics to record
# ({"accuracy": 0.95, "stop": False}); see sparkgrad.spark.stats.epoch_callback_result
NetT = TypeVar("NetT", bound="FlatNetwork")
T = TypeVar("T")
EpochCallback = Callable[[int, NetT], Any]

# Per executor process: network copies of the latest evaluation/inference broadcast.
_NETS: dict[str, list[MultiLayerNetwork]] = {}


@dataclass
class _InferenceJob:
    """Broadcast of evaluation / scoring / inference: one id per broadcast so executors cache networks."""

    key: str
    snapshot: NetworkSnapshot

    def networks(self, count: int) -> list[MultiLayerNetwork]:
        nets = _NETS.get(self.key)
        if nets is None:
            _NETS.clear()
            nets = _NETS[self.key] = []
        while len(nets) < count:
            nets.append(self.snapshot.build())
        return nets[:count]


def _first_network(shipped: Any) -> Any:
    """On an executor: the network of a broadcast (or a Connect plan's :class:`Held`) _InferenceJob."""
    return shipped.value.networks(1)[0]


def _frame_evaluations(
    frame: DataFrame, part: Callable[[Iterable[Any]], Iterator[list | None]]
) -> list | None:
    """``part``'s evaluations of every partition of a DataFrame of serialized DataSets (one job, the
    partitions' results pickled back and merged here)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from sparkgrad.data import DataSet

    def evaluate(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        units = (
            DataSet.from_bytes(value, source="DataFrame conversion")
            for batch in batches
            for value in batch.column(0).to_pylist()
        )
        for merged in part(units):
            yield pa.RecordBatch.from_pydict({"evaluations": [pickle.dumps(merged)]})

    schema = T.StructType([T.StructField("evaluations", T.BinaryType(), False)])
    rows = run_spark("evaluation", frame.mapInArrow(evaluate, schema).collect)
    result = None
    for row in rows:
        result = _merge_lists(result, pickle.loads(row[0]))
    return result


def _merge_lists(a: list | None, b: list | None) -> list | None:
    if a is None:
        return b
    if b is None:
        return a
    for x, y in zip(a, b):
        x.merge(y)
    return a


def example_ndim(input_type: Any) -> int:
    """Dimensions of one example of ``input_type`` (None: feed-forward) as a user passes it."""
    if input_type is None or input_type.kind in ("feed_forward", "convolutional_flat"):
        return 1
    return 3 if input_type.kind == "convolutional" else 2


def _release(sc: Any, master: Any, broadcasts: list[Any]) -> None:
    """Unpersist the broadcasts of lazy results and the master's persisted data, delete its exports."""
    while broadcasts:
        broadcasts.pop().unpersist()
    master.delete_temp_files(sc)


def _release_dropped(sc: Any, master: Any, broadcasts: list[Any]) -> None:
    """Finalizer of a dropped model: best effort, the SparkContext may already be stopped."""
    if getattr(sc, "_jsc", None) is None:
        return
    try:
        _release(sc, master, broadcasts)
    except Exception as exc:  # noqa: BLE001 - a finalizer must not raise; the cause is logged
        _log.warning("releasing the Spark resources of a dropped Spark model failed: %s", exc)


class SparkNetwork(Generic[NetT]):
    """A network with a flat parameter buffer trained and used on Spark: the one code path behind
    :class:`~sparkgrad.spark.SparkMultiLayer` and :class:`~sparkgrad.spark.SparkComputationGraph`.

    Subclasses name their network type; training (both masters, every data source), scoring,
    evaluation and inference are shared, so every feature of the Spark layer works for every type.
    The model keeps Spark resources between calls: the training data its training master persisted
    (reused by later fits of the same RDD), exported batch files, and the network broadcasts behind the
    lazy RDDs of ``score_examples``/``feed_forward_with_key``. :meth:`close` (or leaving a ``with``
    block) releases them all; the model stays usable afterwards and a later fit prepares its data again.
    A model that is dropped without ``close`` is released when it is garbage collected or at
    interpreter exit (best effort: nothing can be released once the SparkContext is stopped).

    Loaders and training hooks travel to the executors with cloudpickle, so lambdas, closures and
    functions defined in a notebook or ``__main__`` work wherever a loader or hook is accepted.

    Args:
        spark: SparkSession or SparkContext.
        network_or_conf: a network of the subclass's type, or its configuration (a network is built
            and initialised from it).
        training_master: ``SharedTrainingMaster`` or ``ParameterAveragingTrainingMaster``; default
            ``ParameterAveragingTrainingMaster()``.
    """

    _network_type: ClassVar[str]  # "MultiLayerNetwork" | "ComputationGraph"

    def __init__(self, spark: Any, network_or_conf: Any, training_master: Any = None) -> None:
        # a Spark Connect session has no SparkContext: its fits are DataFrame operations (spark.connect)
        self._connect = is_connect(spark)
        self._sc = spark if self._connect else spark_context(spark)
        if not self._connect:
            use_driver_interpreter(self._sc)
        ensure_logging()
        network_cls, conf_cls = network_classes(self._network_type)
        if isinstance(network_or_conf, conf_cls):
            network_or_conf = network_cls(network_or_conf).init()
        self.network = network_or_conf
        if training_master is None:
            training_master = ParameterAveragingTrainingMaster()
        if not isinstance(training_master, (SharedTrainingMaster, ParameterAveragingTrainingMaster)):
            raise TypeError(
                f"training_master: expected SharedTrainingMaster or ParameterAveragingTrainingMaster, "
                f"got {type(training_master).__name__}"
            )
        self._master = training_master
        self._score = float("nan")
        self._stats: SparkTrainingStats | None = None  # every fit's stats since creation or reset
        self._evaluation_data: Any = None
        self._default_eval_workers = 1
        self._broadcasts: list[Any] = []  # broadcasts behind lazy result RDDs, released by close()
        self._frame: tuple | None = None  # (DataFrame, columns, unit size, conf JSON, its DataSet RDD)
        self._fit_listeners: list[FitListener] = []
        self._finalizer = weakref.finalize(self, _release_dropped, self._sc, self._master, self._broadcasts)

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the Spark resources this model holds (see the class docstring). Idempotent.

        RDDs returned by ``score_examples``/``feed_forward_with_key`` stay computable after close (their
        network is broadcast again on use), only no longer cached on the executors.
        """
        _release(self._sc, self._master, self._broadcasts)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- properties ---------------------------------------------------------------------------
    @property
    def network(self) -> NetT:
        """The driver's network (trained in place by ``fit``)."""
        return self._network

    @network.setter
    def network(self, value: NetT) -> None:
        network_cls, _ = network_classes(self._network_type)
        if not isinstance(value, network_cls):
            raise TypeError(f"network: expected a {network_cls.__name__}, got {type(value).__name__}")
        self._network = value
        self._checked: tuple[str, int] | None = None  # the RDD whose first element fits this network

    @property
    def spark_context(self) -> Any:
        """The SparkContext."""
        return self._sc

    @property
    def training_master(self) -> Any:
        """The training master."""
        return self._master

    def score(self) -> float:
        """Average last-minibatch score of the workers in the last fit (nan before any fit).

        A method, like ``MultiLayerNetwork.score()``; :meth:`calculate_score` scores an RDD.
        """
        return self._score

    def get_score(self) -> float:
        """DL4J-style alias of :meth:`score`."""
        return self._score

    @property
    def collect_training_stats(self) -> bool:
        """Whether fits record :class:`SparkTrainingStats`."""
        return self._master.collect_training_stats

    @collect_training_stats.setter
    def collect_training_stats(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"collect_training_stats: expected a bool, got {value!r}")
        self._master.collect_training_stats = value

    @property
    def training_stats(self) -> SparkTrainingStats | None:
        """Stats of every fit (with collect_training_stats on) since this model was created or
        :meth:`reset_training_stats` was called; None before any. They include the training score per
        iteration and per epoch the accuracy and score of :attr:`evaluation_data` (when set) and the
        metrics an epoch callback returned."""
        return self._stats

    def reset_training_stats(self) -> None:
        """Forget the recorded training stats: the next fit starts a new record."""
        self._stats = None

    @property
    def evaluation_data(self) -> Any:
        """A local DataSet evaluated on the driver after every epoch (None: none).

        Its score, and for a classifier (more than one label column) its accuracy, are logged with the
        progress and recorded per epoch in :attr:`training_stats`. Keep it small: it runs between epochs.
        """
        return self._evaluation_data

    @evaluation_data.setter
    def evaluation_data(self, value: Any) -> None:
        from sparkgrad.data import DataSet

        if value is not None:
            if not isinstance(value, DataSet) or value.labels is None:
                raise TypeError(
                    f"evaluation_data: expected a DataSet with labels or None, got {type(value).__name__}"
                )
            check_dataset_matches(self._network, value, "evaluation_data")
        self._evaluation_data = value

    @property
    def default_evaluation_workers(self) -> int:
        """Network copies per executor task used by evaluation when ``eval_num_workers`` is None."""
        return self._default_eval_workers

    @default_evaluation_workers.setter
    def default_evaluation_workers(self, value: int) -> None:
        self._default_eval_workers = check_int("default_evaluation_workers", value, minimum=1)

    # -- training -----------------------------------------------------------------------------
    def fit(
        self,
        data: RDD | DataFrame | str,
        epochs: int = 1,
        epoch_callback: EpochCallback[NetT] | None = None,
        features_col: str = "features",
        label_col: str = "label",
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> NetT:
        """Train ``epochs`` passes over ``data`` (one by default) in one call.

        The data is prepared once per fit, not per epoch. With the default ``rdd_training_approach``
        ("auto") an RDD of DataSets is trained directly (persisted at the master's storage level)
        while its arrays total at most the master's ``direct_memory_budget_mb``, and exported to files
        under ``export_directory`` once (reused by later fits of the same RDD) above it.

        Args:
            data: an RDD of DataSets; a DataFrame (columns ``features_col`` and ``label_col``,
                converted as :meth:`fit_dataframe` says); or a directory, file or glob (any URI
                Spark reads: ``hdfs://``, ``s3a://``, ``abfs://``, ``gs://``, ``file:``) holding an
                export of :func:`~sparkgrad.spark.export_minibatches` or DataSets saved with
                ``DataSet.save``, read by Spark (:func:`~sparkgrad.spark.read_saved`, which checks it
                on the driver first; never exported again).
            epochs: passes over the data, a positive int.
            epoch_callback: ``epoch_callback(epoch, network)``, called on the driver after every
                epoch: ``epoch`` is the 0-based index of the epoch that just finished in the network's
                own count (``network.epoch_count - 1``), ``network`` is this model's network holding
                the parameters trained so far. Returning True stops training after that epoch (the fit
                returns normally), a falsy value goes on. It may instead return a mapping of this
                epoch's metrics, e.g. ``{"accuracy": 0.95, "stop": False}``: every entry but ``stop``
                is a finite number, logged with the progress and recorded per epoch in
                :attr:`training_stats` (charted under its name in the report); ``stop`` (a bool,
                False when left out) says whether to stop. An exception it raises ends the fit and
                reaches the caller. With SharedTrainingMaster every epoch runs inside one Spark job
                whose training tasks wait at each epoch end for the callback: it holds the
                controller's parameters (the workers' updater states are averaged into the network
                when the fit returns), and it should evaluate locally (``network.evaluate(dataset)``),
                since a Spark job started from it waits for task slots the training tasks hold.
            features_col: with a DataFrame, its features column (a Vector or an array of numbers).
            label_col: with a DataFrame, its label column (class indices, or one value per output).
            checkpoint: write checkpoints of the fit: a :class:`~sparkgrad.spark.CheckpointConfig`, or
                a directory (local or any Hadoop URI) to write one after every epoch, keeping the last
                three. A directory that already holds checkpoints needs ``resume=True``.
            resume: continue from the newest complete checkpoint in ``checkpoint``'s directory (none
                there: start afresh): the network, its updater state and counters, the master's
                threshold and data order are restored, and only the epochs of the interrupted fit that
                were not done are trained (the fit ends at the interrupted fit's first epoch plus
                ``epochs``). See :mod:`sparkgrad.spark.checkpoint`.

        Returns:
            The trained network.
        """
        request = _FitRequest.of(epochs, epoch_callback, checkpoint, resume)
        if is_dataframe(data):
            return self._fit_frame(data, features_col, label_col, request)
        return self._fit_data(data, SerializedDataSetLoader(), request)

    def _fit_data(self, data: RDD | str, saved: Any, request: _FitRequest) -> NetT:
        """``fit`` of an RDD of examples or a directory of saved ones; ``saved`` loads their files."""
        if isinstance(data, str):
            rdd = read_saved(spark_context(self._sc), data)
            self._check_first(rdd.map(lambda pb: load_unit("bytes", saved, pb)), "data")
            return self._train(rdd, "bytes", saved, request)
        self._check_rdd(data, "data")
        self._check_first(data, "data")
        return self._train(data, "dataset", saved, request)

    def fit_dataframe(
        self,
        df: DataFrame,
        features_col: str = "features",
        label_col: str = "label",
        epochs: int = 1,
        epoch_callback: EpochCallback[NetT] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> NetT:
        """Train ``epochs`` passes over the rows of a DataFrame (what ``fit(df)`` does).

        The columns are converted per partition on the executors, in Arrow batches, into DataSets of
        the training master's ``rdd_data_set_num_examples`` examples (setting it to
        ``batch_size_per_worker`` makes the conversion cheapest), which the master then trains on
        like any RDD of DataSets; nothing is collected to the driver. Fitting the same DataFrame
        again (same columns and network shape) reuses the conversion, so the master's persisted
        data is reused too. A ComputationGraph trains this way when it has one input and one output
        (the columns map to them); one with several raises ValueError naming them.

        Args:
            df: the training data.
            features_col: a Vector or array-of-numbers column with the network's input size per row;
                images as ``channels * height * width`` values in that order (reshaped by the
                network's input type). Recurrent input is not supported here.
            label_col: numbers (class indices, one-hot encoded, for networks with several outputs;
                the target value for one output) or a Vector / array column of one value per output.
            epochs: passes over the data, a positive int.
            epoch_callback: called after every epoch, as in :meth:`fit` (True stops early).
            checkpoint: as in :meth:`fit`.
            resume: as in :meth:`fit`.

        Returns:
            The trained network.
        """
        request = _FitRequest.of(epochs, epoch_callback, checkpoint, resume)
        return self._fit_frame(df, features_col, label_col, request)

    def _fit_frame(self, df: DataFrame, features_col: str, label_col: str, request: _FitRequest) -> NetT:
        conf = self._network.conf
        if self._connect:
            examples = self._master.rdd_data_set_num_examples
            frame = dataframe_dataset_frame(df, features_col, label_col, conf, examples)
            return self._fit_serialized(frame, request)
        key = (df, features_col, label_col, self._master.rdd_data_set_num_examples, conf.to_json())
        if self._frame is None or self._frame[0] is not df or self._frame[1:-1] != key[1:]:
            rdd = dataframe_datasets(
                df, features_col, label_col, conf, self._master.rdd_data_set_num_examples
            )
            self._frame = (*key, rdd)
        return self._train(self._frame[-1], "dataset", None, request)

    def _fit_serialized(self, frame: DataFrame, request: _FitRequest) -> NetT:
        """Fit a Connect session's DataFrame of serialized DataSets (the one binary column of
        :func:`~sparkgrad.spark.columns.dataframe_dataset_frame`): no RDDs there, the workers read the
        DataSets from its rows (:mod:`sparkgrad.spark.connect`)."""
        return self._train(frame, "bytes", SerializedDataSetLoader(), request)

    def fit_paths(
        self,
        paths: RDD,
        loader: Any = None,
        epochs: int = 1,
        epoch_callback: EpochCallback[NetT] | None = None,
        *,
        checkpoint: CheckpointConfig | str | None = None,
        resume: bool = False,
    ) -> NetT:
        """Train ``epochs`` passes over saved DataSets named by an RDD of paths (never exported).

        With the default loader (``SerializedDataSetLoader()``, or ``SerializedMultiDataSetLoader()``
        for a graph's MultiDataSets) the paths are collected on the driver and their files read by
        Spark's ``binaryFile`` source, so any URI the cluster's Spark reads works (``hdfs://``,
        ``s3a://``, ``abfs://``, ``gs://``, ``file:``); each path names one file, taken literally, and
        a missing one raises FileNotFoundError before any training. Another loader is called on the
        executors with each path, as it is: it must open the path itself.

        Args:
            paths: RDD of path strings.
            loader: callable path -> DataSet (default ``SerializedDataSetLoader()``).
            epochs: passes over the data, a positive int.
            epoch_callback: called after every epoch, as in :meth:`fit` (True stops early).
            checkpoint: as in :meth:`fit`.
            resume: as in :meth:`fit`.

        Returns:
            The trained network.
        """
        request = _FitRequest.of(epochs, epoch_callback, checkpoint, resume)
        self._check_rdd(paths, "paths")
        loader = SerializedDataSetLoader() if loader is None else loader
        if not callable(loader):
            raise TypeError(f"loader: expected a callable path -> DataSet, got {type(loader).__name__}")
        if reads_through_spark(loader):
            first_path, files = read_files(spark_context(self._sc), paths, "paths")
            check_dataset_matches(self._network, loader(first_path), "paths")  # read here, on the driver
            return self._train(files, "bytes", loader, request)
        first = first_element(paths, "paths")
        if not isinstance(first, str):
            raise TypeError(f"paths: expected an RDD of path strings, found {type(first).__name__}")
        check_dataset_matches(self._network, loader(first), "paths")
        return self._train(paths, "path", loader, request)

    def _train(self, rdd: Any, kind: str, loader: Any, request: _FitRequest) -> NetT:
        """The one fit path of every data source and both masters; fit listeners observe it here, and
        checkpoints are read and written here."""
        epochs, epoch_callback = request.epochs, request.epoch_callback
        if self._connect:
            _check_connect_request(request, self._evaluation_data)
        checkpoints = None if request.checkpoint is None else FitCheckpoints(request.checkpoint, self._sc)
        fit_first = int(self._network.epoch_count)  # the epoch count the (interrupted) fit started at
        if checkpoints is not None:
            restored = checkpoints.newest(type(self._network)) if request.resume else None
            if restored is not None:
                fit_first = self._resume(restored)
                if fit_first + epochs <= restored.epoch_count:
                    _log.info(
                        "%s: the fit had ended (epoch %d); nothing to train",
                        restored.name,
                        fit_first + epochs,
                    )
                    return self._network
                epochs = fit_first + epochs - restored.epoch_count
            elif not request.resume and (existing := checkpoints.existing()):
                raise ValueError(
                    f"checkpoint: {checkpoints.config.directory} already holds checkpoints (the newest after "
                    f"epoch {existing[0]}): pass resume=True to continue from them, or another directory"
                )
            checkpoints.start(int(self._network.epoch_count))
        fit_end = fit_first + request.epochs
        observers = FitObservers([*fit_listeners(), *self._fit_listeners])
        figures: dict[int, dict[str, float]] = {}  # per epoch: the master's progress figures
        callback = None
        per_epoch = self._evaluation_data is not None or epoch_callback is not None or checkpoints
        # a Connect fit's epochs end in a task (spark.connect): its listeners see its start and end only
        if per_epoch or (observers and not self._connect):
            first = int(self._network.epoch_count)

            def callback(epoch: int, network: NetT) -> dict[str, Any]:
                """The metrics of :attr:`evaluation_data` and those ``epoch_callback`` returned, logged
                and passed to the fit listeners, and its decision to stop, for the master to record and
                act on; then the checkpoint, when one is due."""
                values: dict[str, float] = {}
                try:
                    values.update(self._evaluate_epoch(network) if self._evaluation_data is not None else {})
                    stop = False
                    if epoch_callback is not None:
                        returned = epoch_callback(epoch, network)
                        stop, metrics = epoch_callback_result(returned)
                        for name in metrics.keys() & values.keys():
                            raise ValueError(
                                f"epoch_callback returned {returned!r}: metric {name!r} is already "
                                "recorded from evaluation_data; give it another name"
                            )
                        values.update(metrics)
                finally:  # an epoch that ended is reported, even when its callback fails
                    observers.epoch(self, epoch, {**figures.pop(epoch, {}), **values})
                if values:
                    described = ", ".join(f"{k.replace('_', ' ')} {v:.4g}" for k, v in values.items())
                    _log.info("epoch %d/%d: %s", epoch - first + 1, epochs, described)
                if checkpoints is not None and checkpoints.due(epoch + 1, stop or epoch + 1 >= fit_end):
                    self._write_checkpoint(checkpoints, network, fit_first, request.epochs)
                return {**values, "stop": stop}

        observers.started(self, epochs)
        error: BaseException | None = None
        try:
            # the loader reaches either master (and its job broadcast) already wrapped for cloudpickle
            self._score = self._master.execute_training(
                self._sc,
                self._network,
                rdd,
                kind,
                by_value(loader),
                epochs=epochs,
                epoch_callback=callback,
                epoch_progress=figures.__setitem__ if observers else None,
                epoch_state=_epoch_state_every(request),
            )
        except BaseException as exc:
            error = exc
            raise
        finally:
            if checkpoints is not None:
                checkpoints.wait()
            fit_stats = self._master.last_stats if error is None else None
            if fit_stats is not None:
                self._stats = (self._stats or SparkTrainingStats()).merge(fit_stats)
            observers.ended(self, fit_stats, error)
        return self._network

    def _write_checkpoint(
        self, checkpoints: FitCheckpoints, network: NetT, fit_first: int, epochs: int
    ) -> None:
        """Checkpoint ``network`` at an epoch end with the master's state and the statistics so far."""
        master = self._master
        try:
            configuration = master.to_dict()
        except (TypeError, ValueError):  # a hook or repartitioner that is not a configuration
            configuration = None
        stats = SparkTrainingStats().merge(self._stats or SparkTrainingStats())
        if master.last_stats is not None:
            stats.merge(master.last_stats)
        checkpoints.write(
            network,
            {
                "fit": {"first_epoch": fit_first, "epochs": epochs},
                "master": {
                    "class": type(master).__name__,
                    "configuration": configuration,
                    "state": master._checkpoint_state(network),
                },
                "stats": stats.to_dict()
                if self._stats is not None or master.last_stats is not None
                else None,
            },
            master._checkpoint_updater_state(network),
        )

    def _resume(self, checkpoint: Checkpoint) -> int:
        """Continue from ``checkpoint``: its network's parameters, updater state and counters, the
        master's state and the statistics so far. Returns the epoch count the interrupted fit started at."""
        saved = checkpoint.network
        if saved.conf.to_json() != self._network.conf.to_json():
            raise ValueError(
                f"checkpoint: {checkpoint.name} holds a network of another configuration than this fit's; "
                "resume it with that network, or write this fit's checkpoints to another directory"
            )
        master = checkpoint.record["master"]
        if master["class"] == type(self._master).__name__:
            try:
                self._master._restore_checkpoint_state(master["state"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"checkpoint: {checkpoint.name}: the master's state does not load: {exc}"
                ) from None
        else:
            _log.warning(
                "%s was written by a %s, this fit trains with a %s: its parameters and updater state are "
                "used, its threshold and data order are not",
                checkpoint.name,
                master["class"],
                type(self._master).__name__,
            )
        if checkpoint.record.get("stats") is not None:
            self._stats = SparkTrainingStats.from_dict(checkpoint.record["stats"])
        self._network.set_params(saved.params())
        self._network.set_updater_state(saved.updater_state())
        self._network.iteration_count = saved.iteration_count
        self._network.epoch_count = saved.epoch_count
        _log.info(
            "resuming from %s: epoch %d, iteration %d",
            checkpoint.name,
            saved.epoch_count,
            saved.iteration_count,
        )
        return int(checkpoint.record["fit"]["first_epoch"])

    def add_fit_listener(self, listener: FitListener) -> None:
        """Observe this model's fits with ``listener`` (added once), besides the listeners of every fit
        (:func:`sparkgrad.spark.tracking.add_fit_listener`): e.g. ``sparkgrad.mlflow.MlflowLogger()``.

        Args:
            listener: a :class:`~sparkgrad.spark.tracking.FitListener`.
        """
        if not isinstance(listener, FitListener):
            raise TypeError(f"listener: expected a FitListener, got {type(listener).__name__}")
        if listener not in self._fit_listeners:
            self._fit_listeners.append(listener)

    def remove_fit_listener(self, listener: FitListener) -> None:
        """Stop ``listener`` observing this model's fits (no error when it was not added)."""
        if listener in self._fit_listeners:
            self._fit_listeners.remove(listener)

    def _evaluate_epoch(self, network: NetT) -> dict[str, float]:
        """Score (and accuracy, for a classifier) of :attr:`evaluation_data`."""
        data = self._evaluation_data
        values = {"evaluation_score": float(network.score(data))}
        if data.labels.ndim == 2 and data.labels.shape[1] > 1:
            values["accuracy"] = float(network.evaluate(data).accuracy())
        return values

    @staticmethod
    def _check_rdd(rdd: Any, name: str) -> None:
        from pyspark import RDD

        if not isinstance(rdd, RDD):
            raise TypeError(f"{name}: expected a pyspark RDD, got {type(rdd).__name__}")

    def _check_first(self, rdd: RDD, name: str) -> None:
        # one check per RDD and network: later epochs on the same RDD skip the extra Spark job
        key = (spark_context(self._sc).applicationId, rdd.id())
        if key != self._checked:
            check_dataset_matches(self._network, first_element(rdd, name), name)
            self._checked = key

    # -- scoring ------------------------------------------------------------------------------
    def _in_task(
        self, part: Callable[[Iterable[Any]], Iterator[T]]
    ) -> Callable[[Iterable[Any]], Iterator[T]]:
        """A ``mapPartitions`` function run with the master's ``task_threads`` native threads."""
        return in_task_threads(self._master.task_threads, part)

    def _broadcast(self, lazy: bool = False) -> Any:
        """Broadcast the network (a Connect session has no broadcasts: the network travels in the plan);
        ``lazy``: it backs a returned RDD, so close() releases it."""
        job = _InferenceJob(uuid.uuid4().hex, NetworkSnapshot.of(self._network, False))
        if self._connect:
            return Held(job)
        bc = spark_context(self._sc).broadcast(job)
        if lazy:
            self._broadcasts.append(bc)
        return bc

    def calculate_score(self, rdd: RDD, average: bool = True, minibatch_size: int = 64) -> float:
        """Score (loss plus l1/l2 penalty) over all of ``rdd``.

        Args:
            rdd: RDD of DataSets.
            average: divide the example-weighted sum by the number of examples.
            minibatch_size: examples per scoring batch.

        Returns:
            The score.
        """
        self._check_rdd(rdd, "rdd")
        size = check_int("minibatch_size", minibatch_size, minimum=1)
        bc = self._broadcast()

        def part(it: Iterable[Any]) -> Iterator[tuple[float, int]]:
            net = bc.value.networks(1)[0]
            for ds in rebatch(it, size):
                n = ds.num_examples()
                yield net.score(ds) * n, n

        try:
            total, count = run_spark(
                "scoring",
                lambda: rdd.mapPartitions(self._in_task(part)).fold(
                    (0.0, 0), lambda a, b: (a[0] + b[0], a[1] + b[1])
                ),
            )
        finally:
            bc.unpersist()
        if count == 0:
            raise ValueError("rdd: the RDD is empty, there is nothing to score")
        return total / count if average else total

    def score_examples(
        self,
        rdd: RDD | DataFrame,
        include_regularization_terms: bool = False,
        batch_size: int = 64,
        *,
        features_col: str = "features",
        label_col: str = "label",
        score_col: str = "score",
    ) -> Any:
        """Per-example scores, in the RDD's order; of a DataFrame, as a column added to its rows.

        Args:
            rdd: RDD of DataSets; or a DataFrame with the columns ``features_col`` and ``label_col``
                (as :meth:`fit_dataframe` reads them), from a classic or a Spark Connect session.
            include_regularization_terms: add the l1/l2 penalty to every score.
            batch_size: examples per scoring batch.
            features_col: with a DataFrame, its features column.
            label_col: with a DataFrame, its label column.
            score_col: with a DataFrame, the name of the added score column (double).

        Returns:
            RDD of floats (lazy; the network broadcast is kept until :meth:`close`); for a DataFrame,
            the DataFrame with ``score_col`` added (lazy; the network's broadcast is kept until
            :meth:`close`, a Connect session's network travels in the plan).
        """
        if is_dataframe(rdd):
            return with_example_scores(
                rdd,
                features_col,
                label_col,
                score_col,
                self._network.conf,
                functools.partial(_first_network, self._broadcast(lazy=True)),
                include_regularization_terms,
                check_int("batch_size", batch_size, minimum=1),
                self._master.task_threads,
            )
        self._check_rdd(rdd, "rdd")
        size = check_int("batch_size", batch_size, minimum=1)
        bc = self._broadcast(lazy=True)

        def part(it: Iterable[Any]) -> Iterator[float]:
            net = bc.value.networks(1)[0]
            for ds in rebatch(it, size):
                yield from (float(s) for s in net.score_examples(ds, include_regularization_terms))

        return rdd.mapPartitions(self._in_task(part))

    def score_examples_with_key(
        self, pair_rdd: RDD, include_regularization_terms: bool = False, batch_size: int = 64
    ) -> RDD:
        """Per-example scores keyed like the input.

        Args:
            pair_rdd: RDD of ``(key, DataSet)`` with one example per DataSet.
            include_regularization_terms: add the l1/l2 penalty to every score.
            batch_size: examples per scoring batch.

        Returns:
            RDD of ``(key, float)``.
        """
        self._check_rdd(pair_rdd, "pair_rdd")
        size = check_int("batch_size", batch_size, minimum=1)
        bc = self._broadcast(lazy=True)

        def part(it: Iterable[Any]) -> Iterator[tuple[Any, float]]:
            net = bc.value.networks(1)[0]
            it = iter(it)
            while chunk := list(itertools.islice(it, size)):
                kind = type(chunk[0][1])
                for key, ds in chunk:
                    if type(ds) is not kind or not hasattr(ds, "num_examples") or ds.num_examples() != 1:
                        raise ValueError(
                            f"pair_rdd: the value of key {key!r} must be a DataSet (or, for a graph, a "
                            f"MultiDataSet) of one example, like every other value"
                        )
                scores = net.score_examples(kind.merge([ds for _, ds in chunk]), include_regularization_terms)
                yield from ((key, float(s)) for (key, _), s in zip(chunk, scores))

        return pair_rdd.mapPartitions(self._in_task(part))

    # -- inference ----------------------------------------------------------------------------
    def feed_forward_with_key(self, pair_rdd: RDD, batch_size: int = 64) -> RDD:
        """Network output for every value, keyed like the input.

        Args:
            pair_rdd: RDD of ``(key, value)``; a value is one example's features, a batch of examples,
                or a ``(features, features_mask)`` tuple of either.
            batch_size: examples per forward pass (values are grouped up to this size).

        Returns:
            RDD of ``(key, output)``: one example's output for a single example, else the batch's.
        """
        self._check_rdd(pair_rdd, "pair_rdd")
        size = check_int("batch_size", batch_size, minimum=1)
        bc = self._broadcast(lazy=True)

        def part(it: Iterable[Any]) -> Iterator[tuple[Any, np.ndarray]]:
            net = bc.value.networks(1)[0]
            ndim = example_ndim(net.conf.input_type)
            pending: list[tuple[Any, np.ndarray, np.ndarray | None, bool]] = []

            def flush() -> Iterator[tuple[Any, np.ndarray]]:
                x = np.concatenate([p[1] for p in pending])
                masks = [p[2] for p in pending]
                # the flags of one RDD's examples agree: every mask is present, or none
                mask = None if masks[0] is None else np.concatenate(cast("list[np.ndarray]", masks))
                out = _output(net, x, mask)
                offset = 0
                for key, feats, _, single in pending:
                    n = feats.shape[0]
                    yield key, (out[offset] if single else out[offset : offset + n])
                    offset += n
                pending.clear()

            for key, value in it:
                feats, mask = value if isinstance(value, tuple) else (value, None)
                feats = np.asarray(feats)
                single = feats.ndim == ndim
                if single:
                    feats = feats[None]
                    mask = None if mask is None else np.asarray(mask)[None]
                if feats.ndim != ndim + 1:
                    raise ValueError(
                        f"pair_rdd: value of key {key!r} has shape {np.shape(value)}, expected one "
                        f"example of {ndim} dimensions or a batch of {ndim + 1}"
                    )
                if pending and (
                    feats.shape[1:] != pending[0][1].shape[1:]
                    or (mask is None) != (pending[0][2] is None)
                    or sum(p[1].shape[0] for p in pending) + len(feats) > size
                ):
                    yield from flush()
                pending.append((key, feats, None if mask is None else np.asarray(mask), single))
            if pending:
                yield from flush()

        return pair_rdd.mapPartitions(self._in_task(part))

    def predict(self, features: Any) -> Any:
        """Network output for MLlib data on the driver (DL4J ``predict(Vector/Matrix)``).

        Args:
            features: a ``pyspark.ml.linalg`` or ``pyspark.mllib.linalg`` Vector (one example) or
                Matrix (one example per row), with the network's input size per example (images as
                ``channels * height * width`` values). A graph needs one input and one output.

        Returns:
            For a Vector, a DenseVector of the outputs; for a Matrix, a DenseMatrix with one row of
            outputs per example; of the same module (ml or mllib) as ``features``.
        """
        x, single, linalg = linalg_rows(features, self._network.conf, "features")
        out = network_output(self._network, x).astype(np.float64)
        if single:
            return linalg.DenseVector(out[0])
        # DenseMatrix takes its values in column-major order
        return linalg.DenseMatrix(out.shape[0], out.shape[1], out.ravel(order="F"))

    def output(self, df: DataFrame, features_col: str = "features", output_col: str = "output") -> DataFrame:
        """``df`` with the network's output for every row added as an ml Vector column (inference on a
        DataFrame, from a classic or a Spark Connect session; lazy, as :meth:`score_examples`'s).

        Args:
            df: the rows; ``features_col`` as :meth:`fit_dataframe` reads it.
            features_col: the features column.
            output_col: the name of the added column (a graph: its first output).

        Returns:
            The DataFrame with ``output_col`` added.
        """
        return with_network_outputs(
            df,
            features_col,
            self._network.conf,
            functools.partial(_first_network, self._broadcast(lazy=True)),
            lambda out: {output_col: out},
            [(output_col, True)],
            self._master.task_threads,
        )

    # -- evaluation ---------------------------------------------------------------------------
    def _eval_rdd(self, data: Any, loader: Any, columns: tuple[str, str] = ("features", "label")) -> Any:
        """The DataSets an evaluation reads: an RDD, or of a DataFrame (``columns``: its features and
        label columns) the DataFrame of serialized DataSets :meth:`_evaluations` reads in Arrow."""
        if is_dataframe(data):
            return self._evaluation_frame(data, columns)
        if isinstance(data, str):
            use = SerializedDataSetLoader() if loader is None else by_value(loader)
            return read_saved(spark_context(self._sc), data).map(use)
        self._check_rdd(data, "data")
        if loader is None:
            return data
        if reads_through_spark(loader) and isinstance(first_element(data, "data"), str):
            return read_files(spark_context(self._sc), data, "data")[1].map(loader)
        return data.map(by_value(loader))

    def evaluate(
        self,
        data: RDD | DataFrame | str,
        labels_list: list[str] | None = None,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        loader: Any = None,
        *,
        features_col: str = "features",
        label_col: str = "label",
    ) -> Any:
        """Classification evaluation over ``data``.

        Args:
            data: RDD of DataSets; or an RDD of paths with ``loader`` (with a default loader,
                ``SerializedDataSetLoader()``, the files are read by Spark as in :meth:`fit_paths`);
                or a directory, file or glob (any URI Spark reads) holding an export of
                :func:`~sparkgrad.spark.export_minibatches` or saved DataSets, read by
                :func:`~sparkgrad.spark.read_saved` and given to ``loader`` as ``(name, bytes)``
                (default ``SerializedDataSetLoader()``); or a DataFrame with the columns
                ``features_col`` and ``label_col`` (as :meth:`fit_dataframe` reads them; a classic or a
                Spark Connect session).
            labels_list: class names for the report.
            eval_num_workers: network copies per executor task (default ``default_evaluation_workers``).
            eval_batch_size: examples per forward pass (default 64).
            loader: see ``data``.
            features_col: with a DataFrame, its features column.
            label_col: with a DataFrame, its label column (class indices, or one value per output).

        Returns:
            An :class:`sparkgrad.eval.Evaluation`.
        """
        columns = (features_col, label_col)
        return self._evaluate(data, labels_list, eval_num_workers, eval_batch_size, loader, {}, columns)

    def _evaluate(
        self,
        data: RDD | DataFrame | str,
        labels_list: list[str] | None,
        eval_num_workers: int | None,
        eval_batch_size: int | None,
        loader: Any,
        network_keywords: dict[str, Any],
        columns: tuple[str, str],
    ) -> Any:
        """:meth:`evaluate` passing ``network_keywords`` to the network (see :meth:`_evaluations`)."""
        from sparkgrad.eval import Evaluation

        ev = Evaluation(labels=labels_list) if labels_list is not None else Evaluation()
        rdd = self._eval_rdd(data, loader, columns)
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, [ev], network_keywords)[0]

    def _evaluation_frame(self, df: DataFrame, columns: tuple[str, str]) -> DataFrame:
        """``df``'s rows as the serialized DataSets of evaluation batches (classification labels for
        several outputs, values for one, as a fit reads them)."""
        examples = DEFAULT_EVAL_BATCH_SIZE
        return dataframe_dataset_frame(df, columns[0], columns[1], self._network.conf, examples)

    def evaluate_roc(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
    ) -> Any:
        """Binary ROC (exact when ``threshold_steps`` is 0) over ``rdd``."""
        from sparkgrad.eval import ROC

        return self._evaluations(rdd, eval_num_workers, eval_batch_size, [ROC(threshold_steps)], {})[0]

    def evaluate_roc_multi_class(
        self,
        rdd: RDD,
        threshold_steps: int = 0,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
    ) -> Any:
        """One-vs-all ROC per class over ``rdd``."""
        from sparkgrad.eval import ROCMultiClass

        roc = ROCMultiClass(threshold_steps)
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, [roc], {})[0]

    def evaluate_regression(
        self,
        rdd: RDD | DataFrame,
        eval_num_workers: int | None = None,
        eval_batch_size: int | None = None,
        *,
        features_col: str = "features",
        label_col: str = "label",
    ) -> Any:
        """Regression metrics per output column over ``rdd`` (or a DataFrame's ``features_col`` and
        ``label_col``, as :meth:`evaluate` reads them)."""
        from sparkgrad.eval import RegressionEvaluation

        data = self._evaluation_frame(rdd, (features_col, label_col)) if is_dataframe(rdd) else rdd
        return self._evaluations(data, eval_num_workers, eval_batch_size, [RegressionEvaluation()], {})[0]

    def do_evaluation(
        self, rdd: RDD, eval_num_workers: int | None, eval_batch_size: int | None, *evaluations: Any
    ) -> list:
        """Run several evaluations in one pass over ``rdd``.

        Each executor task evaluates its partition with ``eval_num_workers`` network copies in parallel
        threads (the native kernels release the GIL); partial results are merged with ``merge``.

        Args:
            rdd: RDD of DataSets.
            eval_num_workers: network copies per task (default ``default_evaluation_workers``).
            eval_batch_size: examples per forward pass (default 64).
            *evaluations: fresh evaluation objects (used as templates; not modified).

        Returns:
            The merged evaluations, in order.
        """
        return self._evaluations(rdd, eval_num_workers, eval_batch_size, evaluations, {})

    def _evaluations(
        self,
        rdd: RDD | DataFrame,
        eval_num_workers: int | None,
        eval_batch_size: int | None,
        evaluations: Iterable[Any],
        network_keywords: dict[str, Any],
    ) -> list:
        """The distributed evaluation behind every evaluation method (see :meth:`do_evaluation`).

        Args:
            rdd: RDD of DataSets, or a DataFrame of serialized ones (:meth:`_evaluation_frame`), read
                in Arrow batches: the one way in from a Spark Connect session.
            network_keywords: keyword arguments of the network's own ``do_evaluation`` on the
                executors, checked on the driver by the caller: a graph's ``output_index``; none for a
                MultiLayerNetwork, whose only output is evaluated.
        """
        if not is_dataframe(rdd):
            self._check_rdd(rdd, "rdd")
        if not evaluations:
            raise ValueError("evaluations: pass at least one evaluation object")
        workers = check_int(
            "eval_num_workers",
            self._default_eval_workers if eval_num_workers is None else eval_num_workers,
            minimum=1,
        )
        size = check_int(
            "eval_batch_size",
            DEFAULT_EVAL_BATCH_SIZE if eval_batch_size is None else eval_batch_size,
            minimum=1,
        )
        templates = list(evaluations)
        bc = self._broadcast()

        def part(it: Iterable[Any]) -> Iterator[list | None]:
            nets = bc.value.networks(workers)
            batches = list(rebatch(it, size))
            if not batches:
                return
            shards = [batches[i::workers] for i in range(workers)]
            threads = max(1, get_num_threads() // workers)  # the task's threads, shared by the copies

            def run(i: int) -> list | None:
                if not shards[i]:
                    return None
                # a new thread's OpenMP count is the process default; the pool's threads end with the task
                set_num_threads(threads)
                return nets[i].do_evaluation(shards[i], *copy.deepcopy(templates), **network_keywords)

            with ThreadPoolExecutor(workers) as pool:
                parts = list(pool.map(run, range(workers)))
            merged = None
            for p in parts:
                merged = _merge_lists(merged, p)
            yield merged

        try:
            if is_dataframe(rdd):
                result = _frame_evaluations(rdd, self._in_task(part))
            else:
                result = run_spark(
                    "evaluation",
                    lambda: rdd.mapPartitions(self._in_task(part)).treeAggregate(
                        None, _merge_lists, _merge_lists, depth=2
                    ),
                )
        finally:
            if not self._connect:
                bc.unpersist()
        if result is None:
            raise ValueError("rdd: the RDD is empty, there is nothing to evaluate")
        return result


def _check_connect_request(request: _FitRequest, evaluation_data: Any) -> None:
    """Refuse what a Spark Connect fit cannot do: its epochs end inside a task, away from the driver's
    objects (:mod:`sparkgrad.spark.connect`)."""
    for name, value in (
        ("epoch_callback", request.epoch_callback),
        ("checkpoint", request.checkpoint),
        ("evaluation_data", evaluation_data),
    ):
        if value is not None:
            raise EnvironmentNotReadyError(
                f"{name}: a fit over Spark Connect ends its epochs inside the first training task, not on "
                "this client, so it runs no per-epoch driver work (epoch callbacks, evaluation data, "
                "checkpoints, early stopping); fit from a classic session for those, or fit epoch by "
                "epoch (fit(df, epochs=1) in a loop) and evaluate between the calls"
            )


def _epoch_state_every(request: _FitRequest) -> int:
    """How often the network must hold the current updater state at an epoch end (the masters'
    ``epoch_state``): for checkpoints, every ``every_epochs`` (every epoch when they go by time), else
    never (0): with gradient sharing one worker then sends its updater state, as large as the parameters
    or twice (Adam), at those epoch ends, which a callback that only evaluates does not need."""
    config = request.checkpoint
    if config is None:
        return 0
    return 1 if config.every_minutes is not None or config.every_epochs is None else config.every_epochs


@dataclass(frozen=True)
class _FitRequest:
    """What a fit method was asked for, validated: its passes, callback and checkpoints."""

    epochs: int
    epoch_callback: Any
    checkpoint: CheckpointConfig | None
    resume: bool

    @classmethod
    def of(cls, epochs: Any, epoch_callback: Any, checkpoint: Any, resume: Any) -> _FitRequest:
        """Validate the fit methods' ``epochs``, ``epoch_callback``, ``checkpoint`` and ``resume``."""
        if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)):
            raise TypeError(f"epochs: expected a positive int, got {type(epochs).__name__}")
        if epochs < 1:
            raise ValueError(f"epochs: must be >= 1, got {epochs}")
        if epoch_callback is not None and not callable(epoch_callback):
            raise TypeError(
                f"epoch_callback: expected a callable (epoch, network) -> bool or a metrics mapping, or "
                f"None, got {type(epoch_callback).__name__}"
            )
        if not isinstance(resume, bool):
            raise TypeError(f"resume: expected a bool, got {type(resume).__name__}")
        config = CheckpointConfig.of(checkpoint)
        if resume and config is None:
            raise ValueError("resume: continues from checkpoints, so it needs checkpoint= (their directory)")
        return cls(int(epochs), epoch_callback, config, resume)


def _output(net: MultiLayerNetwork, x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Output for features ``x`` with their (batch, time) features mask, or None."""
    return net.output(x, features_mask=mask)


__all__ = ["SparkNetwork"]
