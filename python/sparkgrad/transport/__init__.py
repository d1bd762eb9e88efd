"""Gradient-sharing transport: the versioned wire format and the ZeroMQ controller/worker endpoints."""

from __future__ import annotations

from sparkgrad.transport.frame import (
    HEADER_SIZE,
    Flag,
    Header,
    MessageType,
    decode_frame,
    encode_frame,
)
from sparkgrad.transport.zmq_transport import (
    Controller,
    TrafficCounters,
    WorkerConnection,
    ZmqTransportConfiguration,
    endpoint,
)

__all__ = [
    "HEADER_SIZE",
    "Controller",
    "Flag",
    "Header",
    "MessageType",
    "TrafficCounters",
    "WorkerConnection",
    "ZmqTransportConfiguration",
    "decode_frame",
    "encode_frame",
    "endpoint",
]
