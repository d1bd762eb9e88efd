"""Common base of the evaluation classes: input checking and flattening, state (de)serialisation.

Every evaluation keeps its whole state in a few NumPy arrays and plain numbers (``_get_state``), so the
same mapping serves JSON (``to_json``/``from_json``), pickling (Spark ships evaluations between
executors and the driver) and equality checks in tests. ``merge`` is exact, associative and accepts
a fresh (never evaluated) instance on either side, because Spark's ``treeAggregate`` combines partial
evaluations in any grouping and starts from empty ones.
"""

from __future__ import annotations

import abc
import base64
import json
import os
from typing import Any, ClassVar, Sequence, TypeVar

import numpy as np

from sparkgrad._io import read_bytes, write_text
from sparkgrad.errors import CorruptDataError

E = TypeVar("E", bound="BaseEvaluation")

_TYPE_KEY = "@type"
_ARRAY_KEY = "@ndarray"
_FORMAT_VERSION = 1


class BaseEvaluation(abc.ABC):
    """Abstract evaluation: ``eval`` batches, ``merge`` partial results, report with ``stats``.

    Subclasses register themselves by class name so :meth:`from_json` on the base class restores the
    stored type.
    """

    _registry: ClassVar[dict[str, type[BaseEvaluation]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "__abstractmethods__", None):
            BaseEvaluation._registry[cls.__name__] = cls

    # -- the evaluation contract ---------------------------------------------------------------
    @abc.abstractmethod
    def eval(self, labels: Any, predictions: Any, mask: Any = None) -> None:
        """Accumulate one batch.

        Args:
            labels: array (batch, size) or time series (batch, size, time); rank 1 means one column.
            predictions: array of the same shape as ``labels``.
            mask: optional; (batch,) removes examples, (batch, time) removes time steps, an array of
                the labels' shape masks single outputs (only where the class supports it).
        """

    @abc.abstractmethod
    def merge(self: E, other: E) -> E:
        """Add ``other``'s counts into this evaluation (exactly as if one had seen both inputs).

        Args:
            other: an evaluation of the same class and configuration, possibly fresh.

        Returns:
            ``self``, so ``functools.reduce(lambda a, b: a.merge(b), parts)`` works.
        """

    @abc.abstractmethod
    def stats(self) -> str:
        """Human-readable summary in the layout Deeplearning4j prints."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every accumulated example, keeping the configuration."""

    @abc.abstractmethod
    def _get_state(self) -> dict[str, Any]:
        """Complete state: configuration and accumulators (arrays, numbers, strings, lists)."""

    @abc.abstractmethod
    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore the state produced by :meth:`_get_state`."""

    # -- serialisation -------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # Only the accumulators travel; caches (sorted curves) are rebuilt on demand.
        return self._get_state()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._set_state(state)

    def to_json(self) -> str:
        """Serialise the exact state; arrays are stored as base64 of their little-endian bytes.

        Returns:
            A JSON document that :meth:`from_json` turns back into an equal evaluation.
        """
        doc = {
            _TYPE_KEY: type(self).__name__,
            "version": _FORMAT_VERSION,
            "state": _encode(self._get_state()),
        }
        return json.dumps(doc, allow_nan=True)

    @classmethod
    def from_json(cls: type[E], text: str) -> E:
        """Rebuild an evaluation from :meth:`to_json` output.

        Args:
            text: the JSON document. On ``BaseEvaluation`` any stored evaluation type is accepted; on a
                subclass the stored type must be that subclass (or derive from it).

        Returns:
            The restored evaluation.
        """
        try:
            doc = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{cls.__name__}.from_json: text is not valid JSON ({exc})") from exc
        if not isinstance(doc, dict) or _TYPE_KEY not in doc or "state" not in doc:
            raise ValueError(f"{cls.__name__}.from_json: text is not a serialised evaluation")
        if doc.get("version") != _FORMAT_VERSION:
            raise ValueError(f"{cls.__name__}.from_json: unsupported format version {doc.get('version')!r}")
        target = BaseEvaluation._registry.get(doc[_TYPE_KEY])
        if target is None or not issubclass(target, cls):
            raise ValueError(
                f"{cls.__name__}.from_json: text holds a {doc[_TYPE_KEY]!r}, not a {cls.__name__}"
            )
        obj = target.__new__(target)
        try:
            obj._set_state(_decode(doc["state"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{cls.__name__}.from_json: incomplete or damaged state ({exc!r})") from exc
        return obj

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` to a file.

        Args:
            path: a local path, or a URI any Hadoop FileSystem of the active Spark session handles
                (``hdfs://``, ``s3a://``, ``file://``); created or overwritten.
        """
        write_text(path, self.to_json())

    @classmethod
    def load(cls: type[E], path: str | os.PathLike[str]) -> E:
        """Read an evaluation written by :meth:`save` (or any :meth:`to_json` text stored in a file).

        Args:
            path: a local path or a Hadoop URI, as for :meth:`save`.

        Returns:
            The restored evaluation (of ``cls`` or a subclass, as :meth:`from_json`).

        Raises:
            FileNotFoundError: no such file.
            CorruptDataError: the file is not a saved evaluation of this type, or is damaged; names it.
        """
        text = read_bytes(path)
        try:
            return cls.from_json(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CorruptDataError(f"{os.fspath(path)}: not a saved {cls.__name__} ({exc})") from exc

    def _check_mergeable(self, other: Any) -> None:
        if type(other) is not type(self):
            raise TypeError(f"other: cannot merge a {type(other).__name__} into a {type(self).__name__}")


def _encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))
        return {
            _ARRAY_KEY: data.dtype.str,
            "shape": list(value.shape),
            "data": base64.b64encode(data.tobytes()).decode("ascii"),
        }
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and _ARRAY_KEY in value:
        try:
            raw = base64.b64decode(value["data"], validate=True)
            arr = np.frombuffer(raw, dtype=np.dtype(value[_ARRAY_KEY])).reshape(value["shape"])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"from_json: damaged array in the stored state ({exc})") from exc
        return arr.astype(arr.dtype.newbyteorder("="), copy=True)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


