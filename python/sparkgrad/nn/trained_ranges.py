"""The trained part of a flat parameter vector: every layer's range but the frozen layers'
(:class:`~sparkgrad.nn.layers.FrozenLayer`).

Parameter averaging sends and averages only these entries (issue 39): a frozen layer's parameters are
the same on every worker, so they stay where they are. :meth:`TrainedRanges.gather` packs the trained
entries into one compact vector, :meth:`TrainedRanges.put_back` writes a compact vector back. With
nothing frozen both hand the vector through without a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TrainedRanges:
    """The trained ``[start, stop)`` ranges of a flat parameter vector of ``num_params`` entries.

    Args:
        ranges: the ranges, ascending and disjoint; adjacent ones are merged, empty ones dropped.
        num_params: the length of the full vector.
    """

    ranges: tuple[tuple[int, int], ...]
    num_params: int

    def __post_init__(self) -> None:
        merged: list[tuple[int, int]] = []
        at = 0
        for start, stop in self.ranges:
            if not (at <= start <= stop <= self.num_params):
                raise ValueError(
                    f"ranges: expected ascending disjoint ranges within [0, {self.num_params}), got "
                    f"{self.ranges!r}"
                )
            if start == stop:
                continue
            if merged and merged[-1][1] == start:
                merged[-1] = (merged[-1][0], stop)
            else:
                merged.append((start, stop))
            at = stop
        object.__setattr__(self, "ranges", tuple(merged))

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]], num_params: int) -> TrainedRanges:
        """The trained ranges ``ranges`` of a vector of ``num_params`` entries."""
        return cls(tuple((int(a), int(b)) for a, b in ranges), int(num_params))

    @property
    def size(self) -> int:
        """The entries of a compact vector."""
        return sum(stop - start for start, stop in self.ranges)

    @property
    def all(self) -> bool:
        """Whether every entry is trained (nothing frozen): gather and put_back copy nothing."""
        return self.size == self.num_params

    def gather(self, vec: np.ndarray) -> np.ndarray:
        """The trained entries of ``vec`` (length ``num_params``) in order: ``vec`` itself when nothing
        is frozen, else a new compact vector of ``size`` entries."""
        self._check("vec", vec, self.num_params)
        if self.all:
            return vec
        return np.concatenate([vec[start:stop] for start, stop in self.ranges] or [vec[:0]])

    def put_back(self, compact: np.ndarray, base: np.ndarray) -> np.ndarray:
        """The full vector of ``compact``'s trained entries and ``base``'s frozen ones: ``compact`` itself
        when nothing is frozen (``base`` untouched), else ``base`` with its trained ranges overwritten in
        place (its frozen entries stay bit-identical)."""
        self._check("compact", compact, self.size)
        self._check("base", base, self.num_params)
        if self.all:
            return compact
        at = 0
        for start, stop in self.ranges:
            base[start:stop] = compact[at : at + stop - start]
            at += stop - start
        return base

    @staticmethod
    def _check(name: str, vec: np.ndarray, length: int) -> None:
        if vec.ndim != 1 or vec.shape[0] != length:
            raise ValueError(f"{name}: expected a flat vector of length {length}, got shape {vec.shape}")


__all__ = ["TrainedRanges"]
