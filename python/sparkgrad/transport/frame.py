"""The gradient-sharing wire format: one frame = a fixed 84-byte header + a payload, authenticated.

Header layout (little-endian, ``struct`` format ``<4sBBHQIIIIqI32sII``, 84 bytes):

====== ======= ====================================================================================
offset size    field
====== ======= ====================================================================================
0      4       magic ``b"SGRD"``
4      1       version (currently 5; a receiver rejects any other version)
5      1       message type (:class:`MessageType`)
6      2       flags (:class:`Flag` bits: payload dtype, authenticated, relayed, signed, packed)
8      8       job id (unsigned; random per fit, frames of another job are rejected)
16     4       sender id (worker id; 0 = controller)
20     4       relay id (MESH: the node that forwarded the frame; ``NO_RELAY`` when sent directly)
24     4       sequence number (per sender, starts at 0, strictly increasing, never wraps)
28     4       epoch
32     8       iteration (signed)
40     4       payload length in bytes
44     32      authentication tag: HMAC-SHA256 (see below)
76     4       broadcast number (see below)
80     4       recipient id (worker id; 0 = the controller): the one receiver this frame is for
====== ======= ====================================================================================

Version 3 (issue 21) added the recipient field and the PLAIN link numbers; version 4 the controller's
Ed25519 signature (below); version 5 the packed UPDATE payload; version 6 the controller's signature on
the UPDATEs it relays in MESH (:func:`endorsed_frame`). A peer of another version is refused as
``malformed`` before anything else is read.

Controller signature (version 4, :mod:`.signing`): a frame with the ``SIGNED`` flag ends with a 64-byte
Ed25519 signature, counted in the header's payload length, over :func:`signed_message` (the header with
the tag zeroed, then SHA-256 of the payload before the signature); the HMAC tag covers it too. The
controller signs every frame it sends as sender 0 and a worker drops a sender-0 frame whose signature
is missing or wrong (``bad_signature``), so the HMAC secret every executor holds no longer lets one
speak for the controller. :func:`decode_frame` strips the signature: the header's ``payload_length``
and the payload it returns are the payload's own. In MESH the controller signs the UPDATEs it relays
too (:func:`endorsed_frame`), over :func:`origin_message` (the header with the relay id, recipient and
tag zeroed, then SHA-256 of the payload), which every relay passes on unchanged, so a relay cannot forge
or alter an update for its subtree.

Authentication (version 2). Every fit has a random secret of at least 256 bits (``secrets.token_bytes``
on the driver, or the user's ``VoidConfiguration.secret``). It reaches the executors inside the job's
Spark broadcast and never travels on this wire. Every frame has the ``AUTHENTICATED`` flag set and
carries ``HMAC-SHA256(secret, header-with-the-tag-field-zeroed || payload)`` in the tag field, so the
tag covers every header field (flags, job id, sender, sequence, ...) and every payload byte. A
receiver, the controller and the workers alike:

1. checks the header length, magic, version, message type and payload length (rejecting only:
   nothing of an unauthenticated frame is used), then the tag with :func:`hmac.compare_digest`; a frame
   without the flag or with a wrong tag is dropped;
2. drops a frame whose job id is not its own (a secret may be reused across fits, the job id never);
3. drops a frame whose recipient is not itself (``misdirected``): a frame captured on one link cannot
   be replayed on another (a worker's own UPDATE back to it, one worker's SYNC_ACK or PARAMS to
   another, a MESH_JOIN to another relay);
4. drops a replay: the sequence number of each sender must be strictly greater than that sender's
   last accepted one. A restarted worker gets a fresh random worker id, so it starts a new sequence
   and no frame addressed to its predecessor reaches it.

Only then is the payload parsed. The controller never answers a frame that fails these checks (no
ERROR reply, nothing that reveals the job), so a stranger on the port learns nothing and changes
nothing. The controller relays a worker's UPDATE with the ``RELAYED`` flag set; it holds the secret,
so it re-signs the relayed frame for each recipient (sender id and sequence stay the worker's, which
keeps the replay rule per original sender on the receiving workers). A worker takes control frames
only from the controller (sender 0) on its controller connection, and UPDATEs only when relayed by
the controller or its MESH parent and never its own (PLAIN); the docstrings of :mod:`.controller`,
:mod:`.worker` and :mod:`.relay` list the rules per link.

PLAIN link numbers: the controller numbers the frames it sends each worker (1, 2, ... per worker, in
the broadcast-number field). A worker takes the number of the PARAMS that answers its HELLO and then
requires every later frame from the controller to carry the next number: a frame withheld or dropped
on the way (a gap) makes it re-join and take the controller's parameters, a stale one is dropped.

MESH (:mod:`sparkgrad.transport.mesh`): the controller numbers the updates it relays down the tree
(1, 2, ...) in the broadcast-number field of each relayed UPDATE, and stamps PARAMS, SYNC_ACK and
EPOCH_GO with the number of updates relayed so far (the parameters include, the acknowledgement
covers, exactly those). A relaying worker re-signs the frame with its own id in the relay-id field and
keeps sender, sequence and broadcast number.

Size limits (enforced by ZeroMQ ``MAXMSGSIZE`` on the receiving socket, so an oversized frame is
never buffered, and checked again per message type): an UPDATE payload holds at most
:func:`max_update_bytes` ``(num_params)`` bytes (the larger of the sparse and bitmap encodings of
:mod:`sparkgrad.compress`), a PARAMS payload exactly ``num_params`` floats (or nothing), a control
payload at most :data:`CONTROL_PAYLOAD_LIMIT` bytes.

Payloads by message type:

- ``UPDATE``: with the ``PACKED`` flag, a sparse message in the packed form of
  :func:`sparkgrad.compress.packing.pack_message` (its header words, sign bits, index gaps as varints:
  1-2 bytes an entry where an int32 takes 4), which every sender uses when it is smaller
  (:func:`encode_update_payload`); without it, the raw int32 threshold/bitmap message of
  :mod:`sparkgrad.compress.codec` (little-endian int32, ``payload length / 4`` words). Either way the
  first 16 bytes are the message's 4 header words. Never pickled.
- ``PARAMS``: the raw parameter vector (float32 or float64 per the ``FLOAT64`` flag), little-endian.
- ``UPDATER_STATE``: the raw flat updater-state vector, encoded like ``PARAMS``.
- ``AVERAGE`` and ``AVERAGED`` (ParameterAveragingTrainingMaster's rounds, :func:`averaging_payload`): a
  little-endian uint32 length, that many bytes of a UTF-8 JSON object, zero bytes up to the next multiple
  of 8, then the raw floats (dtype per the ``FLOAT64`` flag): the parameter vector, followed by the flat
  updater state when the fit averages it, or no floats at all. ``AVERAGE`` (worker -> controller) names
  the epoch in the header's epoch field and the round within it in the iteration field, and carries
  ``{"partition": int, "minibatches": int, "score": float}`` and the worker's parameters after the round
  (no floats: its partition had no data in the round). ``AVERAGED`` (controller -> every worker of the
  round) carries ``{"iteration": int, "workers": int, "score": float}`` and the mean (no floats: no worker
  had data, nothing changed).
- ``HELLO``, ``SYNC``, ``SYNC_ACK``, ``BYE``, ``ERROR``, ``PARAMS_REQUEST``, ``EPOCH_END``, ``EPOCH_GO``,
  ``MESH_PARENT``, ``MESH_JOIN``, ``MESH_CHILDREN``: UTF-8 JSON object of control data (possibly empty).
  ``MESH_PARENT`` carries ``{"parent": "tcp://host:port", "id": parent id, "version": tree version}`` or
  ``{"parent": null}`` (the controller itself); ``MESH_CHILDREN`` carries the complete list of children
  the controller assigned the receiving relay and the tree version (a relay registers a MESH_JOIN only
  from those ids, and drops any child not on a newer list); a MESH
  ``HELLO`` carries ``"relay": "host:port"``, the worker's relay socket; a ``PARAMS_REQUEST`` may carry
  ``{"silent_parent": id}``. ``EPOCH_END`` and ``EPOCH_GO`` name their epoch in
  the header's epoch field; ``EPOCH_GO`` carries ``{"stop": bool}``; ``EPOCH_END`` and ``SYNC`` may carry
  ``{"partition": int, "minibatches": int}`` (what the worker trained since its last report, so the
  controller can count minibatches a re-run Spark task trains again).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sparkgrad.compress.packing import pack_message, unpack_message
from sparkgrad.errors import CorruptDataError

MAGIC = b"SGRD"
VERSION = 6
NO_RELAY = 0xFFFFFFFF
CONTROLLER_ID = 0
_HEADER = struct.Struct("<4sBBHQIIIIqI32sII")
HEADER_SIZE = _HEADER.size
"""Bytes of a frame header, authentication tag included (the layout is in the module docstring)."""
AUTH_TAG_SIZE = 32
MIN_SECRET_BYTES = 32
CONTROL_PAYLOAD_LIMIT = 4096
SIGNATURE_SIZE = 64  # Ed25519, at the end of a SIGNED frame's payload
_TAG_OFFSET = 44
_TAG_END = _TAG_OFFSET + AUTH_TAG_SIZE
_ZERO_TAG = bytes(AUTH_TAG_SIZE)
_FLAGS = struct.Struct("<H")
_U32 = struct.Struct("<I")


class MessageType(enum.IntEnum):
    """Frame types; the values are part of the wire format."""

    HELLO = 1  # worker -> controller: join a job (JSON: host, pid)
    PARAMS = 2  # controller -> worker: current parameters (raw floats), iteration in the header
    UPDATE = 3  # worker -> controller -> peers: a raw int32 encoded update
    SYNC = 4  # worker -> controller: "ack when everything I sent before this is applied"
    SYNC_ACK = 5  # controller -> worker
    BYE = 6  # either side: leaving / job over
    ERROR = 7  # controller -> worker: JSON {"error": message, "rejoin": bool}
    PARAMS_REQUEST = 8  # worker -> controller: re-send the current parameters
    EPOCH_END = 9  # worker -> controller: finished the header's epoch (applied after all it sent before)
    EPOCH_GO = 10  # controller -> worker: every worker finished the header's epoch; JSON {"stop": bool}
    UPDATER_STATE = 11  # worker -> controller: its updater state; controller -> joining worker: the latest
    MESH_PARENT = 12  # controller -> worker (MESH): JSON {"parent": endpoint or null = the controller}
    MESH_JOIN = 13  # worker -> its MESH parent's relay socket: register as a child (JSON {})
    MESH_CHILDREN = 14  # controller -> MESH relay: JSON {"children": [ids], "version": int}, all it may take
    AVERAGE = 15  # worker -> controller: its parameters after an averaging round (averaging_payload)
    AVERAGED = 16  # controller -> worker: every worker's AVERAGE of the round arrived: their mean


class Flag(enum.IntFlag):
    """Header flag bits; the values are part of the wire format."""

    NONE = 0
    FLOAT64 = 1  # PARAMS payload is float64 (else float32)
    AUTHENTICATED = 2  # the auth tag holds an HMAC-SHA256 of header (tag zeroed) + payload
    RELAYED = 4  # the frame was forwarded by the controller or a MESH node
    SIGNED = 8  # the payload ends with the controller's Ed25519 signature (:mod:`.signing`)
    PACKED = 16  # UPDATE payload in the packed form of sparkgrad.compress.packing.pack_message
    FINAL = 32  # UPDATER_STATE: the worker's state at its task's end, for the driver's mean over workers


class FrameRejected(CorruptDataError):
    """A received frame failed a check; ``reason`` is a short key for the rejection counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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
    broadcast: int = 0
    recipient: int = CONTROLLER_ID


