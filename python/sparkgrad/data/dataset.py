"""DataSet and MultiDataSet: features, labels and masks whose first dimension indexes examples."""

from __future__ import annotations

import operator
from typing import Any, Callable, ClassVar, Iterator, Sequence, TypeGuard, TypeVar, Union

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.data import serialization as fmt
from sparkgrad.errors import CorruptDataError

E = TypeVar("E", bound="_Examples")
ArrayLike = Any
Index = Union[int, slice, Sequence[int], np.ndarray]

_MASK_GROUPS = (2, 3)  # group indices of the features and labels masks


def _as_array(value: ArrayLike, name: str) -> np.ndarray | None:
    """``value`` as a numpy array (no copy for numpy input), or None; rejects unstorable dtypes."""
    if value is None:
        return None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name}: expected a numpy array, got {type(value).__name__} ({exc})") from None
    if not fmt.supported_dtype(array.dtype):
        raise TypeError(f"{name}: unsupported dtype {array.dtype} (supported: {fmt.supported_dtype_names()})")
    if array.ndim == 0:
        raise ValueError(f"{name}: expected at least one dimension (examples first), got a scalar")
    return array


def check_seed(seed: int | None, name: str = "seed") -> int | None:
    """Validate an optional non-negative integer seed (numpy's SeedSequence rejects negatives)."""
    return None if seed is None else check_int(name, seed, minimum=0)


def _arrays_equal(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is b
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    )


def _loss_mask_fill(groups: Sequence[Sequence[np.ndarray | None]]) -> np.ndarray | None:
    """The mask a network masks an unmasked labels array's loss with: the only features mask, when
    there is exactly one and it is ``(n, time)``; merge fills a padded labels mask with it."""
    given = [m for m in groups[2] if m is not None]
    return given[0] if len(given) == 1 and given[0].ndim == 2 else None


def _describe(array: np.ndarray | None) -> str:
    return "None" if array is None else f"{array.dtype}{array.shape}"


