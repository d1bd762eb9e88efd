"""Gradient-sharing transport: the versioned, authenticated wire format and the ZeroMQ endpoints.

Modules by role: :mod:`.frame` (the wire format and what every receiver checks), :mod:`.controller`
(the driver's socket loop) and :mod:`.policies` (gradient sharing or parameter averaging, behind it),
:mod:`.worker`, :mod:`.relay` (a MESH node toward its children), :mod:`.mesh` (the relay tree) and
:mod:`.limits` (resource limits, counters and the update bounds).
"""

from __future__ import annotations

from sparkgrad.transport.controller import Controller
from sparkgrad.transport.frame import (
    HEADER_SIZE,
    Flag,
    FrameKey,
    FrameRejected,
    Header,
    MessageType,
    decode_frame,
    encode_frame,
    max_update_bytes,
)
from sparkgrad.transport.limits import (
    THRESHOLD_GROWTH_LIMIT,
    TrafficCounters,
    ZmqTransportConfiguration,
    endpoint,
)
from sparkgrad.transport.mesh import MeshOrganizer
from sparkgrad.transport.worker import RejoinRequired, WorkerConnection

__all__ = [
    "HEADER_SIZE",
    "THRESHOLD_GROWTH_LIMIT",
    "Controller",
    "Flag",
    "FrameKey",
    "FrameRejected",
    "Header",
    "MeshOrganizer",
    "MessageType",
    "RejoinRequired",
    "TrafficCounters",
    "WorkerConnection",
    "ZmqTransportConfiguration",
    "decode_frame",
    "encode_frame",
    "endpoint",
    "max_update_bytes",
]
