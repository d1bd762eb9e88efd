"""Checkpoints of a Spark fit: what a fit writes so that it survives its driver, and how it resumes.

``fit(..., checkpoint=CheckpointConfig(directory), resume=True)`` (every fit method of both network
types and both masters, and the estimators) writes a checkpoint at the epoch ends the configuration
names and, with ``resume``, continues from the newest complete one: the epochs already done are not
trained again, and the learning-rate schedule, the updater state, the threshold and the data order go on
where they were.

Layout of a checkpoint directory (a local path or any Hadoop URI Spark's driver can write)::

    DIRECTORY/
      checkpoint-00000004.model   the network after 4 epochs: a model file (sparkgrad.nn.serialization;
                                  ``MultiLayerNetwork.load`` reads it) with its updater state
      checkpoint-00000004.json    the commit record, written last (below)
      ...

A checkpoint is complete when its record exists and names the model file's length and SHA-256: each
file is written atomically (a temporary sibling renamed over the name), the model first, so a driver
killed mid-write leaves either no record or a complete pair. Reading skips, with a warning naming the
file, a record that does not parse, a model file that is missing or differs from its record, and a model
that does not load, and takes the previous checkpoint.

The record is UTF-8 JSON: ``{"format": "sparkgrad-checkpoint", "version": 1, "epoch_count",
"iteration_count", "model": {"file", "bytes", "sha256", "class"}, "fit": {"first_epoch", "epochs"},
"master": {"class", "configuration", "state"}, "stats", "written_unix_s"}``: ``fit`` is the call that
wrote it (its first epoch and the epochs it was asked for: a resumed call trains the rest); the master's
``state`` is what its configuration does not hold (SharedTrainingMaster: the threshold algorithm's state
and the data-order seed; ParameterAveraging: the position of its data-order generator); ``stats`` the
fit's training statistics so far (``SparkTrainingStats.to_dict``), or null when none are collected.

What a checkpoint does not hold: a gradient-sharing worker's residual (the part of its updates not yet
sent; one vector per worker, as large as the parameters): a resumed fit starts with zero residuals, as a
fresh fit does. Nor an fp16 network's loss-scaler state: a resumed fp16 fit starts its loss scaling
afresh (docs/guides/checkpoints.md).

The driver copies the parameters at the epoch end and writes the checkpoint in a background thread while
training goes on (the model file without compression: a copy, not a deflate pass); the next checkpoint,
and the fit's end, wait for that write. With gradient sharing the updater state comes from partition 0's
worker, which sends it once the epoch's barrier let the workers go: the writer waits for it, and the
transfer overlaps the next epoch instead of holding every worker at the barrier. A write that fails is
logged and warned about, and training goes on: the previous checkpoint stays the newest complete one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sparkgrad._config import Config, check_int
from sparkgrad._io import hadoop_error, hadoop_filesystem, is_uri, read_bytes, write_bytes
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn.serialization import write_model

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

FORMAT = "sparkgrad-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^checkpoint-(\d{8,})\.json$")
_FILE = re.compile(r"^checkpoint-(\d{8,})\.(?:json|model)$")
MAX_RECORD_BYTES = 64 << 20  # a record holds the training statistics so far: a long fit's series are large


def _file_stem(epoch_count: int) -> str:
    return f"checkpoint-{epoch_count:08d}"


@dataclass
class CheckpointConfig(Config):
    """Where and how often a fit saves checkpoints.

    A checkpoint is written at an epoch end when ``every_epochs`` epochs (of the network's count) have
    passed since the last one, or ``every_minutes`` since the last one (or the fit's start), and always at
    the fit's last epoch (also one an ``epoch_callback`` or early stopping ended).

    Args:
        directory: a local directory or a Hadoop URI (``hdfs://``, ``s3a://``, ``abfs://``, ``gs://``,
            ``file:``), written from the driver.
        every_epochs: epochs between checkpoints (>= 1), or None to write by time only.
        every_minutes: minutes between checkpoints (> 0), or None to write by epochs only.
        keep_last: complete checkpoints kept (>= 1); older ones are deleted after each write.
    """

    directory: str = ""
    every_epochs: int | None = 1
    every_minutes: float | None = None
    keep_last: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)) or not os.fspath(self.directory):
            raise ValueError(f"directory: expected a non-empty path or URI, got {self.directory!r}")
        self.directory = os.fspath(self.directory)
        if self.every_epochs is not None:
            self.every_epochs = check_int("every_epochs", self.every_epochs, minimum=1)
        if self.every_minutes is not None:
            minutes = self.every_minutes
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0:
                raise ValueError(
                    f"every_minutes: expected a positive number of minutes or None, got {minutes!r}"
                )
            if not math.isfinite(minutes):
                raise ValueError(f"every_minutes: expected a finite number of minutes, got {minutes!r}")
            self.every_minutes = float(minutes)
        if self.every_epochs is None and self.every_minutes is None:
            raise ValueError(
                "every_epochs and every_minutes are both None: say how often to write checkpoints"
            )
        self.keep_last = check_int("keep_last", self.keep_last, minimum=1)

    @classmethod
    def of(cls, value: Any) -> CheckpointConfig | None:
        """``value`` as a configuration: a CheckpointConfig, a directory (every epoch, keep 3), or None."""
        if value is None or isinstance(value, CheckpointConfig):
            return value
        if isinstance(value, (str, os.PathLike)):
            return cls(os.fspath(value))
        raise TypeError(
            f"checkpoint: expected a CheckpointConfig, a directory or None, got {type(value).__name__}"
        )


@dataclass
class Checkpoint:
    """A complete checkpoint read back: the model file's network and the commit record."""

    name: str  # the record's path
    network: Any
    record: dict[str, Any]

    @property
    def epoch_count(self) -> int:
        return int(self.network.epoch_count)

    @property
    def fit_end(self) -> int:
        """The epoch count the fit that wrote it was to reach."""
        fit = self.record["fit"]
        return int(fit["first_epoch"]) + int(fit["epochs"])


class _Directory:
    """The few file operations a checkpoint directory needs, on a local path or a Hadoop URI."""

    def __init__(self, directory: str, sc: SparkContext | None) -> None:
        self.path = directory.rstrip("/") or directory
        self._hadoop = is_uri(directory) and sc is not None
        self._sc = sc

    def join(self, name: str) -> str:
        return f"{self.path}/{name}"

    def names(self) -> list[str]:
        """The names in the directory (none when it does not exist)."""
        if not self._hadoop:
            local = self.path[5:] if self.path.startswith("file:") else self.path
            return os.listdir(local) if os.path.isdir(local) else []
        try:
            fs, jpath = hadoop_filesystem(self._sc, self.path)
            if not fs.exists(jpath):
                return []
            return [status.getPath().getName() for status in fs.listStatus(jpath)]
        except Exception as exc:  # a Py4JJavaError becomes the Python error it stands for
            raise hadoop_error(self.path, exc) from None

    def make(self) -> None:
        if not self._hadoop:  # Hadoop's create() makes missing parents itself
            os.makedirs(self.path[5:] if self.path.startswith("file:") else self.path, exist_ok=True)

    def delete(self, name: str) -> None:
        path = self.join(name)
        try:
            if not self._hadoop:
                os.remove(path[5:] if path.startswith("file:") else path)
                return
            fs, jpath = hadoop_filesystem(self._sc, path)
            fs.delete(jpath, False)
        except FileNotFoundError:
            pass
        except Exception as exc:
            log.warning("checkpoint: could not delete %s: %s", path, hadoop_error(path, exc))


def _record_epochs(names: list[str]) -> list[int]:
    """The epoch counts of the commit records among ``names``, newest first."""
    return sorted((int(m.group(1)) for m in map(_NAME.match, names) if m), reverse=True)


class FitCheckpoints:
    """One fit's checkpoints: finds the newest complete one, decides when to write, writes in the
    background and prunes (module docstring)."""

    def __init__(self, config: CheckpointConfig, sc: SparkContext | None) -> None:
        self.config = config
        self._dir = _Directory(config.directory, sc)
        self._last_epoch: int | None = None
        self._last_time = time.monotonic()
        self._writer: threading.Thread | None = None
        self.written: list[str] = []  # the records this fit wrote, in order
        self.failures = 0

    # -- reading ----------------------------------------------------------------------------------
    def existing(self) -> list[int]:
        """The epoch counts of the records in the directory, newest first (complete or not)."""
        return _record_epochs(self._dir.names())

    def newest(self, network_cls: Any) -> Checkpoint | None:
        """The newest complete checkpoint; incomplete or corrupt ones are skipped with a warning."""
        for epoch in self.existing():
            name = self._dir.join(f"{_file_stem(epoch)}.json")
            try:
                return self._read(name, epoch, network_cls)
            except (CorruptDataError, OSError, ValueError) as exc:
                text = f"checkpoint {name} is skipped (incomplete or corrupt): {exc}"
                log.warning(text)
                warnings.warn(text, RuntimeWarning, stacklevel=3)
        return None

    def _read(self, name: str, epoch: int, network_cls: Any) -> Checkpoint:
        raw = read_bytes(name)
        if len(raw) > MAX_RECORD_BYTES:
            raise CorruptDataError(f"the record is {len(raw)} bytes, more than {MAX_RECORD_BYTES}")
        try:
            record = json.loads(raw.decode("utf-8"))
            model = record["model"]
            if record.get("format") != FORMAT or record.get("version") != FORMAT_VERSION:
                raise ValueError(f"not a {FORMAT} record of version {FORMAT_VERSION}")
            if int(record["epoch_count"]) != epoch or model["file"] != f"{_file_stem(epoch)}.model":
                raise ValueError("its epoch count or model file does not match its name")
            first, epochs = int(record["fit"]["first_epoch"]), int(record["fit"]["epochs"])
            if not 0 <= first <= epoch or epochs < 1:
                raise ValueError(f"its fit ({first}, {epochs} epochs) does not hold epoch {epoch}")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise CorruptDataError(f"{type(exc).__name__}: {exc}") from None
        data = read_bytes(self._dir.join(model["file"]))
        if len(data) != model["bytes"] or hashlib.sha256(data).hexdigest() != model["sha256"]:
            raise CorruptDataError(
                f"{model['file']} has {len(data)} bytes and another SHA-256 than the record says"
            )
        if model["class"] != network_cls.__name__:
            raise ValueError(f"it holds a {model['class']}, this fit trains a {network_cls.__name__}")
        network = network_cls.load(io.BytesIO(data), load_updater=True)
        if network.epoch_count != epoch:
            raise CorruptDataError(f"its model file says {network.epoch_count} epochs, the record {epoch}")
        return Checkpoint(name, network, record)

    # -- writing ----------------------------------------------------------------------------------
    def start(self, epoch_count: int) -> None:
        """The fit starts at ``epoch_count``: the cadence counts from here."""
        self._last_epoch = epoch_count
        self._last_time = time.monotonic()

    def due(self, epoch_count: int, final: bool) -> bool:
        """Whether a checkpoint is written after the epoch that brought the network to ``epoch_count``."""
        config = self.config
        if final:
            return True
        if config.every_epochs is not None and self._last_epoch is not None:
            if epoch_count - self._last_epoch >= config.every_epochs:
                return True
        if config.every_minutes is not None:
            return time.monotonic() - self._last_time >= 60 * config.every_minutes
        return False

    def write(self, network: Any, record: dict[str, Any], updater_state: Callable[[], np.ndarray]) -> None:
        """Snapshot ``network`` (a copy of its parameters and counters) now, and write it with
        ``record`` and the updater state ``updater_state()`` gives (called in the background: it may
        wait for the state to arrive) in the background; waits for the previous write first."""
        self.wait()
        snapshot = _Snapshot(  # the parameters copied: training goes on changing the network's
            type(network).__name__,
            network.conf.to_json(),
            network.params().copy(),
            updater_state,
            int(network.iteration_count),
            int(network.epoch_count),
        )
        self._last_epoch, self._last_time = snapshot.epoch_count, time.monotonic()
        self._writer = threading.Thread(
            target=self._write_files,
            args=(snapshot, record),
            name=f"sparkgrad-checkpoint-{self._last_epoch}",
            daemon=True,
        )
        self._writer.start()

    def _write_files(self, network: _Snapshot, record: dict[str, Any]) -> None:
        epoch = network.epoch_count
        stem = _file_stem(epoch)
        name = self._dir.join(f"{stem}.json")
        try:
            buffer = io.BytesIO()
            write_model(
                buffer,
                network.model,
                network.conf_json,
                network.params,
                network.updater_state(),
                network.iteration_count,
                epoch,
                compress=False,
            )
            model = buffer.getbuffer()
            text = json.dumps(
                {
                    "format": FORMAT,
                    "version": FORMAT_VERSION,
                    "epoch_count": epoch,
                    "iteration_count": network.iteration_count,
                    "model": {
                        "file": f"{stem}.model",
                        "bytes": len(model),
                        "sha256": hashlib.sha256(model).hexdigest(),
                        "class": network.model,
                    },
                    **record,
                    "written_unix_s": time.time(),
                },
                default=_plain,  # NaN stays NaN (an unset threshold state, a diverged score)
            ).encode("utf-8")
            self._dir.make()
            write_bytes(self._dir.join(f"{stem}.model"), model)
            write_bytes(name, text)  # the commit: the checkpoint is complete from here on
        except Exception as exc:
            self.failures += 1
            message = f"checkpoint {name} was not written ({type(exc).__name__}: {exc}); training goes on"
            log.error(message)
            warnings.warn(message, RuntimeWarning, stacklevel=1)
            return
        self.written.append(name)
        log.info("checkpoint %s written (%.1f MB)", name, len(model) / 1e6)
        self._prune()

    def _prune(self) -> None:
        """Delete all but the newest ``keep_last`` complete checkpoints, and the files of any older one
        (a model file without its record: a write that failed)."""
        names = self._dir.names()
        kept = _record_epochs(names)[: self.config.keep_last]
        for name in names:
            m = _FILE.match(name)
            if m and int(m.group(1)) not in kept and int(m.group(1)) < max(kept, default=0):
                self._dir.delete(name)

    def wait(self) -> None:
        """Wait for the write in progress, if any."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None


@dataclass
class _Snapshot:
    """What a checkpoint's model file holds, copied at the epoch end (an fp16 network's loss-scaler state
    is not: a resumed fp16 fit starts its loss scaling afresh)."""

    model: str  # the network class
    conf_json: str
    params: np.ndarray
    updater_state: Callable[[], np.ndarray]
    iteration_count: int
    epoch_count: int


def _plain(value: Any) -> Any:
    """JSON for the NumPy scalars and tuples a master's state or a statistic may hold."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"a checkpoint record cannot hold a {type(value).__name__}")


__all__ = ["Checkpoint", "CheckpointConfig", "FitCheckpoints"]
