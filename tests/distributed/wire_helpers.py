"""Helpers of the transport tests: a minimal sparse codec, a fixed secret, fast timeouts."""

from __future__ import annotations

import time

import numpy as np
import zmq
from zmq.utils import z85

from sparkgrad.transport import Controller, ZmqTransportConfiguration
from sparkgrad.transport.limits import Curve
from sparkgrad.transport.signing import ControllerSigner

SECRET = bytes(range(32))
SIGNER = ControllerSigner(bytes(range(32, 64)))  # the test controllers' Ed25519 key
CONTROLLER_KEY = SIGNER.public_key  # what the test workers verify the controller's frames with
# the test controllers' CURVE key pair (ZmqTransportConfiguration.encrypt), the same in every process
CURVE = Curve(zmq.curve_public(z85.encode(bytes(range(64, 96)))), z85.encode(bytes(range(64, 96))))
CURVE_KEY = CURVE.public  # what the test workers connect with
FAST = ZmqTransportConfiguration(connect_timeout_ms=800, sync_timeout_ms=3000, poll_interval_ms=10)
REFERENCE = 1.0  # threshold_reference of the test controllers; the test messages use 0.25 .. 2.0


def sparse_decode(message: np.ndarray, target: np.ndarray) -> None:
    """Minimal decoder of the sparse threshold format (the transport is format-agnostic)."""
    n = int(message[0])
    threshold = np.frombuffer(np.int32(message[2]).tobytes(), dtype=np.float32)[0]
    entries = message[4 : 4 + n]
    np.add.at(target, np.abs(entries) - 1, np.sign(entries) * threshold)


def sparse_message(indices: list[int], signs: list[int], length: int, threshold: float) -> np.ndarray:
    bits = np.frombuffer(np.float32(threshold).tobytes(), dtype=np.int32)[0]
    entries = [s * (i + 1) for i, s in zip(indices, signs)]
    return np.array([len(entries), length, bits, 0, *entries], dtype=np.int32)


def wait_until(predicate, timeout_s: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes (a bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def controller(params: np.ndarray, job: int, port: int, **kw) -> Controller:
    """A test controller on 127.0.0.1 with the test secret and signing key, fast timeouts and the minimal
    decoder."""
    kw.setdefault("decode", sparse_decode)
    kw.setdefault("threshold_reference", REFERENCE)
    kw.setdefault("signer", SIGNER)
    kw.setdefault("curve", CURVE)
    return Controller(params, job, SECRET, "127.0.0.1", port, kw.pop("config", FAST), **kw)


def worker_job(net, job: int, port: int, **options):
    """The SharedJob a SharedTrainingMaster sends its executors, for a worker of ``net`` talking to the
    test controller of ``job`` on ``port`` (``options``: the gradient-sharing fields)."""
    from sparkgrad.spark.common import NetworkSnapshot
    from sparkgrad.spark.shared_worker import SharedJob

    return SharedJob(
        job_id=job,
        secret=SECRET,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        host="127.0.0.1",
        port=port,
        transport=FAST,
        snapshot=NetworkSnapshot.of(net),
        kind="dataset",
        loader=None,
        batch_size=16,
        prefetch=0,
        collect_stats=False,
        barrier=False,
        shuffle_seed=0,
        **options,
    )


def raw_dealer(ctx: zmq.Context, port: int, server_key: bytes | None = CURVE_KEY) -> zmq.Socket:
    """A bare DEALER socket on the controller's port (or a relay's): sends whatever bytes a test forges.
    It speaks CURVE to ``server_key`` (a peer that knows the server's public key: the frames' own
    checks are what stops it), or with None in the clear."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if server_key is not None:
        curve_client(sock, server_key)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def curve_client(sock: zmq.Socket, server_key: bytes = CURVE_KEY) -> zmq.Socket:
    """``sock`` a CURVE client of ``server_key``: a test controller or a forged relay (:func:`curve_server`)
    by default."""
    client = Curve.client_of(server_key)
    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
        server_key,
        client.public,
        client.secret,
    )
    return sock


def curve_server(sock: zmq.Socket) -> zmq.Socket:
    """``sock`` (a test's stand-in for a controller or a MESH relay) a CURVE server with the test key pair,
    which the workers connect with; a forged relay announces it in its HELLO as ``relay_key``."""
    sock.curve_secretkey, sock.curve_publickey, sock.curve_server = CURVE.secret, CURVE.public, True
    return sock


def relay_hello(relay: str) -> dict[str, str]:
    """The HELLO body of a (forged) MESH relay at ``relay`` ("host:port") serving with
    :func:`curve_server`."""
    return {"relay": relay, "relay_key": CURVE_KEY.decode()}
