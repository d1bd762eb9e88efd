"""Pure-NumPy reference of the threshold-encoding codecs (dl4j-reference.md section 1 with the sparkgrad
decisions): sparse encode/decode, bitmap encode/decode and the handler's format choice.

Every function returns new arrays and leaves its inputs alone. Thresholds travel as float32 and are
used as float32 cast to the residual dtype, as the native code does.
"""

from __future__ import annotations

import numpy as np

HEADER = 4


def wire_threshold(threshold: float, dtype: np.dtype) -> np.floating:
    """The threshold as stored in a message (float32), cast to the residual dtype."""
    return np.dtype(dtype).type(np.float32(threshold))


def threshold_bits(threshold: float) -> int:
    return int(np.array([threshold], dtype=np.float32).view(np.int32)[0])


def threshold_encode(
    residual: np.ndarray, threshold: float, boundary: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(message, residual after encoding): every |r| >= t up to `boundary` lowest indices, ascending."""
    r = residual.copy()
    t = wire_threshold(threshold, r.dtype)
    idx = np.flatnonzero(np.abs(r) >= t)
    if boundary is not None:
        idx = idx[:boundary]
    positive = r[idx] > 0
    entries = np.where(positive, idx + 1, -(idx + 1)).astype(np.int32)
    r[idx] = np.where(positive, r[idx] - t, r[idx] + t)
    header = np.array([len(idx), len(r), threshold_bits(threshold), 0], dtype=np.int32)
    return np.concatenate([header, entries]), r


def bitmap_encode(residual: np.ndarray, threshold: float) -> tuple[np.ndarray, int, np.ndarray]:
    """(message, encoded count, residual after encoding) with DL4J's word layout and -t/2 half code."""
    r = residual.copy()
    n = len(r)
    t = wire_threshold(threshold, r.dtype)
    h = r.dtype.type(t / r.dtype.type(2))
    full = np.abs(r) >= t
    half = ~full & (r <= -h)
    negative = (full & (r < 0)) | half
    r = np.where(full, np.where(r < 0, r + t, r - t), np.where(half, r + h, r)).astype(r.dtype)
    words = n // 16 + 1
    value_bits = np.zeros(words * 16, dtype=np.uint64)
    sign_bits = np.zeros(words * 16, dtype=np.uint64)
    value_bits[:n] = full
    sign_bits[:n] = negative
    shifts = np.arange(16, dtype=np.uint64)
    payload = (value_bits.reshape(words, 16) << shifts).sum(axis=1) + (
        sign_bits.reshape(words, 16) << (shifts + np.uint64(16))
    ).sum(axis=1)
    header = np.array([n, n, threshold_bits(threshold), 1], dtype=np.int32)
    message = np.concatenate([header, payload.astype(np.uint32).view(np.int32)])
    return message, int(np.count_nonzero(full | half)), r


def decode(message: np.ndarray, target: np.ndarray) -> np.ndarray:
    """target + decoded message (either format), for a well-formed message."""
    out = target.copy()
    t = out.dtype.type(np.array([message[2]], dtype=np.int32).view(np.float32)[0])
    n = int(message[1])
    if message[3] == 0:
        entries = message[HEADER:].astype(np.int64)
        np.add.at(out, np.abs(entries) - 1, np.where(entries > 0, t, -t).astype(out.dtype))
        return out
    words = message[HEADER:].view(np.uint32).astype(np.uint64)
    e = np.arange(n)
    value = (words[e // 16] >> (e % 16).astype(np.uint64)) & np.uint64(1)
    negative = (words[e // 16] >> (e % 16 + 16).astype(np.uint64)) & np.uint64(1)
    h = out.dtype.type(t / out.dtype.type(2))
    delta = np.where(value == 1, np.where(negative == 1, -t, t), np.where(negative == 1, -h, 0))
    mask = (value | negative) == 1
    out[mask] += delta[mask].astype(out.dtype)
    return out


def subtract(message: np.ndarray, target: np.ndarray) -> np.ndarray:
    """target - the message decoded into zeros: what a replica's dense path (decode into a zeroed scratch,
    then ``params -= scratch``) leaves, for a well-formed message."""
    return target - decode(message, np.zeros_like(target))


def encode_smaller(residual: np.ndarray, threshold: float) -> tuple[np.ndarray | None, bool, np.ndarray]:
    """The handler's step after the update is added: (message or None, is_bitmap, residual after)."""
    count = int(np.count_nonzero(np.abs(residual) >= wire_threshold(threshold, residual.dtype)))
    n = len(residual)
    if HEADER + count <= n // 16 + 5:
        message, r = threshold_encode(residual, threshold)
        return (message if count else None), False, r
    message, _, r = bitmap_encode(residual, threshold)
    return message, True, r


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def pack_message(message: np.ndarray) -> bytes | None:
    """The packed form of a sparse message (sparkgrad.compress.pack_message): header words, sign bits
    (little bit order), gaps minus one as LEB128 varints; None unless sparse, ascending and smaller."""
    if message.size < 4 or message[3] != 0 or message[0] != message.size - 4 or message[1] < 0:
        return None
    entries = message[4:].astype(np.int64)
    indices = np.abs(entries) - 1
    if np.any(entries == 0) or np.any(indices >= message[1]) or np.any(np.diff(indices) <= 0):
        return None
    gaps = np.diff(indices, prepend=-1) - 1
    body = b"".join(_varint(int(g)) for g in gaps)
    signs = np.packbits(entries < 0, bitorder="little").tobytes()
    packed = message[:4].astype("<i4").tobytes() + signs + body
    return packed if len(packed) < message.nbytes else None


def unpack_message(packed: bytes) -> np.ndarray:
    """Inverse of :func:`pack_message` for a well-formed packed message (no checks)."""
    header = np.frombuffer(packed[:16], dtype="<i4")
    count = int(header[0])
    signs = np.unpackbits(np.frombuffer(packed[16 : 16 + (count + 7) // 8], np.uint8), bitorder="little")
    pos, previous, entries = 16 + (count + 7) // 8, -1, []
    for k in range(count):
        gap, shift = 0, 0
        while True:
            byte = packed[pos]
            pos += 1
            gap |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        previous += 1 + gap
        entries.append(-(previous + 1) if signs[k] else previous + 1)
    return np.array([*header, *entries], dtype=np.int32)
