"""Training over Spark Connect: the controller inside the first training task.

A Spark Connect client (``SparkSession.builder.remote(...)``, Databricks shared and serverless compute)
has no SparkContext and no RDDs, and the executors may not reach it. A fit from such a session is one
DataFrame operation: the training DataFrame (its rows DataSets serialized as the DataFrame conversion
writes them, :func:`~sparkgrad.spark.columns.dataframe_dataset_frame`) is repartitioned to one partition
per worker and trained by ``mapInArrow(..., barrier=True)``. Its first task starts the controller on its
executor's address, the barrier's ``allGather`` hands the address and the controller's public keys to
every task, and every task then runs the same :class:`~sparkgrad.spark.shared_worker.SharedWorker` as a
classic fit (both masters, both network types). The first task also serves the epoch barrier that the
driver serves in a classic fit (``controller_fit._FitRun``), and once every task has ended its training
(the barrier's ``barrier()``) it returns the trained network's parameters, updater state,
counters and the controller's figures as the job's output; the others return their worker results, as
a classic fit's tasks do.

What differs from a classic fit: per-epoch driver callbacks (``epoch_callback``, ``evaluation_data``,
checkpoints, early stopping) need the driver during the fit and are refused with a message; Spark's
dynamic allocation refuses barrier stages (SPARK-24942), and a Connect fit needs one (the controller
lives in a task), so it is refused too; the per-epoch progress line is not drawn (the executors log
every epoch's figures); the job's secret travels to the server inside the plan (over Connect's channel:
use TLS to a remote server, as for any credential in a plan).
"""

from __future__ import annotations

import _thread
import copy
import json
import logging
import pickle
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.errors import EnvironmentNotReadyError, TrainingError
from sparkgrad.spark.common import TrainingData, run_spark

if TYPE_CHECKING:
    import pyarrow as pa

    from sparkgrad.spark.controller_fit import ControllerFit
    from sparkgrad.spark.shared_worker import SharedJob, WorkerResult
    from sparkgrad.spark.stats import SparkTrainingStats

log = logging.getLogger(__name__)

