"""What the controller's Ed25519 signature costs next to the HMAC every frame already pays.

Usage: PYTHONPATH=python python bench/python/bench_signing.py [--rounds 15] [--params 1000000,10000000]
       [--updates 400,40000,400000]

For an EPOCH_GO (a small control frame, like every SYNC_ACK) and a PARAMS frame of each float32
parameter count, it times, alternating the two in every round (medians over rounds):

- ``hmac``: what a frame costs today from the controller to a worker: encode_frame (HMAC-SHA256 seal)
  plus decode_frame (HMAC verify);
- ``hmac+ed25519``: the same with the controller's signature: encode_frame with the signer (SHA-256 of
  the payload plus one Ed25519 signature) plus decode_frame plus the worker's signature check.

And for a MESH UPDATE of each ``--updates`` payload size in bytes (the controller relays a worker's
update to a child): ``hmac`` = relayed_frame (re-seal) plus decode_frame; ``hmac+ed25519`` = the
controller's endorsement (endorsed_frame: SHA-256 of the payload, one Ed25519 signature, a re-seal)
plus the same plus the child's check of the endorsement (verify_origin).

Prints one line per frame: both times in microseconds and their ratio, plus the signature's own share.
The encode copies the payload into the frame in both variants, as the controller does.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sparkgrad.transport.frame import (
    FrameKey,
    MessageType,
    decode_frame,
    encode_frame,
    endorsed_frame,
    json_payload,
    relayed_frame,
)
from sparkgrad.transport.signing import ControllerSigner, ControllerVerifier

SECRET = bytes(range(32))


def _hmac_only(key: FrameKey, kind: MessageType, payload: memoryview) -> None:
    frame = encode_frame(key, kind, 1, 0, 7, payload, recipient=3)
    decode_frame(frame, key)


def _signed(
    key: FrameKey,
    signer: ControllerSigner,
    verifier: ControllerVerifier,
    kind: MessageType,
    payload: memoryview,
) -> None:
    frame = encode_frame(key, kind, 1, 0, 7, payload, recipient=3, signer=signer)
    decode_frame(frame, key)
    if not verifier.verify(frame):
        raise AssertionError("the signature does not verify")


def _relayed(key: FrameKey, frame: bytes) -> None:
    decode_frame(relayed_frame(key, frame, recipient=3, broadcast=5), key)


def _endorsed(key: FrameKey, signer: ControllerSigner, verifier: ControllerVerifier, frame: bytes) -> None:
    relayed = relayed_frame(key, endorsed_frame(key, frame, signer, 5), recipient=3)
    decode_frame(relayed, key)
    if not verifier.verify_origin(relayed):
        raise AssertionError("the endorsement does not verify")


def _time_us(fn, *args: object, repeat: int) -> float:
    """Microseconds per call of ``fn(*args)``, over ``repeat`` calls."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn(*args)
    return (time.perf_counter() - start) * 1e6 / repeat


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--params", default="1000000,10000000", help="PARAMS sizes (float32 counts)")
    parser.add_argument("--updates", default="400,40000,400000", help="MESH UPDATE payload sizes (bytes)")
    args = parser.parse_args()
    key, signer = FrameKey(SECRET), ControllerSigner()
    verifier = ControllerVerifier(signer.public_key)
    cases = []
    for name, kind, payload, repeat in [
        ("EPOCH_GO", MessageType.EPOCH_GO, memoryview(json_payload({"stop": False})), 200),
        *(
            (f"PARAMS {n:,} float32", MessageType.PARAMS, memoryview(_floats(n)).cast("B"), 1)
            for n in (int(x) for x in args.params.split(","))
        ),
    ]:
        cases.append(
            (name, (_hmac_only, key, kind, payload), (_signed, key, signer, verifier, kind, payload), repeat)
        )
    for size in (int(x) for x in args.updates.split(",")):
        words = np.arange(size // 4, dtype="<i4")
        frame = bytes(encode_frame(key, MessageType.UPDATE, 1, 2, 7, memoryview(words), recipient=0))
        cases.append(
            (f"MESH UPDATE {size:,} B", (_relayed, key, frame), (_endorsed, key, signer, verifier, frame), 50)
        )
    print(f"{'frame':<26} {'hmac us':>12} {'hmac+ed25519 us':>16} {'ratio':>7} {'signature share':>16}")
    for name, plain_call, signed_call, repeat in cases:
        plain, signed = [], []
        for _ in range(args.rounds):  # alternating, so machine noise hits both alike
            plain.append(_time_us(*plain_call, repeat=repeat))
            signed.append(_time_us(*signed_call, repeat=repeat))
        p, s = statistics.median(plain), statistics.median(signed)
        print(f"{name:<26} {p:>12.1f} {s:>16.1f} {s / p:>6.2f}x {(s - p) / s:>15.0%}")


def _floats(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(n).astype(np.float32)


if __name__ == "__main__":
    main()
