"""Deprecated: the transport's old single module, split by role (issue 21).

Import from :mod:`sparkgrad.transport` (or the role's module: :mod:`.controller`, :mod:`.worker`,
:mod:`.relay`, :mod:`.limits`, :mod:`.frame`) instead; this alias goes in a later release.
"""

from __future__ import annotations

import warnings

from sparkgrad.transport.controller import Controller
from sparkgrad.transport.limits import (
    THRESHOLD_GROWTH_LIMIT,
    RateLimitedLog,
    TrafficCounters,
    ZmqTransportConfiguration,
    endpoint,
)
from sparkgrad.transport.worker import RejoinRequired, WorkerConnection

warnings.warn(
    "sparkgrad.transport.zmq_transport is deprecated: import from sparkgrad.transport "
    "(controller, worker, relay and limits are its modules now)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "THRESHOLD_GROWTH_LIMIT",
    "Controller",
    "RateLimitedLog",
    "RejoinRequired",
    "TrafficCounters",
    "WorkerConnection",
    "ZmqTransportConfiguration",
    "endpoint",
]
