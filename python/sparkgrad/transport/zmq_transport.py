"""PLAIN-topology gradient sharing over ZeroMQ (pyzmq).

The controller (a thread on the Spark driver) owns one ROUTER socket. Workers connect with a DEALER
socket, say HELLO and receive the current parameters; every UPDATE they send is applied to the
controller's authoritative parameter copy and relayed to every other registered worker. A SYNC
request is answered after everything the worker sent before it has been applied (ZeroMQ keeps
per-connection order), which is how a task makes sure its updates reached the controller before it
returns. Every socket has LINGER 0 and every wait is bounded, so no failure mode hangs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from sparkgrad._config import Config, check_int
from sparkgrad.errors import CorruptDataError, TransportError
from sparkgrad.transport.frame import (
    CONTROLLER_ID,
    Flag,
    Header,
    MessageType,
    decode_frame,
    encode_frame,
    json_payload,
    params_payload,
    parse_json_payload,
    update_payload,
)

log = logging.getLogger(__name__)


@dataclass
class ZmqTransportConfiguration(Config):
    """Timeouts and buffer limits of the ZeroMQ transport.

    Args:
        connect_timeout_ms: how long a worker waits for the controller's answer to HELLO.
        sync_timeout_ms: how long a worker waits for the controller to acknowledge its updates.
        poll_interval_ms: the controller's poll period (bounds how fast it notices a stop request).
        high_water_mark: ZeroMQ send/receive queue limit in messages (0 = unlimited, so the controller
            never drops a relayed update).
    """

    connect_timeout_ms: int = 15000
    sync_timeout_ms: int = 120000
    poll_interval_ms: int = 50
    high_water_mark: int = 0

    def __post_init__(self) -> None:
        check_int("connect_timeout_ms", self.connect_timeout_ms, minimum=1)
        check_int("sync_timeout_ms", self.sync_timeout_ms, minimum=1)
        check_int("poll_interval_ms", self.poll_interval_ms, minimum=1)
        check_int("high_water_mark", self.high_water_mark, minimum=0)


def _socket(ctx: zmq.Context, kind: int, config: ZmqTransportConfiguration) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, config.high_water_mark)
    sock.setsockopt(zmq.RCVHWM, config.high_water_mark)
    return sock


def endpoint(host: str, port: int) -> str:
    """The ZeroMQ TCP endpoint of a host and port."""
    return f"tcp://{host}:{port}"


def _float_flag(array: np.ndarray) -> Flag:
    return Flag.FLOAT64 if array.dtype == np.float64 else Flag.NONE


@dataclass
class TrafficCounters:
    """Bytes and frames through one endpoint."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    update_bytes: int = 0  # UPDATE frames only: sent by a worker, relayed by the controller


