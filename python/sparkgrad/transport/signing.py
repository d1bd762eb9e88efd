"""The controller's Ed25519 signature on the frames only it may send (wire version 4).

Every worker holds the fit's HMAC secret (:mod:`.frame`), so a compromised executor can authenticate
any frame, the controller's included. The controller therefore also signs every frame it sends as
itself (sender 0: PARAMS, EPOCH_GO, SYNC_ACK, UPDATER_STATE, MESH_PARENT, MESH_CHILDREN, ERROR, BYE)
with an Ed25519 key it generates per fit (:class:`ControllerSigner`); the workers get the public key in
the job, next to the secret, and verify every sender-0 frame (:class:`ControllerVerifier`): a missing
or wrong signature drops the frame (``bad_signature``). The public key verifies but cannot sign, so a
compromised executor can no longer speak for the controller. In MESH the controller also signs every
UPDATE it relays (:func:`~sparkgrad.transport.frame.endorsed_frame`, over
:func:`~sparkgrad.transport.frame.origin_message`: everything but the fields each hop rewrites), and a
worker drops a relayed UPDATE without it (``bad_signature``): a compromised relay, which holds the HMAC
secret, can no longer forge an update "from" another worker or replace one for its subtree, and one it
drops shows as a gap in the signed broadcast numbers (the child takes the controller's parameters).
The signed message is :func:`~sparkgrad.transport.frame.signed_message` (header with the
tag zeroed, then SHA-256 of the payload), so the cost is one SHA-256 pass over the payload plus one
Ed25519 operation (``bench/python/bench_signing.py``).

Ed25519 comes from ``cryptography`` (OpenSSL).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from sparkgrad.transport.frame import SIGNATURE_SIZE, origin_message, signed_message

CONTROLLER_KEY_BYTES = 32  # a raw Ed25519 public key


class ControllerSigner:
    """The controller's Ed25519 key of one fit.

    Args:
        private_key: a raw 32-byte Ed25519 private key; None (every fit) draws a fresh one.
    """

    def __init__(self, private_key: bytes | None = None) -> None:
        if private_key is None:
            self._key = Ed25519PrivateKey.generate()
        else:
            if not isinstance(private_key, bytes) or len(private_key) != 32:
                raise ValueError("private_key: expected 32 bytes of a raw Ed25519 private key")
            self._key = Ed25519PrivateKey.from_private_bytes(private_key)
        self.public_key = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def __repr__(self) -> str:
        return f"ControllerSigner(public_key={self.public_key.hex()})"

    def sign(self, message: bytes) -> bytes:
        """The 64-byte signature of ``message``."""
        return self._key.sign(message)


class ControllerVerifier:
    """Verifies the controller's signature on a frame with the fit's public key.

    Args:
        controller_key: the raw 32-byte Ed25519 public key of the fit's controller.
    """

    def __init__(self, controller_key: bytes) -> None:
        if not isinstance(controller_key, bytes) or len(controller_key) != CONTROLLER_KEY_BYTES:
            raise ValueError(
                f"controller_key: expected the controller's {CONTROLLER_KEY_BYTES}-byte Ed25519 public key, "
                f"got {type(controller_key).__name__} {controller_key!r:.80}"
            )
        self._key = Ed25519PublicKey.from_public_bytes(controller_key)

    def verify(self, frame: bytes | memoryview) -> bool:
        """Whether ``frame`` (authenticated, ``SIGNED``) carries the controller's signature."""
        view = memoryview(frame).cast("B")
        return self._check(view, signed_message(view))

    def verify_origin(self, frame: bytes | memoryview) -> bool:
        """Whether a relayed UPDATE (authenticated, ``SIGNED``) carries the controller's endorsement
        (:func:`~sparkgrad.transport.frame.endorsed_frame`), whichever relays it passed."""
        view = memoryview(frame).cast("B")
        return self._check(view, origin_message(view))

    def _check(self, view: memoryview, message: bytes) -> bool:
        try:
            self._key.verify(bytes(view[-SIGNATURE_SIZE:]), message)
        except InvalidSignature:
            return False
        return True


__all__ = ["CONTROLLER_KEY_BYTES", "ControllerSigner", "ControllerVerifier"]
