"""The packed wire form of a sparse message: what an ``UPDATE`` frame with the ``PACKED`` flag carries
(:mod:`sparkgrad.transport.frame` packs what it sends and unpacks what it receives). A module of its own,
outside the transport, which needs pyzmq (the ``spark`` extra): ParallelWrapper counts with it the bytes a
message would take on the wire.
"""

from __future__ import annotations

import numpy as np

from sparkgrad._native import _core


def pack_message(message: np.ndarray) -> bytes | None:
    """The packed wire form of a sparse host message, as an ``UPDATE`` frame carries it, or None when the
    message does not pack (a bitmap, entries not strictly ascending) or packing would not make it smaller.

    The form: the 4 header words (little-endian int32), one sign bit per entry (bit ``k % 8`` of byte
    ``k // 8``, set for a negative entry), then per entry the gap to the previous index minus one (for the
    first, its index) as an unsigned LEB128 varint. A gap at the densities of gradient sharing takes one
    or two bytes against an int32 entry's four. The encoders of :mod:`sparkgrad.compress.codec` write
    ascending entries.

    Args:
        message: 1-D int32 numpy message.

    Returns:
        The packed bytes, or None (send the message as it is).
    """
    return _core.pack_message(message)


def unpack_message(packed: bytes | memoryview) -> np.ndarray:
    """The int32 sparse message of a packed one (:func:`pack_message`), every byte checked.

    Args:
        packed: the packed bytes (from the network: any content).

    Returns:
        A new int32 message; :func:`decode` still validates it against its target.

    Raises:
        ValueError: naming what is wrong (header, sign bits, a varint over 5 bytes or overlong, an index
            at or beyond the length in word 1, bytes missing or left over).
    """
    return _core.unpack_message(packed)


__all__ = ["pack_message", "unpack_message"]