class _Examples:
    """Shared behaviour: arrays kept as four groups (features, labels, features masks, labels masks).

    Subclasses define how the groups map to constructor arguments and names; every operation below
    (indexing, split, merge, shuffle, equality, serialisation) works on the groups generically.
    """

    __slots__ = ("_groups",)
    _KIND: ClassVar[int]

    _groups: tuple[tuple[np.ndarray | None, ...], ...]

    # -- subclass hooks --------------------------------------------------------------------------
    @classmethod
    def _from_groups(cls: type[E], groups: Sequence[Sequence[np.ndarray | None]]) -> E:
        raise NotImplementedError  # pragma: no cover - abstract

    @staticmethod
    def _slot_name(group: int, index: int) -> str:
        raise NotImplementedError  # pragma: no cover - abstract

    def _ctor_args(self) -> tuple:
        raise NotImplementedError  # pragma: no cover - abstract

    # -- construction ----------------------------------------------------------------------------
    def _set_groups(self, groups: Sequence[Sequence[ArrayLike]]) -> None:
        """Convert and validate every array; the first features array fixes the number of examples."""
        converted = tuple(
            tuple(_as_array(value, self._slot_name(g, i)) for i, value in enumerate(group))
            for g, group in enumerate(groups)
        )
        first = converted[0][0]
        if first is None:
            raise ValueError(f"{self._slot_name(0, 0)}: is required")
        n = first.shape[0]
        for g, group in enumerate(converted):
            for i, array in enumerate(group):
                if array is not None and array.shape[0] != n:
                    raise ValueError(
                        f"{self._slot_name(g, i)}: has {array.shape[0]} examples (first dimension) but "
                        f"{self._slot_name(0, 0)} has {n}"
                    )
        self._groups = converted

    # -- size and indexing -----------------------------------------------------------------------
    def num_examples(self) -> int:
        """Number of examples (the first dimension of every array)."""
        features = self._groups[0][0]
        assert features is not None  # _set_groups requires it
        return int(features.shape[0])

    def __len__(self) -> int:
        return self.num_examples()

    @property
    def nbytes(self) -> int:
        """Bytes held by all arrays (features, labels, masks), as numpy's ``nbytes`` counts them."""
        return sum(a.nbytes for group in self._groups for a in group if a is not None)

    # not iterable (indexing alone would make it iterate one-example objects): a (Multi)DataSet is
    # one minibatch wherever "a DataSet or an iterable of DataSets" is accepted; use split() instead
    __iter__ = None

    def _map(self: E, fn: Callable[[np.ndarray], np.ndarray]) -> E:
        return self._from_groups([[None if a is None else fn(a) for a in group] for group in self._groups])

    def __getitem__(self: E, key: Index) -> E:
        """Examples selected along the first axis.

        An int gives a one-example object (the example dimension is kept), a slice gives views, an
        integer or boolean index array gives copies (numpy semantics).
        """
        n = self.num_examples()
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            i = operator.index(key)
            if not -n <= i < n:
                raise IndexError(f"example index {i} out of range for {n} examples")
            i %= n
            key = slice(i, i + 1)
        elif not isinstance(key, slice):
            key = np.asarray(key)
            if key.size == 0:  # np.asarray([]) is float64
                key = key.astype(np.intp)
            if key.ndim != 1 or key.dtype.kind not in "iub" or (key.dtype.kind == "b" and key.size != n):
                raise IndexError(
                    f"expected an int, a slice, a 1-D integer array or a boolean array of length {n}, "
                    f"got {key.dtype} array of shape {key.shape}"
                )
        return self._map(lambda a: a[key])

    def split(self: E, batch_size: int) -> list[E]:
        """Consecutive batches of ``batch_size`` examples (the last may be smaller), as views.

        Args:
            batch_size: examples per batch, at least 1.

        Returns:
            The batches in order; ``merge`` of them equals this object.
        """
        batch_size = check_int("batch_size", batch_size, minimum=1)
        return [self[i : i + batch_size] for i in range(0, self.num_examples(), batch_size)]

    def shuffle(self: E, seed: int | None = None) -> E:
        """A new object with the examples in random order (every array permuted the same way).

        Args:
            seed: non-negative integer for a reproducible order; None draws fresh entropy.

        Returns:
            The shuffled copy; this object is unchanged.
        """
        return self[np.random.default_rng(check_seed(seed)).permutation(self.num_examples())]

    @classmethod
    def merge(cls: type[E], datasets: Sequence[E]) -> E:
        """Concatenate examples of several objects of the same structure.

        A mask present in some inputs and absent in others is filled with ones (nothing masked) for
        the latter. Every other array must be present in all inputs or in none.

        Time series of different lengths merge as in DL4J: rank-3 ``(n, size, time)`` arrays (each
        features or labels slot separately) whose sizes agree are padded with zeros at the end to the
        longest length, and the slot's mask becomes ``(n, longest)``: each input's own mask (padded
        along its last axis like the data when it is a per-output ``(n, size, time)`` mask), else
        ones, over its steps and zeros over the padding. An input without a labels mask whose only
        features mask is ``(n, time)`` of the labels' length gets that features mask instead of ones,
        as the network would have masked its loss with it. Masks take the dtype of the given masks,
        else the data's floating dtype, else float32. Equal lengths merge exactly as other arrays.

        Args:
            datasets: non-empty sequence of objects of this class.

        Returns:
            One object holding all examples in order.

        Raises:
            TypeError: an element is not of this class.
            ValueError: empty input, or arrays whose count, presence or trailing shape disagree
                other than by time series lengths, or a mask whose time axis disagrees with its
                padded array's (the message names the offending index).
        """
        datasets = list(datasets)
        if not datasets:
            raise ValueError("datasets: expected at least one element, got an empty sequence")
        for i, ds in enumerate(datasets):
            if not isinstance(ds, cls):
                raise TypeError(f"datasets[{i}]: expected a {cls.__name__}, got {type(ds).__name__}")
        groups = [ds._padded_groups() for ds in datasets]
        counts = [len(g) for g in groups[0]]
        for i, ds_groups in enumerate(groups):
            if [len(g) for g in ds_groups] != counts:
                raise ValueError(
                    f"datasets[{i}]: has {[len(g) for g in ds_groups]} (features, labels, features masks, "
                    f"labels masks) arrays, datasets[0] has {counts}"
                )
        sizes = [ds.num_examples() for ds in datasets]
        merged: list[list[np.ndarray | None]] = [[None] * c for c in counts]
        for g in (0, 1):
            for s in range(counts[g]):
                arrays = [dg[g][s] for dg in groups]
                masks = [dg[g + 2][s] for dg in groups]
                if cls._needs_padding(arrays):
                    fills: list[np.ndarray | None] = (
                        [None] * len(groups) if g == 0 else [_loss_mask_fill(dg) for dg in groups]
                    )
                    merged[g][s], merged[g + 2][s] = cls._merge_padded(arrays, masks, fills, sizes, g, s)
                else:
                    merged[g][s] = cls._merge_slot(arrays, sizes, g, s)
                    merged[g + 2][s] = cls._merge_slot(masks, sizes, g + 2, s)
        return cls._from_groups(merged)

    def _padded_groups(self) -> list[tuple[np.ndarray | None, ...]]:
        """The groups with an absent masks list expanded to one None per array, for merging."""
        groups = list(self._groups)
        for g in _MASK_GROUPS:
            groups[g] = groups[g] or (None,) * len(groups[g - 2])
        return groups

    @classmethod
    def _merge_slot(
        cls, arrays: list[np.ndarray | None], sizes: list[int], g: int, s: int
    ) -> np.ndarray | None:
        ref_index = next((i for i, a in enumerate(arrays) if a is not None), None)
        if ref_index is None:
            return None
        ref = np.asarray(arrays[ref_index])
        name = cls._slot_name(g, s)
        filled: list[np.ndarray] = []
        for i, a in enumerate(arrays):
            if a is None:
                if g not in _MASK_GROUPS:
                    raise ValueError(f"datasets[{i}]: has no {name} but datasets[{ref_index}] has")
                a = np.ones((sizes[i],) + ref.shape[1:], dtype=ref.dtype)
            elif a.shape[1:] != ref.shape[1:]:
                raise ValueError(
                    f"datasets[{i}]: {name} has shape {a.shape}, expected (n, "
                    f"{', '.join(map(str, ref.shape[1:]))}) as in datasets[{ref_index}]"
                )
            filled.append(a)
        return np.concatenate(filled, axis=0)

    @staticmethod
    def _needs_padding(arrays: list[np.ndarray | None]) -> TypeGuard[list[np.ndarray]]:
        """Whether the slot holds time series (all rank 3, equal sizes) of different lengths."""
        present = [a for a in arrays if a is not None and a.ndim == 3]
        if len(present) != len(arrays):
            return False
        return len({a.shape[1] for a in present}) == 1 and len({a.shape[2] for a in present}) > 1

    @classmethod
    def _merge_padded(
        cls,
        arrays: list[np.ndarray],
        masks: list[np.ndarray | None],
        fills: list[np.ndarray | None],
        sizes: list[int],
        g: int,
        s: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Time series padded at the end to the longest length, and their mask marking the padding.

        ``fills``: per input, an ``(n, time)`` mask to use where ``masks`` has None (else ones)."""
        lengths = [a.shape[2] for a in arrays]
        rows = np.cumsum([0, *sizes])
        data = np.zeros((rows[-1], arrays[0].shape[1], max(lengths)), np.result_type(*arrays))
        for i, a in enumerate(arrays):
            data[rows[i] : rows[i + 1], :, : lengths[i]] = a
        name = cls._slot_name(g + 2, s)
        ref = next((m for m in masks if m is not None), None)
        middle = () if ref is None else ref.shape[1:-1]  # per-output masks: (n, size, time)
        for i, m in enumerate(masks):
            if m is not None and m.shape[1:] != (*middle, lengths[i]):
                raise ValueError(
                    f"datasets[{i}]: {name} has shape {m.shape}, expected (n, "
                    f"{', '.join(map(str, (*middle, lengths[i])))}) for {cls._slot_name(g, s)} of "
                    f"shape {arrays[i].shape}"
                )
        used = [
            m if m is not None else f if f is not None and f.shape[1] == t else None
            for m, f, t in zip(masks, fills, lengths)
        ]
        present = [m for m in used if m is not None]
        dtype = np.result_type(*present) if present else data.dtype if data.dtype.kind == "f" else np.float32
        mask = np.zeros((rows[-1], *middle, max(lengths)), dtype)
        for i, m in enumerate(used):
            steps = mask[rows[i] : rows[i + 1], ..., : lengths[i]]
            if m is None:
                steps[...] = 1
            elif m.ndim < steps.ndim:  # an (n, time) fill on every output of per-output masks
                steps[...] = m.reshape(m.shape[0], *(1,) * (steps.ndim - 2), m.shape[1])
            else:
                steps[...] = m
        return data, mask

    # -- comparison, display, pickling -----------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        """Exact equality: same class, same arrays present, equal dtypes, shapes and values."""
        if type(other) is not type(self):
            return NotImplemented
        return all(
            len(a) == len(b) and all(_arrays_equal(x, y) for x, y in zip(a, b))
            for a, b in zip(self._groups, other._groups)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays

    def __reduce__(self) -> tuple:
        # rebuilt through the constructor: arrays pickle natively (out-of-band with protocol 5)
        return (type(self), self._ctor_args())

    # -- serialisation ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """This object in the binary format of :mod:`sparkgrad.data.serialization`."""
        return fmt.record_bytes(self._KIND, self._groups)

    @classmethod
    def from_bytes(cls: type[E], data: bytes | bytearray | memoryview, source: str = "<bytes>") -> E:
        """Rebuild an object from :meth:`to_bytes` output.

        Args:
            data: bytes holding exactly one record.
            source: name used in error messages (e.g. the path Spark read the bytes from).

        Raises:
            CorruptDataError: truncated, damaged (checksum), foreign, wrong-version or wrong-kind data,
                or data after the record; names ``source`` and the field.
        """
        return cls._checked(fmt.parse_bytes(data, cls._KIND, source), source)

    def save(self, path_or_binary_file: fmt.PathOrFile) -> None:
        """Write this object to a path or a binary file object.

        A path is a local path (str / os.PathLike) or a URI; a ``file:`` URI works anywhere, any other
        scheme (``hdfs://``, ``s3a://``, ``abfs://``, ``gs://``...) on the driver of an active Spark
        session, through its Hadoop FileSystem (the cluster's configuration and credentials). The
        file is replaced atomically: the record goes to a hidden temporary sibling that is renamed
        over the target, so a failed write leaves the previous file (or none), never a partial one.
        Inside Spark tasks, write data sets with :func:`sparkgrad.spark.export_minibatches` instead.

        Args:
            path_or_binary_file: destination; a path is created or replaced, a file object is
                written at its current position and left open.

        Raises:
            EnvironmentNotReadyError: a non-``file:`` URI without an active Spark session (for
                example in a Spark task).
            IsADirectoryError: the path is a directory.
            FileNotFoundError: a local path whose directory does not exist.
            OSError: the file system refused the write (names the path).
        """
        fmt.save_record(path_or_binary_file, self._KIND, self._groups)

    @classmethod
    def load(cls: type[E], path_or_binary_file: fmt.PathOrFile) -> E:
        """Read an object written by :meth:`save`.

        Args:
            path_or_binary_file: a path, local or a URI as :meth:`save` takes (the whole file must be
                one record), or a binary file object (one record is read from its current position,
                and the stream must end there: use :meth:`load_records` for a stream of several
                records).

        Raises:
            FileNotFoundError: no such file (names it).
            EnvironmentNotReadyError: a non-``file:`` URI without an active Spark session.
            CorruptDataError: truncated, damaged (checksum), foreign, wrong-version or wrong-kind data,
                or data after the record; names the file and the field.
        """
        groups = fmt.load_record(path_or_binary_file, cls._KIND)
        return cls._checked(groups, fmt.source_name(path_or_binary_file))

    @classmethod
    def load_records(cls: type[E], path_or_binary_file: fmt.PathOrFile) -> Iterator[E]:
        """Read consecutive objects written by several :meth:`save` calls on one file.

        Args:
            path_or_binary_file: a path, or a binary file object read from its current position.

        Yields:
            Each object in order, until the stream ends cleanly between two records.

        Raises:
            CorruptDataError: a damaged record or a stream ending inside one; names the file.
        """
        source = fmt.source_name(path_or_binary_file)
        for groups in fmt.iter_records(path_or_binary_file, cls._KIND):
            yield cls._checked(groups, source)

    @classmethod
    def _checked(cls: type[E], groups: fmt.Groups, source: str) -> E:
        try:
            return cls._from_groups(groups)
        except (TypeError, ValueError) as exc:
            raise CorruptDataError(f"{source}: inconsistent arrays: {exc}") from None


class DataSet(_Examples):
    """Features and optional labels and masks of a batch of examples (DL4J's ``DataSet``).

    Arrays are kept as given (no copy for numpy input); their first dimension indexes examples and
    must agree. Feed-forward features are ``(batch, n_in)``, convolutional ``(batch, c, h, w)``,
    recurrent ``(batch, size, time)`` with masks ``(batch, time)``.

    Args:
        features: array of at least one dimension.
        labels: optional array with the same number of examples.
        features_mask: optional mask for the features (1 = present, 0 = padding).
        labels_mask: optional mask for the labels.

    Raises:
        TypeError: an argument is not an array of a storable dtype (float16/32/64, ints, bool).
        ValueError: an array is a scalar or its first dimension disagrees with the features', or a
            labels mask is given without labels.
    """

    __slots__ = ()
    _KIND = fmt.KIND_DATASET
    _NAMES = ("features", "labels", "features_mask", "labels_mask")

    def __init__(
        self,
        features: ArrayLike,
        labels: ArrayLike = None,
        features_mask: ArrayLike = None,
        labels_mask: ArrayLike = None,
    ) -> None:
        if features is None:
            raise TypeError("features: expected a numpy array, got None")
        if labels is None and labels_mask is not None:
            raise ValueError("labels_mask: given without labels")
        self._set_groups([[features], [labels], [features_mask], [labels_mask]])

    @classmethod
    def _from_groups(cls, groups: Sequence[Sequence[np.ndarray | None]]) -> DataSet:
        return cls(*(group[0] for group in groups))

    @staticmethod
    def _slot_name(group: int, index: int) -> str:
        return DataSet._NAMES[group]

    def _ctor_args(self) -> tuple:
        return tuple(group[0] for group in self._groups)

    @property
    def features(self) -> np.ndarray:
        """Input features, examples first."""
        return self._groups[0][0]  # type: ignore[return-value]

    @property
    def labels(self) -> np.ndarray | None:
        """Labels, or None."""
        return self._groups[1][0]

    @property
    def features_mask(self) -> np.ndarray | None:
        """Features mask, or None."""
        return self._groups[2][0]

    @property
    def labels_mask(self) -> np.ndarray | None:
        """Labels mask, or None."""
        return self._groups[3][0]

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={_describe(group[0])}" for name, group in zip(self._NAMES, self._groups))
        return f"DataSet(num_examples={self.num_examples()}, {parts})"


class MultiDataSet(_Examples):
    """Several features and labels arrays per example, for multi-input/output graphs (DL4J's
    ``MultiDataSet``).

    Args:
        features: non-empty list of arrays (a single array is taken as a one-element list).
        labels: list of arrays (None or a single array as for features).
        features_masks: None, or a list with one entry (array or None) per features array.
        labels_masks: None, or a list with one entry (array or None) per labels array.

    A masks list whose entries are all None is stored as None.

    Raises:
        TypeError: an argument is not a list of arrays of a storable dtype.
        ValueError: empty features, a masks list of the wrong length, or a first dimension that
            disagrees with ``features[0]``.
    """

    __slots__ = ()
    _KIND = fmt.KIND_MULTIDATASET
    _NAMES = ("features", "labels", "features_masks", "labels_masks")

    def __init__(
        self,
        features: ArrayLike | Sequence[ArrayLike],
        labels: ArrayLike | Sequence[ArrayLike] | None = None,
        features_masks: Sequence[ArrayLike] | None = None,
        labels_masks: Sequence[ArrayLike] | None = None,
    ) -> None:
        features_list = self._as_list(features, "features")
        labels_list = self._as_list(labels, "labels")
        if not features_list:
            raise ValueError("features: expected at least one array, got an empty list")
        masks = [
            self._masks(masks_value, name, len(arrays))
            for masks_value, name, arrays in (
                (features_masks, "features_masks", features_list),
                (labels_masks, "labels_masks", labels_list),
            )
        ]
        self._set_groups([features_list, labels_list, *masks])

    @staticmethod
    def _as_list(value: Any, name: str) -> list:
        if value is None:
            return []
        if isinstance(value, np.ndarray):
            return [value]
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{name}: expected a list of numpy arrays, got {type(value).__name__}")
        for i, item in enumerate(value):
            if item is None and name in ("features", "labels"):
                raise TypeError(f"{name}[{i}]: expected a numpy array, got None")
        return list(value)

    @classmethod
    def _masks(cls, value: Any, name: str, expected: int) -> list:
        masks = cls._as_list(value, name)
        if masks and len(masks) != expected:
            raise ValueError(
                f"{name}: expected {expected} entries (one per array, None allowed), got {len(masks)}"
            )
        return masks if any(m is not None for m in masks) else []

    @classmethod
    def from_dataset(cls, dataset: DataSet) -> MultiDataSet:
        """The one-input MultiDataSet (one output when ``dataset`` has labels) sharing its arrays.

        Args:
            dataset: the DataSet to wrap.

        Returns:
            A MultiDataSet whose arrays are the DataSet's (no copy).
        """
        if not isinstance(dataset, DataSet):
            raise TypeError(f"dataset: expected a DataSet, got {type(dataset).__name__}")
        has_labels = dataset.labels is not None
        return cls(
            [dataset.features],
            [dataset.labels] if has_labels else [],
            [dataset.features_mask],
            [dataset.labels_mask] if has_labels else None,
        )

    @classmethod
    def _from_groups(cls, groups: Sequence[Sequence[np.ndarray | None]]) -> MultiDataSet:
        return cls(*(list(group) for group in groups))

    @staticmethod
    def _slot_name(group: int, index: int) -> str:
        return f"{MultiDataSet._NAMES[group]}[{index}]"

    def _ctor_args(self) -> tuple:
        return tuple(list(group) or None for group in self._groups)

    @property
    def features(self) -> list[np.ndarray]:
        """Features arrays (a new list each time; the arrays are shared)."""
        return list(self._groups[0])  # type: ignore[arg-type]

    @property
    def labels(self) -> list[np.ndarray]:
        """Labels arrays (possibly empty)."""
        return list(self._groups[1])  # type: ignore[arg-type]

    @property
    def features_masks(self) -> list[np.ndarray | None] | None:
        """One mask (or None) per features array, or None when no features array is masked."""
        return list(self._groups[2]) or None

    @property
    def labels_masks(self) -> list[np.ndarray | None] | None:
        """One mask (or None) per labels array, or None when no labels array is masked."""
        return list(self._groups[3]) or None

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name}=None"
            if g in _MASK_GROUPS and not group
            else f"{name}=[{', '.join(map(_describe, group))}]"
            for g, (name, group) in enumerate(zip(self._NAMES, self._groups))
        )
        return f"MultiDataSet(num_examples={self.num_examples()}, {parts})"