class FrameKey:
    """The HMAC-SHA256 key of one fit: signs and verifies frames.

    The keyed hash state is built once; every frame hashes on a copy of it, feeding header and payload
    views without concatenating them.

    Args:
        secret: the fit's secret, at least 32 bytes.
    """

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)):
            raise ValueError(f"secret: expected bytes, got {type(secret).__name__}")
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"secret: must hold at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
        self._base = hmac.new(bytes(secret), digestmod=hashlib.sha256)

    def __repr__(self) -> str:
        return "FrameKey(<secret>)"

    def tag(self, frame: memoryview) -> bytes:
        """The tag of a frame (at least a header long) as if its tag field were zero."""
        mac = self._base.copy()
        mac.update(frame[:_TAG_OFFSET])
        mac.update(_ZERO_TAG)
        mac.update(frame[_TAG_END:])
        return mac.digest()

    def seal(self, frame: bytearray) -> bytearray:
        """Write the tag of ``frame`` (whose tag field is zero) into its tag field; returns ``frame``."""
        mac = self._base.copy()
        mac.update(frame)
        frame[_TAG_OFFSET:_TAG_END] = mac.digest()
        return frame

    def verify(self, frame: memoryview) -> bool:
        """Whether the tag field of ``frame`` (at least a header long) is right (constant time)."""
        return hmac.compare_digest(self.tag(frame), frame[_TAG_OFFSET:_TAG_END])


