"""Gradient-sharing transport: the versioned, authenticated wire format and the ZeroMQ endpoints."""

from __future__ import annotations

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
from sparkgrad.transport.mesh import MeshOrganizer
from sparkgrad.transport.zmq_transport import (
    THRESHOLD_GROWTH_LIMIT,
    Controller,
    RejoinRequired,
    TrafficCounters,
    WorkerConnection,
    ZmqTransportConfiguration,
    endpoint,
)

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
