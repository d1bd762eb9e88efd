"""Model files: the zip that ``MultiLayerNetwork.save`` writes and ``MultiLayerNetwork.load`` reads.

The layout follows DL4J's ModelSerializer (dl4j-reference.md 6.4) with NumPy ``.npy`` arrays instead
of ``Nd4j.write`` buffers. It is model-agnostic: a model class supplies its name, configuration JSON,
flat parameters and flat updater state, so ComputationGraph files can use the same reader and writer.

Members (ZIP_DEFLATED; exactly these, each once, no archive comment, nothing before the first)::

    member                 content
    sparkgrad-format.json  metadata, a JSON object with exactly these keys:
                             format_version   int: 2, or 3 with a loss-scaler state (this release
                                              writes 2 and 3, reads 1 to 3)
                             model            str: the model class, e.g. "MultiLayerNetwork"
                             iteration_count  int, 0 <= n < 2**63
                             epoch_count      int, 0 <= n < 2**63
                             updater_state    bool: whether updaterState.bin was saved (version 2+)
                             loss_scaler      (version 3 only) an fp16 network's dynamic loss scaling,
                                              saved with the updater state: {"scale": finite float in
                                              (0, 3.4e38], "good_steps": int in [0, 2000),
                                              "skipped_steps": int in [0, 2**63)}
    configuration.json     the configuration's ``to_json()``
    coefficients.bin       .npy (header version 1.0 or 2.0, no pickles): 1-D, ``num_params`` finite
                           elements of exactly the configuration's dtype
    updaterState.bin       .npy like coefficients.bin with the updater state's length; present exactly
                           when ``updater_state`` is true. ``save(save_updater=False)`` or a stateless
                           updater (Sgd, NoOp) writes ``updater_state: false`` and no member.

Version 1 (sparkgrad before issue 8) had no ``updater_state`` key: its updater state is present
exactly when the member is. A damaged member name cannot hide the state in any version, because any
name outside the table is an error; version 2 also tells "not saved" from "lost". Version 3 is written
only for a file with a loss-scaler state (an fp16 network saved with its updater state), so every other
file stays readable by releases that read version 2.

Reading treats every byte as hostile. Each member's declared sizes are checked before anything is
allocated (against the archive's size, deflate's maximum ratio of 1032:1, and what the configuration
implies: a zip bomb or a configuration claiming billions of parameters is rejected, not inflated);
each member is read completely, so zipfile verifies its CRC-32; and every failure of the zip, JSON,
.npy and configuration layers becomes :class:`~sparkgrad.errors.CorruptDataError` naming the file and
the member.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tokenize
import zipfile
import zlib
from contextlib import contextmanager
from typing import IO, Any, BinaryIO, Callable, Iterator, TypeVar, Union

import numpy as np

from sparkgrad._config import MAX_CONFIG_BYTES
from sparkgrad._io import open_input, open_output
from sparkgrad.errors import CorruptDataError
from sparkgrad.nn._precision import LossScaler

FORMAT_VERSION = 3  # the newest version written; files without a loss-scaler state are written as 2
READABLE_VERSIONS = (1, 2, 3)
META_MEMBER = "sparkgrad-format.json"
CONF_MEMBER = "configuration.json"
COEFF_MEMBER = "coefficients.bin"
STATE_MEMBER = "updaterState.bin"
_META_KEYS = {
    1: {"format_version", "model", "iteration_count", "epoch_count"},
    2: {"format_version", "model", "iteration_count", "epoch_count", "updater_state"},
    3: {"format_version", "model", "iteration_count", "epoch_count", "updater_state", "loss_scaler"},
}
MAX_META_BYTES = 1 << 16
MAX_CONF_BYTES = MAX_CONFIG_BYTES  # what the configuration parser accepts at all
_MAX_NPY_HEADER = 1 << 16  # numpy's own header limit for format 1.0; 2.0 headers this size suffice
_DEFLATE_MAX_RATIO = 1032  # deflate cannot expand one compressed byte into more than 1032 bytes
_COUNTER_LIMIT = 2**63
# everything the zip, zlib, JSON, .npy and configuration layers raise on bad input
_FAILURES = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    RuntimeError,  # encrypted members; also NotImplementedError (compression) and RecursionError (JSON)
    OSError,
    EOFError,
    ValueError,  # json, numpy's .npy header parser, UnicodeDecodeError, configuration validation
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    SyntaxError,  # numpy parses the .npy header with tokenize and ast.literal_eval
    tokenize.TokenError,
    OverflowError,
    MemoryError,
    struct.error,
)

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]
T = TypeVar("T")


def write_model(
    target: PathOrFile,
    model: str,
    conf_json: str,
    params: np.ndarray,
    updater_state: np.ndarray | None,
    iteration_count: int,
    epoch_count: int,
    loss_scaler: dict[str, Any] | None = None,
    compress: bool = True,
) -> None:
    """Write a model file.

    Args:
        target: a path (created or truncated; a Hadoop URI such as ``hdfs://``, ``s3a://`` or
            ``file://`` goes through the active Spark session's FileSystem) or a writable binary file.
        model: the model class name the reader will expect.
        conf_json: the configuration as JSON.
        params: the flat parameter vector.
        updater_state: the flat updater state, or None (or empty) to save none.
        iteration_count: iterations trained so far.
        epoch_count: epochs trained so far.
        loss_scaler: an fp16 network's loss-scaler state (``LossScaler.state()``), or None; a file with
            one is format version 3.
        compress: deflate the arrays (False stores them: a copy instead of a deflate pass, which
            float32 parameters shrink by only a few per cent; what checkpoints use).

    Raises:
        ValueError: non-finite parameters or updater state (the reader would reject the file).
    """
    save_state = updater_state is not None and updater_state.size > 0
    for name, array in (("params", params), ("updater state", updater_state if save_state else None)):
        if array is not None and not np.isfinite(array).all():
            raise ValueError(
                f"{name}: element {_first_non_finite(array)} is not finite; a model file with non-finite "
                "values cannot be loaded, so it is not written"
            )
    meta: dict[str, Any] = {
        "format_version": 2,
        "model": model,
        "iteration_count": int(iteration_count),
        "epoch_count": int(epoch_count),
        "updater_state": save_state,
    }
    if loss_scaler is not None:
        meta.update(format_version=3, loss_scaler=LossScaler.from_state(loss_scaler).state())
    with _output(target) as out, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        _write_member(zf, META_MEMBER, json.dumps(meta))
        _write_member(zf, CONF_MEMBER, conf_json)
        _write_member(zf, COEFF_MEMBER, _npy_bytes(params), compress)
        if save_state:
            _write_member(zf, STATE_MEMBER, _npy_bytes(updater_state), compress)  # type: ignore[arg-type]


# Members carry a fixed timestamp so that the same network always saves to the same bytes (checksums,
# caches and content-addressed stores see one file, not one per second of the clock).
_MEMBER_TIMESTAMP = (1980, 1, 1, 0, 0, 0)


def _write_member(zf: zipfile.ZipFile, name: str, data: str | bytes, compress: bool = True) -> None:
    info = zipfile.ZipInfo(name, date_time=_MEMBER_TIMESTAMP)
    info.compress_type = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


@contextmanager
def _output(target: PathOrFile) -> Iterator[BinaryIO]:
    """A path (local, or a Hadoop URI such as ``hdfs://`` or ``s3a://``) opened for writing, or the
    caller's file object as it is."""
    if isinstance(target, (str, os.PathLike)):
        with open_output(target) as f:
            yield f
    else:
        yield target


class ZipArchive:
    """A zip archive read as hostile input: its directory is checked when it opens (duplicate names,
    the members ``required`` and, unless ``allowed`` is None, only those ``allowed``, no data before the
    first member or archive comment, every member's declared sizes against the archive and deflate's
    maximum ratio, no encryption), and members are read whole on request, so zipfile checks their CRC.
    Everything a layer raises on bad bytes becomes :class:`CorruptDataError` naming the file and member.

    Args:
        source: a path (a Hadoop URI such as ``hdfs://``, ``s3a://`` or ``file://`` is read through the
            active Spark session's FileSystem) or a readable, seekable binary file object.
        kind: what the file should be, for error messages ("a sparkgrad model").
        required: member names that must be present.
        allowed: the only member names allowed, or None for any.

    Raises:
        FileNotFoundError: the path does not exist (OSError from opening a path is not corruption).
        CorruptDataError: not a zip of this kind, or damaged; names the file and the member.
    """

    def __init__(
        self, source: PathOrFile, kind: str, required: tuple[str, ...], allowed: tuple[str, ...] | None
    ) -> None:
        self.name = _source_name(source)
        self._member = "the zip directory"
        self._own = open_input(source) if isinstance(source, (str, os.PathLike)) else None
        try:
            with self._guard():
                self._open_archive(self._own or source, kind, required, allowed)  # type: ignore[arg-type]
                self._opened()
        except BaseException:
            self.close()
            raise

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the archive (and the file when a path was opened)."""
        zf = getattr(self, "_zip", None)
        if zf is not None:
            zf.close()
        if self._own is not None:
            self._own.close()

    def __contains__(self, member: str) -> bool:
        return member in self._infos

    def _opened(self) -> None:
        """What a subclass checks once the directory is: nothing here."""

    @contextmanager
    def _guard(self, member: str | None = None) -> Iterator[None]:
        """Turn whatever a layer raises on bad bytes into CorruptDataError naming file and member."""
        if member is not None:
            self._member = member
        try:
            yield
        except CorruptDataError:
            raise
        except _FAILURES as exc:
            raise CorruptDataError(
                f"{self.name}: {self._member}: corrupt or foreign model file ({type(exc).__name__}: {exc})"
            ) from exc

    def _open_archive(
        self, stream: BinaryIO, kind: str, required: tuple[str, ...], allowed: tuple[str, ...] | None
    ) -> None:
        size = stream.seek(0, io.SEEK_END)
        stream.seek(0)
        self._zip = zf = zipfile.ZipFile(stream, "r")
        infos = zf.infolist()
        names = [info.filename for info in infos]
        self._infos = {info.filename: info for info in infos}
        if len(self._infos) != len(names):
            raise CorruptDataError(f"{self.name}: duplicate member names in {sorted(names)}")
        missing = [m for m in required if m not in self._infos]
        if missing:
            raise CorruptDataError(f"{self.name}: not {kind} (missing {', '.join(missing)})")
        unknown = [] if allowed is None else sorted(set(names) - set(allowed))
        if unknown:
            raise CorruptDataError(f"{self.name}: unexpected members {unknown} (damaged or foreign file)")
        if zf.comment or min(info.header_offset for info in infos) != 0:
            raise CorruptDataError(f"{self.name}: data before the first member or an archive comment")
        for info in infos:
            self._check_info(info, size)

    def _check_info(self, info: zipfile.ZipInfo, archive_size: int) -> None:
        """Declared sizes and methods, before anything is decompressed."""
        where = f"{self.name}: {info.filename}"
        if info.flag_bits & 0x1:
            raise CorruptDataError(f"{where}: encrypted members are not supported")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CorruptDataError(f"{where}: unsupported compression method {info.compress_type}")
        if info.header_offset + info.compress_size > archive_size:
            raise CorruptDataError(
                f"{where}: declares {info.compress_size} compressed bytes at offset {info.header_offset}, "
                f"beyond the end of the {archive_size}-byte archive"
            )
        limit = info.compress_size * (_DEFLATE_MAX_RATIO if info.compress_type else 1)
        if info.file_size > limit + 64:  # a few bytes of slack: an empty deflate stream still takes 2
            raise CorruptDataError(
                f"{where}: declares {info.file_size} bytes from {info.compress_size} compressed bytes, "
                "more than the compression method can produce"
            )

    def read(self, member: str, limit: int) -> bytearray:
        """The whole member (at most ``limit`` declared bytes); reading to its end checks the CRC."""
        with self._guard(member):
            info = self._infos[member]
            if info.file_size > limit:
                raise CorruptDataError(
                    f"{self.name}: {member} declares {info.file_size} bytes, the limit is {limit}"
                )
            data = bytearray(info.file_size)
            with self._zip.open(info) as f:
                _read_into(f, memoryview(data))
                if f.read(1):
                    raise CorruptDataError(f"{self.name}: {member} is longer than it declares")
            return data


class ModelReader(ZipArchive):
    """Opens a model file, checks its members and metadata, and reads the rest on request.

    Use as a context manager; read the configuration, then the coefficients (their length comes from
    the configuration), then the updater state (its length from the built model)::

        with ModelReader(path, "MultiLayerNetwork") as reader:
            conf = reader.configuration(MultiLayerConfiguration.from_json)
            params = reader.vector(COEFF_MEMBER, num_params, dtype)
            ...

    Args:
        source: a path (a Hadoop URI such as ``hdfs://``, ``s3a://`` or ``file://`` is read through the
            active Spark session's FileSystem) or a readable, seekable binary file object.
        model: the model class name the file must declare.

    Raises:
        FileNotFoundError: the path does not exist (OSError from opening a path is not corruption).
        CorruptDataError: not a model file of this kind, or damaged; names the file and the member.
    """

    def __init__(self, source: PathOrFile, model: str) -> None:
        self._model = model
        members = (META_MEMBER, CONF_MEMBER, COEFF_MEMBER)
        super().__init__(source, "a sparkgrad model", members, (*members, STATE_MEMBER))

    # -- what the metadata says ----------------------------------------------------------------
    @property
    def has_updater_state(self) -> bool:
        """Whether the file holds an updater state."""
        return self._has_state

    @property
    def loss_scaler(self) -> LossScaler | None:
        """The validated loss-scaler state (version 3), or None."""
        return self._loss_scaler

    @property
    def iteration_count(self) -> int:
        """The validated iteration count."""
        return self._meta["iteration_count"]

    @property
    def epoch_count(self) -> int:
        """The validated epoch count."""
        return self._meta["epoch_count"]

    # -- members --------------------------------------------------------------------------------
    def configuration(self, parse: Callable[[str], T]) -> T:
        """The configuration member parsed by ``parse`` (e.g. ``MultiLayerConfiguration.from_json``).

        Raises:
            CorruptDataError: unreadable member, invalid UTF-8, or ``parse`` rejected it (its
                ValueError/TypeError/RecursionError), naming the member.
        """
        with self._guard(CONF_MEMBER):
            return parse(self.read(CONF_MEMBER, MAX_CONF_BYTES).decode("utf-8"))

    def vector(self, member: str, length: int, dtype: Any) -> np.ndarray:
        """A flat .npy vector member of exactly ``length`` finite elements of ``dtype``.

        Sizes are checked against the member's declared size before the vector is allocated.

        Args:
            member: COEFF_MEMBER or STATE_MEMBER.
            length: the element count the configuration implies.
            dtype: the configured dtype (an exact match is required; float16 is not float32).

        Returns:
            A new native-byte-order array.
        """
        with self._guard(member):
            dtype = np.dtype(dtype)
            info = self._infos.get(member)
            if info is None:
                raise CorruptDataError(f"{self.name}: {member} is missing")
            data_bytes = length * dtype.itemsize
            if not data_bytes <= info.file_size <= data_bytes + _MAX_NPY_HEADER + 16:
                raise CorruptDataError(
                    f"{self.name}: {member} declares {info.file_size} bytes, but {length} {dtype} "
                    f"elements take {data_bytes} plus a .npy header"
                )
            # the whole member first: zipfile checks its CRC before the header is parsed
            raw = self.read(member, data_bytes + _MAX_NPY_HEADER + 16)
            stored_dtype, header_len = self._npy_header(
                io.BytesIO(raw[: _MAX_NPY_HEADER + 16]), member, length
            )
            if dtype.kind != stored_dtype.kind or dtype.itemsize != stored_dtype.itemsize:
                raise CorruptDataError(
                    f"{self.name}: {member} holds {stored_dtype} elements, the configuration needs {dtype}"
                )
            if header_len + data_bytes != len(raw):
                raise CorruptDataError(
                    f"{self.name}: {member} holds {len(raw) - header_len} data bytes, "
                    f"{length} elements need {data_bytes}"
                )
            array = np.frombuffer(raw, dtype=stored_dtype, count=length, offset=header_len)
            if not np.isfinite(array).all():
                raise CorruptDataError(
                    f"{self.name}: {member}: element {_first_non_finite(array)} is not finite"
                )
            return array if stored_dtype.isnative else array.astype(dtype)

    # -- internals -----------------------------------------------------------------------------
    def _opened(self) -> None:
        self._member = META_MEMBER
        self._meta = self._read_meta(self._model)
        has_member = STATE_MEMBER in self._infos
        declared = self._meta.get("updater_state", has_member)  # version 1: the member decides
        if declared != has_member:
            raise CorruptDataError(
                f"{self.name}: {STATE_MEMBER} is {'present' if has_member else 'missing'}, but "
                f"{META_MEMBER} says the updater state was {'saved' if declared else 'not saved'}"
            )
        self._has_state = has_member

    def _read_meta(self, model: str) -> dict:
        meta = json.loads(
            self.read(META_MEMBER, MAX_META_BYTES).decode("utf-8"),
            object_pairs_hook=_unique_keys,
            parse_constant=_reject_constant,
        )
        if not isinstance(meta, dict):
            raise CorruptDataError(
                f"{self.name}: {META_MEMBER}: expected a JSON object, got {type(meta).__name__}"
            )
        version = meta.get("format_version")
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise CorruptDataError(
                f"{self.name}: {META_MEMBER}: unsupported format_version {version!r} (this sparkgrad reads "
                f"{', '.join(map(str, READABLE_VERSIONS))})"
            )
        if set(meta) != _META_KEYS[version]:
            raise CorruptDataError(
                f"{self.name}: {META_MEMBER}: keys {sorted(meta)}, version {version} has exactly "
                f"{sorted(_META_KEYS[version])}"
            )
        if meta["model"] != model:
            raise CorruptDataError(f"{self.name}: {META_MEMBER}: holds a {meta['model']!r}, not a {model!r}")
        for key in ("iteration_count", "epoch_count"):
            value = meta[key]
            if type(value) is not int or not 0 <= value < _COUNTER_LIMIT:
                raise CorruptDataError(
                    f"{self.name}: {META_MEMBER}: {key} must be an integer in [0, 2**63), got {value!r}"
                )
        if version >= 2 and type(meta["updater_state"]) is not bool:
            raise CorruptDataError(
                f"{self.name}: {META_MEMBER}: updater_state must be true or false, "
                f"got {meta['updater_state']!r}"
            )
        self._loss_scaler = LossScaler.from_state(meta["loss_scaler"]) if version >= 3 else None
        return meta

    def _npy_header(self, f: BinaryIO, member: str, length: int) -> tuple[np.dtype, int]:
        """Parse and check the .npy header at the start of ``f``; returns (dtype, header length)."""
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=_MAX_NPY_HEADER)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=_MAX_NPY_HEADER)
        else:
            raise CorruptDataError(f"{self.name}: {member}: unsupported .npy version {version}")
        if dtype.hasobject or dtype.kind != "f":
            raise CorruptDataError(f"{self.name}: {member}: holds {dtype} elements, not floating point")
        if shape != (length,):
            raise CorruptDataError(
                f"{self.name}: {member} holds shape {shape}, the configuration needs ({length},)"
            )
        return dtype, f.tell()


def _read_into(f: IO[bytes], target: memoryview) -> None:
    done = 0
    while done < target.nbytes:
        chunk = f.read(min(target.nbytes - done, 1 << 24))
        if not chunk:
            raise EOFError(f"data ends after {done} of {target.nbytes} bytes")
        target[done : done + len(chunk)] = chunk
        done += len(chunk)


def _unique_keys(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys in a JSON object: {sorted(keys)}")
    return dict(pairs)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def _first_non_finite(array: np.ndarray) -> int:
    return int(np.flatnonzero(~np.isfinite(array))[0])


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _source_name(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fsdecode(os.fspath(source))
    name = getattr(source, "name", None)
    return os.fsdecode(name) if isinstance(name, (str, bytes)) else f"<{type(source).__name__}>"


__all__ = ["FORMAT_VERSION", "ModelReader", "ZipArchive", "write_model"]