class Controller:
    """The driver-side relay that keeps the authoritative parameters.

    Args:
        params: initial parameter vector (copied).
        job_id: the fit's 64-bit job id; frames of other jobs are answered with ERROR.
        host: address to bind.
        port: TCP port to bind.
        config: transport timeouts.
        decode: ``decode(message, target)`` accumulating a message into ``target`` (defaults to
            :func:`sparkgrad.compress.decode`).
        iteration: starting iteration counter.
        epoch: starting epoch counter.
    """

    def __init__(
        self,
        params: np.ndarray,
        job_id: int,
        host: str,
        port: int,
        config: ZmqTransportConfiguration | None = None,
        decode: Callable[[np.ndarray, np.ndarray], None] | None = None,
        iteration: int = 0,
        epoch: int = 0,
    ) -> None:
        if decode is None:
            from sparkgrad.compress import decode as decode
        self._params = np.array(params, copy=True)
        self._scratch = np.zeros_like(self._params)
        self._decode = decode
        self._config = config or ZmqTransportConfiguration()
        self.job_id = job_id
        self.host, self.port = host, port
        self.iteration, self.epoch = iteration, epoch
        self.counters = TrafficCounters()
        self.updates_applied = 0
        self.workers_seen: set[int] = set()
        self._peers: dict[int, bytes] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._ctx = zmq.Context()
        self._sock = _socket(self._ctx, zmq.ROUTER, self._config)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._sock.bind(endpoint(host, port))
        except zmq.ZMQError as exc:
            self._sock.close()
            self._ctx.term()
            raise TransportError(
                f"controller cannot listen on {endpoint(host, port)}: {exc} "
                "(is the port in use, or the address not one of this machine's? set VoidConfiguration."
                "unicast_port / controller_address)"
            ) from exc
        self._thread = threading.Thread(
            target=self._run, name=f"sparkgrad-controller-{job_id:x}", daemon=True
        )
        self._thread.start()

    # -- public ---------------------------------------------------------------------------------
    def params(self) -> np.ndarray:
        """A copy of the current authoritative parameters."""
        with self._lock:
            return self._params.copy()

    def check(self) -> None:
        """Raise the error that stopped the controller thread, if any."""
        if self._error is not None:
            raise TransportError(f"controller on {endpoint(self.host, self.port)} failed: {self._error}")

    def close(self) -> None:
        """Tell registered workers the job is over, stop the thread and close the socket (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._ctx.term()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(self._config.poll_interval_ms):
                    continue
                while True:
                    try:
                        identity, frame = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    except ValueError:  # not a two-part message: a stranger on the port
                        continue
                    self._handle(identity, frame)
            for identity in list(self._peers.values()):
                self._send(
                    identity, encode_frame(MessageType.BYE, self.job_id, CONTROLLER_ID, self._next_seq())
                )
        except BaseException as exc:  # surfaced to the driver through check()
            log.exception("sparkgrad controller thread failed")
            self._error = exc
        finally:
            self._sock.close()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def _send(self, identity: bytes, frame: bytes) -> bool:
        try:
            self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:  # peer gone (ROUTER_MANDATORY) or queue full: drop the peer
            for sender, ident in list(self._peers.items()):
                if ident == identity:
                    del self._peers[sender]
            return False
        self.counters.bytes_sent += len(frame)
        self.counters.messages_sent += 1
        return True

    def _error_reply(self, identity: bytes, text: str) -> None:
        log.warning("sparkgrad controller: %s", text)
        self._send(
            identity,
            encode_frame(
                MessageType.ERROR, self.job_id, CONTROLLER_ID, self._next_seq(), json_payload({"error": text})
            ),
        )

    def _params_frame(self, current: bool = True) -> bytes:
        if not current:  # nothing applied yet: the worker's own copy of the initial parameters is current
            return encode_frame(
                MessageType.PARAMS,
                self.job_id,
                CONTROLLER_ID,
                self._next_seq(),
                iteration=self.iteration,
                epoch=self.epoch,
                flags=_float_flag(self._params),
            )
        return encode_frame(
            MessageType.PARAMS,
            self.job_id,
            CONTROLLER_ID,
            self._next_seq(),
            self._params.astype(self._params.dtype.newbyteorder("<"), copy=False),
            iteration=self.iteration,
            epoch=self.epoch,
            flags=_float_flag(self._params),
        )

    def _handle(self, identity: bytes, frame: bytes) -> None:
        self.counters.bytes_received += len(frame)
        self.counters.messages_received += 1
        try:
            header, payload = decode_frame(frame, peer=f"worker {identity.hex()}")
        except CorruptDataError as exc:
            self._error_reply(identity, str(exc))
            return
        if header.job_id != self.job_id:
            if header.message_type == MessageType.BYE:  # a worker of an earlier job on this port leaving
                return
            self._error_reply(
                identity,
                f"frame from worker {header.sender} is for job {header.job_id:x}, "
                f"this controller runs job {self.job_id:x}",
            )
            return
        kind = header.message_type
        if kind == MessageType.UPDATE:
            self._apply_and_relay(identity, header, payload, frame)
        elif kind in (MessageType.HELLO, MessageType.PARAMS_REQUEST):
            fresh = kind == MessageType.HELLO and bool(parse_json_payload(payload).get("has_initial_params"))
            if kind == MessageType.HELLO:
                self._peers[header.sender] = identity
                self.workers_seen.add(header.sender)
            self._send(identity, self._params_frame(current=not (fresh and self.updates_applied == 0)))
        elif kind == MessageType.SYNC:
            self._send(
                identity, encode_frame(MessageType.SYNC_ACK, self.job_id, CONTROLLER_ID, self._next_seq())
            )
        elif kind == MessageType.BYE:
            self._peers.pop(header.sender, None)
        else:
            self._error_reply(identity, f"unexpected {kind.name} frame from worker {header.sender}")

    def _apply_and_relay(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        message = update_payload(payload)
        try:
            with self._lock:
                self._scratch.fill(0)
                self._decode(message, self._scratch)
                self._params -= self._scratch
                self.iteration = max(self.iteration, header.iteration)
                self.epoch = max(self.epoch, header.epoch)
                self.updates_applied += 1
        except (ValueError, TypeError) as exc:
            self._error_reply(identity, f"malformed update from worker {header.sender}: {exc}")
            return
        relayed = frame[:6] + int(header.flags | Flag.RELAYED).to_bytes(2, "little") + frame[8:]
        for sender, ident in list(self._peers.items()):
            if sender != header.sender and self._send(ident, relayed):
                self.counters.update_bytes += len(relayed)


class WorkerConnection:
    """A worker's DEALER connection to the controller.

    Args:
        host: controller address.
        port: controller port.
        job_id: the fit's job id.
        worker_id: this worker's nonzero 32-bit id.
        config: transport timeouts.
    """

    def __init__(
        self,
        host: str,
        port: int,
        job_id: int,
        worker_id: int,
        config: ZmqTransportConfiguration | None = None,
    ) -> None:
        if not 0 < worker_id < 2**32:
            raise ValueError(f"worker_id must be in [1, 2**32), got {worker_id}")
        self._config = config or ZmqTransportConfiguration()
        self.endpoint = endpoint(host, port)
        self.job_id, self.worker_id = job_id, worker_id
        self.counters = TrafficCounters()
        self._seq = 0
        self._ctx = zmq.Context()
        self._sock = _socket(self._ctx, zmq.DEALER, self._config)
        self._sock.connect(self.endpoint)
        self._closed = False

    def _send(self, kind: MessageType, payload: bytes | memoryview = b"", **kw: object) -> int:
        frame = encode_frame(kind, self.job_id, self.worker_id, self._seq, payload, **kw)  # type: ignore[arg-type]
        self._seq += 1
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            raise TransportError(
                f"worker {self.worker_id}: cannot send to controller {self.endpoint}: {exc}"
            ) from exc
        self.counters.bytes_sent += len(frame)
        self.counters.messages_sent += 1
        return len(frame)

    def _receive(self, timeout_ms: int) -> tuple[Header, memoryview] | None:
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return None
        frame = self._sock.recv(copy=True)
        self.counters.bytes_received += len(frame)
        self.counters.messages_received += 1
        header, payload = decode_frame(frame, peer=f"controller {self.endpoint}")
        if header.message_type == MessageType.ERROR:
            text = parse_json_payload(payload).get("error", "unknown error")
            raise TransportError(f"controller {self.endpoint} rejected worker {self.worker_id}: {text}")
        if header.job_id != self.job_id:
            raise TransportError(
                f"controller {self.endpoint} answered for job {header.job_id:x}, expected {self.job_id:x}"
            )
        return header, payload

    def _wait_for(
        self,
        wanted: MessageType,
        timeout_ms: int,
        on_update: Callable[[Header, np.ndarray], None] | None,
        what: str,
    ) -> tuple[Header, memoryview]:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            got = self._receive(max(left, 0)) if left > 0 else None
            if got is None:
                raise TransportError(
                    f"worker {self.worker_id}: no answer to {what} from controller {self.endpoint} within "
                    f"{timeout_ms} ms (is the controller address reachable from this executor?)"
                )
            header, payload = got
            if header.message_type == wanted:
                return header, payload
            if header.message_type == MessageType.UPDATE and on_update is not None:
                on_update(header, update_payload(payload))

    def hello(self, info: dict[str, object]) -> tuple[np.ndarray | None, int, int]:
        """Join the job; returns (current parameters copy, iteration, epoch) from the controller.

        With ``info["has_initial_params"]`` true the parameters are None while the controller has not
        applied any update yet (the worker's copy of the initial parameters is then current).
        """
        self._send(MessageType.HELLO, json_payload(info))
        header, payload = self._wait_for(MessageType.PARAMS, self._config.connect_timeout_ms, None, "HELLO")
        params = params_payload(header, payload).copy() if header.payload_length else None
        return params, header.iteration, header.epoch

    def send_update(self, message: np.ndarray, iteration: int, epoch: int) -> int:
        """Send one encoded int32 update; returns the frame size in bytes."""
        message = np.ascontiguousarray(message, dtype="<i4")
        size = self._send(MessageType.UPDATE, memoryview(message), iteration=iteration, epoch=epoch)
        self.counters.update_bytes += size
        return size

    def drain(self, on_update: Callable[[Header, np.ndarray], None]) -> int:
        """Apply every peer update that has already arrived (non-blocking); returns how many."""
        count = 0
        while True:
            got = self._receive(0)
            if got is None:
                return count
            header, payload = got
            if header.message_type == MessageType.UPDATE:
                on_update(header, update_payload(payload))
                count += 1

    def sync(self, on_update: Callable[[Header, np.ndarray], None]) -> None:
        """Block until the controller has applied everything sent so far, applying arriving updates."""
        self._send(MessageType.SYNC)
        self._wait_for(MessageType.SYNC_ACK, self._config.sync_timeout_ms, on_update, "SYNC")

    def close(self) -> None:
        """Say BYE (best effort) and close the socket and context (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._send(MessageType.BYE)
        except TransportError:
            pass
        self._sock.close()
        self._ctx.term()


__all__ = ["Controller", "TrafficCounters", "WorkerConnection", "ZmqTransportConfiguration", "endpoint"]
