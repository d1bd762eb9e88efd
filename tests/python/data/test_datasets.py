"""sparkgrad.datasets.load_digits: shapes, scaling, one-hot labels, stratified seeded split."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sparkgrad.datasets import load_digits
from sparkgrad.errors import EnvironmentNotReadyError


def test_load_digits_flat() -> None:
    train, test = load_digits()
    assert train.num_examples() + test.num_examples() == 1797
    assert test.num_examples() == pytest.approx(0.2 * 1797, abs=10)
    assert train.features.shape[1:] == (64,) and train.labels.shape[1:] == (10,)
    for ds in (train, test):
        assert ds.features.dtype == np.float32 and ds.labels.dtype == np.float32
        assert ds.features.min() == 0.0 and ds.features.max() == 1.0
        np.testing.assert_array_equal(ds.labels.sum(axis=1), 1.0)
    # stratified: every class is split in (about) the requested proportion
    test_share = test.labels.sum(axis=0) / (train.labels.sum(axis=0) + test.labels.sum(axis=0))
    np.testing.assert_allclose(test_share, 0.2, atol=0.01)
    # train + test is exactly scikit-learn's data set: every (image, label) pair once
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    expected = np.column_stack([digits.data / 16.0, digits.target]).astype(np.float32)
    got = np.concatenate([np.column_stack([ds.features, ds.labels.argmax(axis=1)]) for ds in (train, test)])
    np.testing.assert_array_equal(_sorted_rows(got), _sorted_rows(expected))


def _sorted_rows(a: np.ndarray) -> np.ndarray:
    return a[np.lexsort(a.T[::-1])]


def test_load_digits_is_reproducible_and_seed_dependent() -> None:
    a_train, a_test = load_digits(seed=3)
    b_train, b_test = load_digits(seed=3)
    c_train, _ = load_digits(seed=4)
    assert a_train == b_train and a_test == b_test
    assert a_train != c_train


def test_load_digits_image_float64() -> None:
    train, test = load_digits(test_fraction=0.5, shape="image", dtype="float64")
    assert train.features.shape[1:] == (1, 8, 8) and train.features.dtype == np.float64
    assert abs(train.num_examples() - test.num_examples()) <= 10
    flat_train, _ = load_digits(test_fraction=0.5, dtype=np.float64)
    np.testing.assert_array_equal(train.features.reshape(-1, 64), flat_train.features)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1}, "test_fraction"),
        ({"test_fraction": "0.2"}, "test_fraction"),
        ({"seed": -1}, "seed"),
        ({"shape": "nchw"}, "shape"),
        ({"dtype": "int32"}, "dtype"),
    ],
)
def test_load_digits_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}"):
        load_digits(**kwargs)


def test_load_digits_without_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(EnvironmentNotReadyError, match=r'pip install "sparkgrad\[demo\]"'):
        load_digits()