_SERVE_INTERVAL_S = 0.2  # how often the first task's epoch server checks the controller
_OUTPUT_SCHEMA = "partition int, controller boolean, payload binary"


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` (a session, or a DataFrame of one) comes from Spark Connect."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_conf(spark: Any, key: str, default: str | None = None) -> str | None:
    """A Spark setting of a classic SparkContext or a Connect session (``default`` when unset)."""
    if is_connect(spark):
        return spark.conf.get(key, default)
    return spark.getConf().get(key, default)


def connect_slots(spark: Any, workers_per_node: int = -1) -> int:
    """The tasks a Connect session's cluster runs at once, from its settings (a Connect client cannot
    ask the scheduler): ``local[N]`` (``local[*]``: this machine's CPUs), else
    ``spark.executor.instances`` x ``spark.executor.cores`` / ``spark.task.cpus``; with
    ``workers_per_node`` > 0 at most that many per executor."""
    import os

    master = spark_conf(spark, "spark.master", "") or ""
    task_cpus = int(spark_conf(spark, "spark.task.cpus", "1") or 1)
    if master.startswith("local"):
        threads = master[master.find("[") + 1 : master.find("]")].split(",")[0] if "[" in master else "1"
        cores = (os.cpu_count() or 1) if threads == "*" else int(threads)
        executors = 1
    else:
        executors = int(spark_conf(spark, "spark.executor.instances", "1") or 1)
        cores = int(spark_conf(spark, "spark.executor.cores", "1") or 1)
    per_executor = max(1, cores // max(1, task_cpus))
    if workers_per_node > 0:
        per_executor = min(per_executor, workers_per_node)
    return max(1, executors * per_executor)


def check_connect_fit(spark: Any) -> None:
    """Refuse what a Connect fit cannot do before any job starts: dynamic allocation (SPARK-24942
    refuses the barrier stage the controller lives in)."""
    from sparkgrad.spark.controller_fit import dynamic_allocation  # it imports this module

    if dynamic_allocation(spark):
        raise EnvironmentNotReadyError(
            "spark: a fit over Spark Connect runs its controller inside a barrier stage, which Spark refuses "
            "with dynamic allocation (SPARK-24942): set spark.dynamicAllocation.enabled=false for the "
            "cluster, or fit from a classic session (which trains with a Spark job per epoch then)"
        )


def connect_training_data(frame: Any, kind: str, loader: Any, examples_per_unit: int) -> TrainingData:
    """The training data of a Connect fit: ``frame``'s one binary column of serialized DataSets (kind
    "bytes", read with ``loader``), persisted on the executors' disks and counted (one Spark job)."""
    from pyspark.storagelevel import StorageLevel

    if kind != "bytes" or len(frame.columns) != 1:
        raise TypeError("a Connect fit trains a DataFrame of serialized DataSets (one binary column)")
    frame = frame.persist(StorageLevel.DISK_ONLY)
    units = int(run_spark("counting the training data", frame.count))
    if units == 0:
        raise ValueError("data: the DataFrame has no rows to train on")
    return TrainingData(frame, kind, loader, examples_per_unit, units, [])


@dataclass
class ConnectUnits:
    """A Connect fit's training DataFrame spread over one partition per worker (a Connect DataFrame does
    not say its partition count)."""

    frame: Any
    partitions: int

    def getNumPartitions(self) -> int:  # noqa: N802 - the name RDDs give it
        return self.partitions


def connect_partitions(data: TrainingData, workers: int, min_per_partition: int) -> ConnectUnits:
    """``data``'s frame spread over ``workers`` partitions, fewer when it holds fewer than
    ``min_per_partition`` elements per worker."""
    partitions = max(1, min(workers, data.num_units // max(1, min_per_partition)))
    return ConnectUnits(data.rdd.repartition(partitions), partitions)


@dataclass
class _Job:
    """What a Connect fit's tasks receive (inside the plan): stands in for the classic fit's job
    broadcast (``value``) and carries what the first task needs to run the controller."""

    master: Any  # a copy of the training master, without its data
    template: SharedJob  # the fit's job without its controller (secret, address, key)
    secret: bytes
    partitions: int
    epochs: int
    num_units: int
    examples_per_unit: int

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        from pyspark import BarrierTaskContext

        from sparkgrad.spark.controller_fit import _FitRun
        from sparkgrad.spark.shared_worker import shared_partition

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        run: _FitRun | None = None
        announce = ""
        if partition == 0:
            host = context.getTaskInfos()[partition].address.rsplit(":", 1)[0]
            host = self.master.void_configuration.resolve_controller_address(host)
            network = self.template.snapshot.build()
            run = _FitRun(
                self.master,
                network,
                self,
                self.partitions,
                self.epochs,
                None,
                None,
                None,
                host,
                self.template.job_id,
                self.secret,
                show_progress=False,
            )
            run.controller.expect_workers(self.partitions)
            job = run.job(self.template)
            curve = None if job.curve_key is None else job.curve_key.hex()
            announce = json.dumps(
                {"host": job.host, "port": job.port, "key": job.controller_key.hex(), "curve": curve}
            )
        server = _EpochServer(run) if run is not None else None
        results: dict[int, WorkerResult] = {}
        try:
            found = json.loads(context.allGather(announce)[0])
            job = replace(
                self.template,
                secret=self.secret,
                host=found["host"],
                port=check_int("port", found["port"], minimum=1),
                controller_key=bytes.fromhex(found["key"]),
                curve_key=None if found["curve"] is None else bytes.fromhex(found["curve"]),
            )
            units = (("DataFrame", value) for batch in batches for value in batch.column(0).to_pylist())
            for part in shared_partition(Held(job), self.template.snapshot.epoch, self.epochs)(units):
                results.update(part)
            context.barrier()  # every task has trained: the controller's work is done
        except KeyboardInterrupt:  # the epoch server's signal: the controller failed
            if server is None or server.error is None:
                raise
        finally:
            if server is not None:
                server.stop()
        if server is not None and server.error is not None:
            raise TrainingError(
                f"training failed: the gradient-sharing controller failed: {type(server.error).__name__}: "
                f"{server.error}"
            ) from server.error
        out = [(partition, False, pickle.dumps(results))]
        if run is not None:
            run.finish(True)
            out.append((partition, True, pickle.dumps(_trained_state(run))))
        yield pa.RecordBatch.from_pydict(
            {
                "partition": [p for p, _, _ in out],
                "controller": [c for _, c, _ in out],
                "payload": [b for _, _, b in out],
            },
            schema=pa.schema(
                [("partition", pa.int32()), ("controller", pa.bool_()), ("payload", pa.binary())]
            ),
        )


@dataclass
class Held:
    """A value where a classic session has a broadcast (``.value``): a Connect session has none, the
    value travels in the plan."""

    value: Any


class _EpochServer:
    """The first task's thread serving the epoch barrier (what the driver's watch loop does in a classic
    fit): each epoch every worker finished goes through :meth:`_FitRun.on_epoch` and the workers are
    released. When the controller fails, the task's main thread is interrupted, so that the barrier stage
    fails at once instead of waiting for the workers' timeouts."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sparkgrad-epoch-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        controller = self.run.controller
        while not self._stop.is_set():
            epoch = controller.next_finished_epoch(_SERVE_INTERVAL_S)
            if epoch is not None:
                stop = True
                try:
                    stop = self.run.on_epoch(epoch)
                finally:
                    controller.release_epoch(epoch, stop)
                self.run.after_release()
            if controller.error is not None:
                self.error = controller.error
                _thread.interrupt_main()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.run.close()


def _trained_state(run: Any) -> dict[str, Any]:
    """What the first task returns of a finished fit: the network's state and the controller's figures."""
    network, controller = run.network, run.controller
    return {
        "params": np.array(network.params(), copy=True),
        "updater_state": np.array(network.updater_state(), copy=True),
        "epoch_count": int(network.epoch_count),
        "iteration_count": int(network.iteration_count),
        "last_traffic": dict(run.master.last_traffic),
        "round_scores": list(controller.round_scores),
        "workers_seen": set(controller.workers_seen),
        "updates_by_worker": dict(controller.updates_by_worker),
    }


def run_connect_job(
    master: ControllerFit,
    spark: Any,
    network: Any,
    units: ConnectUnits,
    data: TrainingData,
    stats: SparkTrainingStats | None,
    epochs: int,
    slots: int,
) -> tuple[dict[int, WorkerResult], list[tuple[int, int, float]]]:
    """:meth:`ControllerFit._run_job` over Spark Connect: one barrier ``mapInArrow`` over ``units``
    (one partition per worker), the controller in its first task (module docstring). Trains ``network``
    in place; returns the workers' results and the controller's averaging round scores."""
    check_connect_fit(spark)
    from sparkgrad.spark.controller_fit import _conf_flag
    from sparkgrad.spark.shared_worker import WorkerResult

    partitions = units.partitions
    if partitions > slots:
        raise ValueError(
            f"a Connect fit trains {partitions} partitions in one barrier stage and the cluster has {slots} "
            "task slots (from spark.master, or spark.executor.instances x spark.executor.cores)"
        )
    job_id, secret = master._job_identity()
    encrypt_store = _conf_flag(spark, "spark.io.encryption.enabled")
    template = master._job_template(network, data, partitions, slots, True, epochs, 0, job_id, encrypt_store)
    task_master = copy.copy(master)
    for name, empty in (("_prepared", None), ("_persisted", []), ("last_stats", None)):
        if hasattr(task_master, name):  # data and statistics stay on the client
            setattr(task_master, name, empty)
    job = _Job(task_master, template, secret, partitions, epochs, data.num_units, data.examples_per_unit)
    log.info(
        "Spark Connect: %d training tasks in one barrier stage, the controller inside the first", partitions
    )
    rows = run_spark("training", units.frame.mapInArrow(job, _OUTPUT_SCHEMA, barrier=True).collect)
    results: dict[int, WorkerResult] = {}
    state: dict[str, Any] | None = None
    for row in rows:
        if row["controller"]:
            state = pickle.loads(row["payload"])
        else:
            part: dict[int, WorkerResult] = pickle.loads(row["payload"])
            results.update({k: v for k, v in part.items() if isinstance(v, WorkerResult)})
    if state is None:
        raise TrainingError("training: the Connect fit's first task returned no trained network")
    network.set_params(state["params"])
    if state["updater_state"].size:
        network.set_updater_state(state["updater_state"])
    network.epoch_count = state["epoch_count"]
    network.iteration_count = state["iteration_count"]
    master.last_traffic = state["last_traffic"]
    master._record_traffic(stats, state["workers_seen"], state["updates_by_worker"], results)
    return results, state["round_scores"]