class Signer(Protocol):
    """What signs a ``SIGNED`` frame: :class:`~sparkgrad.transport.signing.ControllerSigner`."""

    def sign(self, message: bytes) -> bytes: ...


def max_update_bytes(num_params: int) -> int:
    """The largest UPDATE payload for a vector of ``num_params``: the larger of the sparse message
    (4 header words + at most one word per element) and the bitmap message (``N // 16 + 5`` words)."""
    return 4 * max(4 + num_params, num_params // 16 + 5)


def encode_frame(
    key: FrameKey,
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
    broadcast: int = 0,
    recipient: int = CONTROLLER_ID,
    signer: Signer | None = None,
) -> bytearray:
    """Serialise and sign one frame (header + payload); the ``AUTHENTICATED`` flag is always set.

    Args:
        key: the fit's frame key.
        message_type: the frame type.
        job_id: 64-bit job id of the fit.
        sender: sender id (0 for the controller).
        sequence: per-sender sequence number in [0, 2**32).
        payload: payload bytes (raw int32 message, raw floats or JSON).
        iteration: training iteration the frame refers to.
        epoch: training epoch.
        flags: header flags (``AUTHENTICATED`` is added).
        relay: forwarding node id (MESH), ``NO_RELAY`` otherwise.
        broadcast: the controller's broadcast number (MESH) or link number (PLAIN).
        recipient: the receiver's id (0: the controller).
        signer: the controller's :class:`~sparkgrad.transport.signing.ControllerSigner`: sets ``SIGNED``
            and appends its signature of :func:`signed_message` to the payload. None: HMAC only.

    Returns:
        The signed frame.
    """
    if not 0 <= sequence < 2**32:
        raise ValueError(f"sequence: must be in [0, 2**32), got {sequence}")
    if not 0 <= broadcast < 2**32:
        raise ValueError(f"broadcast: must be in [0, 2**32), got {broadcast}")
    payload = memoryview(payload).cast("B")
    if signer is not None:
        flags |= Flag.SIGNED
    signature = SIGNATURE_SIZE if signer is not None else 0
    frame = bytearray(HEADER_SIZE + payload.nbytes + signature)
    _HEADER.pack_into(
        frame,
        0,
        MAGIC,
        VERSION,
        int(message_type),
        int(flags | Flag.AUTHENTICATED),
        job_id,
        sender,
        relay,
        sequence,
        epoch,
        iteration,
        payload.nbytes + signature,
        _ZERO_TAG,
        broadcast,
        recipient,
    )
    frame[HEADER_SIZE : HEADER_SIZE + payload.nbytes] = payload
    if signer is not None:
        frame[-SIGNATURE_SIZE:] = signer.sign(signed_message(memoryview(frame)))
    return key.seal(frame)


def endorsed_frame(key: FrameKey, frame: bytes | memoryview, signer: Signer, broadcast: int) -> bytearray:
    """MESH: a worker's accepted UPDATE as the controller relays it, ``RELAYED`` and ``SIGNED``, stamped
    with its ``broadcast`` number and ending with the controller's signature over
    :func:`origin_message`, which no relay changes: a relay can neither forge an update nor replace,
    renumber or alter one undetected (a dropped one shows as a gap). Address each copy with
    :func:`relayed_frame`."""
    view = memoryview(frame).cast("B")
    out = bytearray(len(view) + SIGNATURE_SIZE)
    out[: len(view)] = view
    (flags,) = _FLAGS.unpack_from(out, 6)
    _FLAGS.pack_into(out, 6, flags | Flag.RELAYED | Flag.SIGNED)
    _U32.pack_into(out, 40, len(view) - HEADER_SIZE + SIGNATURE_SIZE)
    _U32.pack_into(out, 76, broadcast)
    out[_TAG_OFFSET:_TAG_END] = _ZERO_TAG
    out[-SIGNATURE_SIZE:] = signer.sign(origin_message(memoryview(out)))
    return key.seal(out)


def origin_message(frame: memoryview) -> bytes:
    """What the controller's signature of a relayed UPDATE (:func:`endorsed_frame`) covers: the header
    with the fields each hop rewrites zeroed (relay id, recipient, tag), so the sender, its sequence,
    the epoch, iteration, flags and broadcast number are covered, then the SHA-256 of the payload."""
    header = bytearray(frame[:HEADER_SIZE])
    _U32.pack_into(header, 20, 0)
    _U32.pack_into(header, 80, 0)
    header[_TAG_OFFSET:_TAG_END] = _ZERO_TAG
    return bytes(header) + hashlib.sha256(frame[HEADER_SIZE:-SIGNATURE_SIZE]).digest()


def signed_message(frame: memoryview) -> bytes:
    """What the controller's Ed25519 signature of a ``SIGNED`` frame covers: the header with the tag field
    zeroed (so every field, the recipient and the numbers included) and the SHA-256 digest of the payload
    before the signature (one pass over a large PARAMS payload, not Ed25519's two)."""
    body = frame[HEADER_SIZE:-SIGNATURE_SIZE]
    return (
        bytes(frame[:_TAG_OFFSET])
        + _ZERO_TAG
        + bytes(frame[_TAG_END:HEADER_SIZE])
        + hashlib.sha256(body).digest()
    )


def relayed_frame(
    key: FrameKey,
    frame: bytes | memoryview,
    *,
    recipient: int,
    relay: int | None = None,
    broadcast: int | None = None,
) -> bytearray:
    """A copy of an accepted frame with the ``RELAYED`` flag set, addressed to ``recipient``, re-signed.

    Args:
        key: the fit's frame key.
        frame: the frame as received (already verified).
        recipient: the worker the copy is for.
        relay: the relaying node's id for the relay-id field (None keeps the field).
        broadcast: the broadcast number to stamp (None keeps the field).

    Returns:
        The signed relayed frame.
    """
    out = bytearray(frame)
    (flags,) = _FLAGS.unpack_from(out, 6)
    _FLAGS.pack_into(out, 6, flags | Flag.RELAYED)
    if relay is not None:
        _U32.pack_into(out, 20, relay)
    if broadcast is not None:
        _U32.pack_into(out, 76, broadcast)
    _U32.pack_into(out, 80, recipient)
    out[_TAG_OFFSET:_TAG_END] = _ZERO_TAG
    return key.seal(out)


def decode_frame(
    frame: bytes | memoryview,
    key: FrameKey,
    peer: str = "peer",
    max_payload: Callable[[MessageType], int] | None = None,
) -> tuple[Header, memoryview]:
    """Authenticate and parse a frame; raises :class:`FrameRejected` naming ``peer`` otherwise.

    Checks, in order: header length, magic, version, message type, payload length (against the frame,
    and against ``max_payload(type)`` when given: reason ``oversized``), whole int32 words of an
    unpacked UPDATE and the PACKED flag only on an UPDATE, all before the tag: they only reject, so an
    unauthenticated frame costs no HMAC unless it is well-formed. Then the ``AUTHENTICATED`` flag and the
    tag (constant time). Job id, recipient and replay are the receiver's checks.

    Args:
        frame: the received bytes.
        key: the fit's frame key.
        peer: a name for the sender used in error messages.
        max_payload: the largest payload the receiver takes of each message type.

    Returns:
        (header, payload view).
    """
    view = memoryview(frame).cast("B")
    if view.nbytes < HEADER_SIZE:
        raise FrameRejected(
            "malformed",
            f"frame from {peer}: {view.nbytes} bytes is shorter than the {HEADER_SIZE}-byte header",
        )
    magic, version, mtype, flags, job, sender, relay, seq, epoch, it, length, _tag, broadcast, recipient = (
        _HEADER.unpack_from(view)
    )
    if magic != MAGIC:
        raise FrameRejected("malformed", f"frame from {peer}: bad magic {magic!r} (not a sparkgrad frame)")
    if version != VERSION:
        raise FrameRejected(
            "malformed", f"frame from {peer}: unsupported wire version {version} (expected {VERSION})"
        )
    try:
        mtype = MessageType(mtype)
    except ValueError:
        raise FrameRejected("malformed", f"frame from {peer}: unknown message type {mtype}") from None
    if length != view.nbytes - HEADER_SIZE:
        raise FrameRejected(
            "malformed",
            f"frame from {peer}: header says {length} payload bytes, "
            f"frame carries {view.nbytes - HEADER_SIZE}",
        )
    signed = flags & Flag.SIGNED
    if signed and length < SIGNATURE_SIZE:
        raise FrameRejected("malformed", f"frame from {peer}: SIGNED with {length} payload bytes")
    if signed:
        length -= SIGNATURE_SIZE  # the signature is the receiver's to check (sender 0), not payload
    if max_payload is not None and length > (limit := max_payload(mtype)):
        raise FrameRejected(
            "oversized", f"frame from {peer}: {mtype.name} payload of {length} bytes exceeds {limit}"
        )
    if flags & Flag.PACKED and mtype != MessageType.UPDATE:
        raise FrameRejected("malformed", f"frame from {peer}: {mtype.name} with the PACKED flag")
    if flags & Flag.FINAL and mtype != MessageType.UPDATER_STATE:
        raise FrameRejected("malformed", f"frame from {peer}: {mtype.name} with the FINAL flag")
    if mtype == MessageType.UPDATE and not flags & Flag.PACKED and length % 4:
        raise FrameRejected(
            "malformed", f"frame from {peer}: UPDATE payload of {length} bytes is not whole int32 words"
        )
    if not flags & Flag.AUTHENTICATED or not key.verify(view):
        raise FrameRejected("unauthenticated", f"frame from {peer}: missing or wrong authentication tag")
    header = Header(mtype, Flag(flags), job, sender, seq, epoch, it, length, relay, broadcast, recipient)
    return header, view[HEADER_SIZE : HEADER_SIZE + length]


def update_header(payload: memoryview) -> np.ndarray:
    """The 4 int32 header words of an UPDATE payload of at least 16 bytes, packed or not (copy-free)."""
    return np.frombuffer(payload[:16], dtype="<i4")


def encode_update_payload(message: np.ndarray) -> tuple[bytes | memoryview, Flag]:
    """The payload and flags of an UPDATE frame carrying the int32 ``message``: packed (``PACKED``) when
    that is smaller, else the raw little-endian words; :func:`update_payload` reads it back."""
    message = np.ascontiguousarray(message, dtype="<i4")
    packed = pack_message(message)
    if packed is None:
        return message.data, Flag.NONE
    return packed, Flag.PACKED


def update_payload(header: Header, payload: memoryview, peer: str) -> np.ndarray:
    """The int32 message of an UPDATE payload: the raw one viewed (copy-free, read-only), a ``PACKED`` one
    unpacked; a packed payload that does not unpack raises FrameRejected("malformed") naming ``peer``."""
    if not header.flags & Flag.PACKED:
        return np.frombuffer(payload, dtype="<i4")
    try:
        return unpack_message(payload)
    except ValueError as exc:
        raise FrameRejected("malformed", f"UPDATE from {peer}: {exc}") from None


def params_payload(header: Header, payload: memoryview) -> np.ndarray:
    """View a PARAMS payload as a float vector of the dtype the flags name."""
    dtype = "<f8" if header.flags & Flag.FLOAT64 else "<f4"
    if header.payload_length % np.dtype(dtype).itemsize:
        raise CorruptDataError("PARAMS payload length is not a whole number of floats")
    return np.frombuffer(payload, dtype=dtype)


def json_payload(obj: Any) -> bytes:
    """Encode a control payload."""
    return json.dumps(obj, separators=(",", ":")).encode("utf-8")


CONTROL_INT_LIMIT = 2**63


class _BadNumber(Exception):
    """A number in a control payload outside what any field may hold."""


def _control_int(text: str) -> int:
    # bounded before int(): a 400-digit integer would overflow float() wherever it is used
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) >= CONTROL_INT_LIMIT:
        raise _BadNumber(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is not in (-2**63, 2**63)")
    return value


def _control_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _BadNumber(f"number {text[:24]}{'...' if len(text) > 24 else ''} is not a finite float")
    return value


def _no_constant(text: str) -> float:
    raise _BadNumber(f"{text} is not a number JSON allows")


def parse_json_payload(payload: memoryview, peer: str = "peer") -> dict[str, Any]:
    """Decode a control payload: a JSON object of at most ``CONTROL_PAYLOAD_LIMIT`` bytes; empty is ``{}``.

    Raises :class:`FrameRejected` (reason ``"control"``) for anything else: too long, not UTF-8, not
    JSON, nested too deeply, not an object, or holding a number no field may hold (an integer outside
    (-2**63, 2**63), a float that overflows, ``NaN``/``Infinity``): numbers are checked while parsing,
    before any handler converts them.
    """
    if not payload.nbytes:
        return {}
    if payload.nbytes > CONTROL_PAYLOAD_LIMIT:
        raise FrameRejected(
            "control",
            f"control payload from {peer}: {payload.nbytes} bytes exceeds {CONTROL_PAYLOAD_LIMIT}",
        )
    try:
        value = json.loads(
            bytes(payload).decode("utf-8"),
            parse_int=_control_int,
            parse_float=_control_float,
            parse_constant=_no_constant,
        )
    except _BadNumber as exc:
        raise FrameRejected("control", f"control payload from {peer}: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FrameRejected("control", f"control payload from {peer} is not UTF-8 JSON ({exc})") from None
    if not isinstance(value, dict):
        raise FrameRejected(
            "control", f"control payload from {peer}: expected a JSON object, got {type(value).__name__}"
        )
    return value


_AVERAGING_LENGTH = struct.Struct("<I")


def max_averaging_bytes(num_values: int) -> int:
    """The largest AVERAGE or AVERAGED payload carrying ``num_values`` floats (parameters and updater
    state) in float64."""
    return _AVERAGING_LENGTH.size + CONTROL_PAYLOAD_LIMIT + 8 + 8 * num_values


def averaging_payload(body: dict[str, Any], values: np.ndarray | None) -> bytes:
    """An AVERAGE or AVERAGED payload: the JSON ``body`` and the raw little-endian ``values`` (or none).

    The frame's ``FLOAT64`` flag must name the values' dtype (:func:`float_flag`).
    """
    text = json_payload(body)
    if len(text) > CONTROL_PAYLOAD_LIMIT:
        raise ValueError(f"averaging body: {len(text)} bytes of JSON exceed {CONTROL_PAYLOAD_LIMIT}")
    head = _AVERAGING_LENGTH.pack(len(text)) + text
    head += bytes(-len(head) % 8)
    if values is None:
        return head
    return head + np.ascontiguousarray(values, dtype=values.dtype.newbyteorder("<")).tobytes()


def parse_averaging_payload(
    header: Header, payload: memoryview, peer: str = "peer"
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Split an authenticated AVERAGE or AVERAGED payload into its JSON body and its floats (a read-only
    view, None when it carries none). Raises :class:`FrameRejected` (``malformed`` or ``control``)."""
    size = _AVERAGING_LENGTH.size
    if payload.nbytes < size:
        raise FrameRejected("malformed", f"{header.message_type.name} from {peer}: {payload.nbytes} bytes")
    (length,) = _AVERAGING_LENGTH.unpack_from(payload)
    start = size + length + (-(size + length) % 8)
    if length > CONTROL_PAYLOAD_LIMIT or start > payload.nbytes:
        raise FrameRejected(
            "malformed", f"{header.message_type.name} from {peer}: JSON length {length} does not fit"
        )
    body = parse_json_payload(payload[size : size + length], peer=peer)
    if start == payload.nbytes:
        return body, None
    dtype = np.dtype("<f8" if header.flags & Flag.FLOAT64 else "<f4")
    if (payload.nbytes - start) % dtype.itemsize:
        raise FrameRejected(
            "malformed", f"{header.message_type.name} from {peer}: floats are not whole {dtype} values"
        )
    return body, np.frombuffer(payload[start:], dtype=dtype)


def float_flag(array: np.ndarray) -> Flag:
    """The dtype flag of a PARAMS or UPDATER_STATE payload."""
    return Flag.FLOAT64 if array.dtype == np.float64 else Flag.NONE


class Replay:
    """Per-sender strictly increasing sequence numbers."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}

    def check(self, header: Header, peer: str) -> None:
        """Raise FrameRejected("replay") unless the sequence number is new for its sender."""
        last = self._last.get(header.sender, -1)
        if header.sequence <= last:
            raise FrameRejected(
                "replay", f"frame from {peer}: sequence {header.sequence} replayed (last was {last})"
            )

    def commit(self, header: Header) -> None:
        """Record an accepted frame's sequence number."""
        self._last[header.sender] = header.sequence


__all__ = [
    "CONTROLLER_ID",
    "CONTROL_INT_LIMIT",
    "CONTROL_PAYLOAD_LIMIT",
    "HEADER_SIZE",
    "MAGIC",
    "MIN_SECRET_BYTES",
    "SIGNATURE_SIZE",
    "NO_RELAY",
    "VERSION",
    "Flag",
    "FrameKey",
    "FrameRejected",
    "Header",
    "MessageType",
    "Replay",
    "averaging_payload",
    "decode_frame",
    "encode_frame",
    "encode_update_payload",
    "endorsed_frame",
    "float_flag",
    "json_payload",
    "max_averaging_bytes",
    "max_update_bytes",
    "origin_message",
    "params_payload",
    "parse_averaging_payload",
    "parse_json_payload",
    "relayed_frame",
    "signed_message",
    "update_payload",
]
