"""The gradient-sharing wire format: one frame = a fixed 80-byte header + a payload.

Header layout (little-endian, ``struct`` format ``<4sBBHQIIIIqI32sI``, 80 bytes):

====== ======= ====================================================================================
offset size    field
====== ======= ====================================================================================
0      4       magic ``b"SGRD"``
4      1       version (currently 1; a receiver rejects any other version)
5      1       message type (:class:`MessageType`)
6      2       flags (:class:`Flag` bits: payload dtype, authenticated, relayed)
8      8       job id (unsigned; random per fit, frames of another job are rejected)
16     4       sender id (worker id; 0 = controller)
20     4       relay id (MESH: the node that forwarded the frame; ``NO_RELAY`` when sent directly)
24     4       sequence number (per sender, starts at 0)
28     4       epoch
32     8       iteration (signed)
40     4       payload length in bytes
44     32      authentication tag (reserved: zero unless the ``AUTHENTICATED`` flag is set)
76     4       reserved (zero)
====== ======= ====================================================================================

Payloads by message type:

- ``UPDATE``: the raw int32 threshold/bitmap message of :mod:`sparkgrad.compress` (little-endian int32,
  ``payload length / 4`` words). Never pickled.
- ``PARAMS``: the raw parameter vector (float32 or float64 per the ``FLOAT64`` flag), little-endian.
- ``HELLO``, ``SYNC``, ``SYNC_ACK``, ``BYE``, ``ERROR``, ``PARAMS_REQUEST``: UTF-8 JSON control data
  (possibly empty).
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparkgrad.errors import CorruptDataError

MAGIC = b"SGRD"
VERSION = 1
NO_RELAY = 0xFFFFFFFF
CONTROLLER_ID = 0
_HEADER = struct.Struct("<4sBBHQIIIIqI32sI")
HEADER_SIZE = _HEADER.size
AUTH_TAG_SIZE = 32


class MessageType(enum.IntEnum):
    """Frame types; the values are part of the wire format."""

    HELLO = 1  # worker -> controller: join a job (JSON: host, pid)
    PARAMS = 2  # controller -> worker: current parameters (raw floats), iteration in the header
    UPDATE = 3  # worker -> controller -> peers: a raw int32 encoded update
    SYNC = 4  # worker -> controller: "ack when everything I sent before this is applied"
    SYNC_ACK = 5  # controller -> worker
    BYE = 6  # either side: leaving / job over
    ERROR = 7  # controller -> worker: JSON {"error": message}
    PARAMS_REQUEST = 8  # worker -> controller: re-send the current parameters


class Flag(enum.IntFlag):
    """Header flag bits; the values are part of the wire format."""

    NONE = 0
    FLOAT64 = 1  # PARAMS payload is float64 (else float32)
    AUTHENTICATED = 2  # reserved: the auth tag holds an HMAC of header + payload
    RELAYED = 4  # the frame was forwarded by the controller or a MESH node


@dataclass(frozen=True)
class Header:
    """A decoded frame header."""

    message_type: MessageType
    flags: Flag
    job_id: int
    sender: int
    sequence: int
    epoch: int
    iteration: int
    payload_length: int
    relay: int = NO_RELAY


def encode_frame(
    message_type: MessageType,
    job_id: int,
    sender: int,
    sequence: int,
    payload: bytes | memoryview = b"",
    *,
    iteration: int = 0,
    epoch: int = 0,
    flags: Flag = Flag.NONE,
    relay: int = NO_RELAY,
) -> bytes:
    """Serialise one frame (header + payload).

    Args:
        message_type: the frame type.
        job_id: 64-bit job id of the fit.
        sender: sender id (0 for the controller).
        sequence: per-sender sequence number (wraps at 2**32).
        payload: payload bytes (raw int32 message, raw floats or JSON).
        iteration: training iteration the frame refers to.
        epoch: training epoch.
        flags: header flags.
        relay: forwarding node id (MESH), ``NO_RELAY`` otherwise.

    Returns:
        The frame as bytes.
    """
    payload = memoryview(payload).cast("B")
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        int(message_type),
        int(flags),
        job_id,
        sender,
        relay,
        sequence & 0xFFFFFFFF,
        epoch,
        iteration,
        payload.nbytes,
        bytes(AUTH_TAG_SIZE),
        0,
    )
    return header + payload.tobytes()


def decode_frame(frame: bytes | memoryview, peer: str = "peer") -> tuple[Header, memoryview]:
    """Parse a frame; raises CorruptDataError naming ``peer`` for anything malformed.

    Args:
        frame: the received bytes.
        peer: a name for the sender used in error messages.

    Returns:
        (header, payload view).
    """
    view = memoryview(frame).cast("B")
    if view.nbytes < HEADER_SIZE:
        raise CorruptDataError(
            f"frame from {peer}: {view.nbytes} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    magic, version, mtype, flags, job, sender, relay, seq, epoch, it, length, _tag, _res = (
        _HEADER.unpack_from(view)
    )
    if magic != MAGIC:
        raise CorruptDataError(f"frame from {peer}: bad magic {magic!r} (not a sparkgrad frame)")
    if version != VERSION:
        raise CorruptDataError(f"frame from {peer}: unsupported wire version {version} (expected {VERSION})")
    try:
        mtype = MessageType(mtype)
    except ValueError:
        raise CorruptDataError(f"frame from {peer}: unknown message type {mtype}") from None
    if length != view.nbytes - HEADER_SIZE:
        raise CorruptDataError(
            f"frame from {peer}: header says {length} payload bytes, "
            f"frame carries {view.nbytes - HEADER_SIZE}"
        )
    if mtype == MessageType.UPDATE and length % 4:
        raise CorruptDataError(
            f"frame from {peer}: UPDATE payload of {length} bytes is not whole int32 words"
        )
    header = Header(mtype, Flag(flags), job, sender, seq, epoch, it, length, relay)
    return header, view[HEADER_SIZE:]


def update_payload(payload: memoryview) -> np.ndarray:
    """View an UPDATE payload as the int32 message (copy-free, read-only)."""
    return np.frombuffer(payload, dtype="<i4")


def params_payload(header: Header, payload: memoryview) -> np.ndarray:
    """View a PARAMS payload as a float vector of the dtype the flags name."""
    dtype = "<f8" if header.flags & Flag.FLOAT64 else "<f4"
    if header.payload_length % np.dtype(dtype).itemsize:
        raise CorruptDataError("PARAMS payload length is not a whole number of floats")
    return np.frombuffer(payload, dtype=dtype)


def json_payload(obj: Any) -> bytes:
    """Encode a control payload."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def parse_json_payload(payload: memoryview, peer: str = "peer") -> Any:
    """Decode a control payload; empty means ``{}``."""
    if not payload.nbytes:
        return {}
    try:
        return json.loads(bytes(payload).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptDataError(f"control payload from {peer} is not UTF-8 JSON ({exc})") from exc


__all__ = [
    "CONTROLLER_ID",
    "HEADER_SIZE",
    "MAGIC",
    "NO_RELAY",
    "VERSION",
    "Flag",
    "Header",
    "MessageType",
    "decode_frame",
    "encode_frame",
    "json_payload",
    "params_payload",
    "parse_json_payload",
    "update_payload",
]
