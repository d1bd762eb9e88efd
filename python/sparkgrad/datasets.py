"""Small bundled datasets for examples, tests and benchmarks."""

from __future__ import annotations

import numpy as np

from sparkgrad._config import check_int
from sparkgrad.data import DataSet
from sparkgrad.errors import EnvironmentNotReadyError

_SHAPES = ("flat", "image")


def load_digits(
    test_fraction: float = 0.2,
    seed: int = 0,
    shape: str = "flat",
    dtype: str | np.dtype | type = "float32",
) -> tuple[DataSet, DataSet]:
    """scikit-learn's bundled 8x8 handwritten digits (1797 examples, 10 classes) as train/test DataSets.

    Features are scaled to [0, 1] (pixel values divided by 16); labels are one-hot with 10 columns.
    The split is stratified by class and reproducible from ``seed``; examples are in random order.

    Args:
        test_fraction: fraction of the examples in the test set, 0 < test_fraction < 1.
        seed: non-negative integer fixing the split and the order.
        shape: "flat" for features (N, 64), "image" for NCHW features (N, 1, 8, 8).
        dtype: floating dtype of features and labels ("float32" or "float64").

    Returns:
        (train, test) DataSets.

    Raises:
        ValueError: an argument is out of range.
        EnvironmentNotReadyError: scikit-learn is not installed.
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise ValueError(f"test_fraction: expected a number, got {test_fraction!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must be in (0, 1), got {test_fraction!r}")
    seed = check_int("seed", seed, minimum=0)
    if shape not in _SHAPES:
        raise ValueError(f"shape: expected one of {_SHAPES}, got {shape!r}")
    np_dtype = np.dtype(dtype)
    if np_dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {np_dtype}")
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as exc:
        raise EnvironmentNotReadyError(
            f'load_digits needs scikit-learn ({exc}); install it with: pip install "sparkgrad[demo]"'
        ) from None

    digits = sklearn_digits()
    features = (digits.data / 16.0).astype(np_dtype)
    if shape == "image":
        features = features.reshape(-1, 1, 8, 8)
    labels = np.eye(10, dtype=np_dtype)[digits.target]
    test_index, train_index = _stratified_split(digits.target, test_fraction, np.random.default_rng(seed))
    return (
        DataSet(features[train_index], labels[train_index]),
        DataSet(features[test_index], labels[test_index]),
    )


def _stratified_split(
    classes: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(test, train) example indices in random order with each class split in the given proportion."""
    test, train = [], []
    for c in np.unique(classes):
        members = rng.permutation(np.flatnonzero(classes == c))
        n_test = int(round(test_fraction * members.size))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return rng.permutation(np.concatenate(test)), rng.permutation(np.concatenate(train))