# -- input handling ------------------------------------------------------------------------------


def as_numeric(x: Any, name: str, owner: str) -> np.ndarray:
    """``x`` as a NumPy array of a real numeric dtype without NaN; errors name the argument."""
    if x is None:
        raise ValueError(f"{owner}: {name} must be an array, got None")
    arr = np.asarray(x)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int8)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{owner}: {name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ValueError(f"{owner}: {name} contains NaN")
    return arr


def _to_rows(arr: np.ndarray) -> np.ndarray:
    """(batch, size, *rest) -> (batch * prod(rest), size): one row per example and time step/position."""
    if arr.ndim == 2:
        return arr
    return np.moveaxis(arr, 1, -1).reshape(-1, arr.shape[1])


def flatten_inputs(
    labels: Any, predictions: Any, mask: Any, *, owner: str, per_output_mask: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Check shapes and flatten to 2-D rows as Deeplearning4j's ``reshapeAndExtractNotMasked`` does.

    Args:
        labels: (batch,), (batch, size) or (batch, size, *rest) such as (batch, size, time).
        predictions: same shape as ``labels``.
        mask: None; (batch,) per example; (batch, *rest) or (batch, 1, *rest) per time step/position;
            the labels' shape per output.
        owner: class name used in error messages.
        per_output_mask: whether the caller supports per-output masks; if not, a per-output mask must
            be constant along the output axis.

    Returns:
        (labels, predictions, output_mask): 2-D arrays holding only unmasked rows, and a boolean
        (rows, size) mask for per-output masking or None.
    """
    where = f"{owner}.eval"
    lab = as_numeric(labels, "labels", where)
    pred = as_numeric(predictions, "predictions", where)
    if lab.ndim == 0:
        raise ValueError(f"{where}: labels must have at least one dimension, got a scalar")
    if lab.shape != pred.shape:
        raise ValueError(f"{where}: predictions shape {pred.shape} does not match labels shape {lab.shape}")
    if lab.ndim == 1:
        lab, pred = lab[:, None], pred[:, None]
    full = lab.shape
    lab2, pred2 = _to_rows(lab), _to_rows(pred)
    if mask is None:
        return lab2, pred2, None
    m = as_numeric(mask, "mask", where)
    batch, size, rest = full[0], full[1], full[2:]
    if m.shape == full and size > 1:
        out = _to_rows(m) != 0
        if not per_output_mask:
            if not (out == out[:, :1]).all():
                raise ValueError(f"{where}: mask is per-output, which {owner} does not support")
            keep = out[:, 0]
            return lab2[keep], pred2[keep], None
        keep = out.any(axis=1)
        return lab2[keep], pred2[keep], out[keep]
    if m.shape in ((batch,), (batch, 1)) and not rest:
        keep = m.reshape(-1) != 0
    elif m.shape == (batch,):
        keep = np.repeat(m != 0, int(np.prod(rest)))
    elif rest and m.shape in ((batch, *rest), (batch, 1, *rest)):
        keep = m.reshape(batch, -1).reshape(-1) != 0
    else:
        expected = [(batch,), (batch, *rest)] if rest else [(batch,), (batch, 1)]
        if size > 1 or rest:
            expected.append(full)
        raise ValueError(f"{where}: mask shape {m.shape} fits none of {expected} for labels {full}")
    return lab2[keep], pred2[keep], None


def check_columns(
    current: int | None, got: int, owner: str, what: str = "columns", subject: str = "labels"
) -> int:
    """The fixed column count: ``got`` on first use, else it must equal ``current``.

    Args:
        current: the count fixed so far, or None.
        got: the count of the new input.
        owner: class name for the message.
        what: the unit ("columns", "classes", "outputs").
        subject: the argument that brought ``got`` ("labels" in eval, "other" in merge).

    Returns:
        The column count.
    """
    if current is not None and current != got:
        raise ValueError(f"{owner}: {subject} has {got} {what}, but this evaluation has {current}")
    return got


def check_names(names: Sequence[str] | None, field: str) -> list[str] | None:
    """Optional class/column names: a sequence of strings (not one string)."""
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{field}: expected a sequence of strings, got {names!r}")
    return list(names)


def name_width(names: Sequence[str], minimum: int = 15) -> int:
    """Width of the name column in DL4J's tables: the longest name (at least ``minimum``) plus 5."""
    return max(minimum, *(len(n) for n in names)) + 5


def format_value(v: float) -> str:
    """DL4J's ``DecimalFormat("0.0000")``; NaN and infinities printed raw."""
    if np.isnan(v) or np.isinf(v):
        return str(float(v))
    return f"{v:.4f}"
