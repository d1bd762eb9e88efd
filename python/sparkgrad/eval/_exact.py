"""Exact, order-independent sums of float64 arrays as Python integers.

Regression statistics are sums; summing partial sums in floating point depends on how Spark splits and
groups the data. Instead every float64 x is split exactly into x = m * 2**(e - 53) with an integer
|m| < 2**53; the integers are added per exponent (NumPy ``bincount`` on 26-bit halves, exact while a
chunk has fewer than 2**25 rows) and combined as one Python integer scaled by ``2**SCALE_BITS``. Such
sums add exactly, so merged partial evaluations equal a single pass bit for bit. Products are made
exact with Dekker's two-product, so Sum(y*y) and Sum(y*p) carry no rounding either.
"""

from __future__ import annotations

import numpy as np

SCALE_BITS = 1126  # 1074 (smallest subnormal exponent) + 53 (mantissa bits): every float64 is an integer
_BINS = 2098  # frexp exponents -1073..1024
_HALF = 26
_CHUNK = 1 << 25
_SPLITTER = 134217729.0  # 2**27 + 1


def column_sums(values: np.ndarray) -> list[int]:
    """Exact column sums of a finite 2-D float64 array, each scaled by ``2**SCALE_BITS``.

    Args:
        values: (rows, cols) float64, finite.

    Returns:
        ``cols`` Python integers.
    """
    rows, cols = values.shape
    totals = [0] * cols
    offsets = (np.arange(cols, dtype=np.int64) * _BINS)[None, :]
    for start in range(0, rows, _CHUNK):
        mant, expo = np.frexp(values[start : start + _CHUNK])
        m = (mant * 2.0**53).astype(np.int64)
        bins = (expo.astype(np.int64) + 1073 + offsets).reshape(-1)
        hi = np.bincount(bins, weights=(m >> _HALF).reshape(-1), minlength=cols * _BINS).reshape(cols, _BINS)
        lo = np.bincount(bins, weights=(m & ((1 << _HALF) - 1)).reshape(-1), minlength=cols * _BINS)
        lo = lo.reshape(cols, _BINS)
        for c, b in zip(*np.nonzero((hi != 0) | (lo != 0))):
            totals[c] += ((int(hi[c, b]) << _HALF) + int(lo[c, b])) << int(b)
    return totals


def two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, e) with p = fl(a*b) and p + e == a*b exactly (barring overflow/underflow)."""
    p = a * b
    ca, cb = _SPLITTER * a, _SPLITTER * b
    ah, bh = ca - (ca - a), cb - (cb - b)
    al, bl = a - ah, b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def to_float(num: int, den: int) -> float:
    """num / den correctly rounded (Python's int true division); NaN for 0/0, +-inf for x/0."""
    if den == 0:
        return float("nan") if num == 0 else float("inf") if num > 0 else float("-inf")
    return num / den
