"""Exceptions for failures of the environment or runtime (caller mistakes raise ValueError/TypeError)."""

from __future__ import annotations


class SparkgradError(Exception):
    """Base class of every sparkgrad runtime failure."""


class EnvironmentNotReadyError(SparkgradError):
    """A system prerequisite (Java, Spark, a native build feature) is missing."""


class CorruptDataError(SparkgradError):
    """A file or message is truncated, foreign or damaged; names the file or peer."""


class TransportError(SparkgradError):
    """The gradient-sharing transport failed: unreachable controller, port in use, lost peer."""


class TrainingError(SparkgradError):
    """Distributed training could not complete (worker failure, empty data, timeouts)."""
