"""How the controller's parameters change: gradient sharing or parameter averaging, two policies behind
the controller's one socket loop (:class:`~sparkgrad.transport.controller.Controller`).

The controller authenticates every frame, keeps its peers, the MESH tree and the epoch barrier, and
handles faults; a frame of its policy's kind from a registered worker (already authenticated and its
sequence number committed) goes to the policy, which checks it, changes the parameters and answers
through the controller (:class:`PolicyHost`). A frame of the other policy's kind is answered
``unexpected``.

Gradient sharing (:class:`SharingPolicy`, UPDATE): every update is applied to the controller's
parameters and relayed to the other workers (PLAIN) or down the MESH tree. Update sanity: an UPDATE
whose sparse indices are not strictly ascending (``unordered``,
:func:`~sparkgrad.transport.limits.check_update_entries`) or whose threshold fails the fit's bound
(:func:`~sparkgrad.transport.limits.check_update_threshold`, reason ``threshold``: at most the larger of
``threshold_factor`` x the median of the other registered workers' latest accepted thresholds, each
grown for the updates the sender is ahead of it (:meth:`SharingPolicy._check_threshold`), and the
reference) is counted and never applied; the worker gets an ERROR (its fit fails with the reason). An
update that would leave any parameter non-finite (float overflow of finite values) is refused too
(reason ``non_finite``), naming its sender; the parameters stay as they were. A sparse update (with the
default decoder) is applied in place in O(entries) under the controller's lock, the parameters it
touched restored exactly when it is refused; a bitmap is computed in a second buffer (dense passes). A
worker whose recent updates outweigh the median other registered worker's
(:class:`~sparkgrad.transport.limits.InfluenceLedger`) is flagged past ``outlier_factor / 2`` and
quarantined past ``outlier_factor``: its update is refused (``outlier``), it is dropped
(``quarantined``) and told to re-join.

Parameter averaging (:class:`AveragingPolicy`, ParameterAveragingTrainingMaster's rounds in one Spark
job): no UPDATE is taken (``unexpected``). Every worker sends an AVERAGE for every round of every
epoch, with its trained parameters (the controller's ``averaged_ranges``: a frozen layer's never change
and are not sent) and updater state with ``average_updater_state`` after the round, or with
none when its partition had no data in it (it still joins the round, so no worker waits for one that ran
out of data). Once every partition of the barrier (:meth:`Controller.expect_workers
<sparkgrad.transport.controller.Controller.expect_workers>`) reported a round, the mean of the reported
vectors, summed in float64 in partition order (so it does not depend on the order of arrival), becomes
the controller's parameters and updater state, the iteration advances by the round's largest minibatch
count (DL4J's ``iterationCount += averagingFrequency``) and every worker of the round gets the mean in
an AVERAGED frame. A worker id that joins once a round was averaged or every partition has its worker (a
Spark task re-run after a failure) stops the controller: the rounds cannot be resumed, so the fit fails.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from sparkgrad.compress.codec import decode as default_decode
from sparkgrad.compress.codec import message_indices, subtract_message
from sparkgrad.errors import TransportError
from sparkgrad.nn.trained_ranges import TrainedRanges
from sparkgrad.transport.frame import (
    Flag,
    FrameRejected,
    Header,
    MessageType,
    averaging_payload,
    float_flag,
    max_averaging_bytes,
    max_update_bytes,
    parse_averaging_payload,
    update_payload,
)
from sparkgrad.transport.limits import (
    InfluenceLedger,
    RateLimitedLog,
    TrafficCounters,
    ZmqTransportConfiguration,
    all_finite,
    check_update_entries,
    check_update_threshold,
    finite_mean,
    is_count,
)


class PolicyHost(Protocol):
    """What a policy uses of the controller that runs it: its parameters and counters (changed under
    its lock), its peers, and its ways of answering, dropping and relaying."""

    _params: np.ndarray
    _updater_state: np.ndarray | None
    _lock: threading.Lock
    _peers: dict[int, bytes]
    _expected_workers: int
    _log: RateLimitedLog
    counters: TrafficCounters
    iteration: int
    epoch: int
    workers_seen: set[int]
    updates_applied: int
    updates_by_worker: dict[int, int]
    rounds_averaged: int
    round_scores: list[tuple[int, int, float]]

    def _refuse(self, identity: bytes, worker: int, exc: FrameRejected) -> None: ...

    def _send(self, identity: bytes, frame: bytes | bytearray) -> bool: ...

    def _signed_frame(
        self,
        kind: MessageType,
        recipient: int,
        payload: bytes | memoryview,
        *,
        iteration: int = 0,
        epoch: int = 0,
        flags: Flag = Flag.NONE,
    ) -> bytearray: ...

    def _forget(self, sender: int) -> None: ...

    def _rejoin_notice(self, sender: int, identity: bytes) -> None: ...

    def _relay(self, sender: int, frame: bytes) -> None: ...

    def _applied(self, header: Header, message: np.ndarray) -> None: ...

    def _round_averaged(self, epoch: int, minibatches: int, score: float | None) -> None: ...


class Policy(ABC):
    """One way of changing the controller's parameters: the frame kind it takes and how."""

    kind: ClassVar[MessageType]  # the frame kind it takes; the controller answers the other "unexpected"
    max_payload: int  # the largest payload of that kind (checked before the tag)

    def __init__(self, controller: PolicyHost) -> None:
        self.controller = controller

    @abstractmethod
    def next_iteration(self, iteration: int) -> int:
        """The iteration count the driver's network continues from, given the controller's."""

    @abstractmethod
    def check_join(self, sender: int) -> None:
        """Called on a HELLO before ``sender`` is registered; raises TransportError if it may not join."""

    @abstractmethod
    def take(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        """A frame of :attr:`kind` from the registered worker ``header.sender``."""


class SharingPolicy(Policy):
    """Gradient sharing: apply every sane UPDATE and relay it (module docstring).

    Args:
        controller: the controller.
        params: the controller's parameters (sizes the buffers).
        decode: ``decode(message, target)`` accumulating a message into ``target``; None: the default.
        threshold_reference: the threshold workers start from; bounds the accepted thresholds.
        threshold_growth: the most the job's threshold algorithm raises a worker's threshold in one step
            (``ThresholdAlgorithm.max_step_growth``, finite and >= 1).
        config: the controller's configuration (its threshold and outlier factors).
    """

    kind = MessageType.UPDATE

    def __init__(
        self,
        controller: PolicyHost,
        params: np.ndarray,
        decode: Callable[[np.ndarray, np.ndarray], None] | None,
        threshold_reference: float | None,
        threshold_growth: float,
        config: ZmqTransportConfiguration,
    ) -> None:
        if decode is None:
            decode = default_decode
        if not (isinstance(threshold_reference, (int, float)) and 0 < threshold_reference < math.inf):
            raise ValueError(f"threshold_reference: must be a finite number > 0, got {threshold_reference!r}")
        if not (isinstance(threshold_growth, (int, float)) and 1 <= threshold_growth < math.inf):
            raise ValueError(f"threshold_growth: must be a finite number >= 1, got {threshold_growth!r}")
        super().__init__(controller)
        self.max_payload = max_update_bytes(params.size)
        self._decode: Callable[[np.ndarray, np.ndarray], None] = decode
        self._config = config
        self._reference = float(threshold_reference)
        self._thresholds: dict[int, float] = {}  # each worker's latest accepted threshold
        # the growth per update a worker is ahead of another (its log), and the largest in all: a warm
        # bound is never wider than the warm-up's
        self._log_growth = math.log(threshold_growth)
        self._growth_limit = max(1.0, config.warmup_threshold_factor / config.threshold_factor)
        self._log_growth_limit = math.log(self._growth_limit)
        self._ledger = InfluenceLedger(config.outlier_factor, self._reference)
        # with the default decoder a sparse message is applied in place in O(entries) (_take_sparse); a
        # custom decoder is honoured in dense passes (_take_dense). The sparse path checks only the
        # parameters it touches: the others are finite, since the start was and every applied update
        # leaves all finite. A non-finite start refuses every update (the dense check), as it always did.
        self._sparse_in_place = decode is default_decode and all_finite(params)
        self._scratch = np.zeros_like(params)
        self._undecoded: np.ndarray | None = None  # a sparse message scratch does not hold decoded yet
        self._next_params = np.empty_like(params)  # a dense update is checked here before it is taken

    @property
    def scratch(self) -> np.ndarray:
        """The latest update taken (read it in ``Controller._applied``), decoded into zeros. A sparse update
        applied in place is decoded on the first read: a dense pass that only a reader pays for."""
        if self._undecoded is not None:
            message, self._undecoded = self._undecoded, None
            self._scratch.fill(0)
            self._decode(message, self._scratch)
        return self._scratch

    def next_iteration(self, iteration: int) -> int:
        return iteration + 1  # one past the iteration of the last applied update

    def check_join(self, sender: int) -> None:
        pass  # a worker may join, and re-join, at any time: it receives the current parameters

    def _check_threshold(self, sender: int, message: np.ndarray) -> float:
        """The message's threshold if it is sane (module docstring), else FrameRejected("threshold"): at
        most the larger of a factor x the fit's current threshold and the reference. The current
        threshold is the median latest accepted threshold of the other registered workers (a departed
        worker's threshold is history). Those with ``InfluenceLedger.WARMUP`` updates or more count,
        with ``threshold_factor``; while none has, a worker's first updates may be far from another's
        (an adaptive algorithm finding its level), so all count, with ``warmup_threshold_factor``; a
        worker alone in the fit has only the fixed bound.

        A warm worker's latest is grown by the algorithm's step growth for every update the sender is
        ahead of it (accepted updates of each), at most to ``warmup_threshold_factor /
        threshold_factor``: each worker's threshold moves with its own steps, so one that ran ahead of
        a stalled worker (a descheduled Spark task) may have climbed as far as its algorithm takes it
        in those steps, and it stays that far ahead once the stalled one goes on."""
        ctl, config = self.controller, self._config
        counts = ctl.updates_by_worker
        others = {w: t for w, t in self._thresholds.items() if w != sender and w in ctl._peers}
        mine = counts.get(sender, 0)
        warm = [
            t * self._growth(mine - counts.get(w, 0))
            for w, t in others.items()
            if counts.get(w, 0) >= InfluenceLedger.WARMUP
        ]
        current, factor = None, math.inf
        if warm:
            current, factor = float(np.median(warm)), config.threshold_factor
        elif others:
            current, factor = float(np.median(list(others.values()))), config.warmup_threshold_factor
        return check_update_threshold(message, self._reference, f"worker {sender}", current, factor)

    def _growth(self, lead: int) -> float:
        """How much a worker ``lead`` updates ahead of another may have raised its threshold past it."""
        log = max(lead, 0) * self._log_growth
        return self._growth_limit if log >= self._log_growth_limit else math.exp(log)

    def _quarantine(self, identity: bytes, sender: int, ratio: float) -> None:
        """Drop a worker whose updates are outliers (its update was not applied) and tell it to re-join."""
        ctl = self.controller
        ctl.counters.reject("outlier")
        ctl._forget(sender)
        ctl.counters.drop("quarantined")
        ctl._log.warning(
            f"quarantined worker {sender}: its recent updates are {ratio:.3g} x the median other worker's "
            f"(outlier_factor {self._ledger.factor:g}); it must re-join"
        )
        ctl._rejoin_notice(sender, identity)

    def _take_dense(self, sender: int, message: np.ndarray, threshold: float) -> tuple[float, float]:
        """Decode, check and apply an update in dense passes over the parameters (a bitmap, or any message
        with a custom decoder): computed in a second buffer, swapped in when applied. Under the lock;
        returns (ledger ratio, L1); raises FrameRejected (``bad_update``, ``non_finite``)."""
        ctl = self.controller
        self._undecoded = None
        self._scratch.fill(0)
        try:
            self._decode(message, self._scratch)
        except (ValueError, TypeError) as exc:
            raise FrameRejected("bad_update", f"malformed update from worker {sender}: {exc}") from None
        with np.errstate(over="ignore", invalid="ignore"):  # checked on the next line
            np.subtract(ctl._params, self._scratch, out=self._next_params)
        if not all_finite(self._next_params):
            raise self._non_finite(sender, threshold)
        # L1: every entry moves one parameter by the threshold (at most: a bitmap's -t/2 codes)
        entries = int(message[0]) if message[3] == 0 else int(np.count_nonzero(self._scratch))
        l1 = threshold * entries
        ratio = self._ledger.ratio(sender, l1, threshold, ctl._peers)
        if ratio <= self._ledger.factor:
            ctl._params, self._next_params = self._next_params, ctl._params
        return ratio, l1

    def _take_sparse(self, sender: int, message: np.ndarray, threshold: float) -> tuple[float, float]:
        """:meth:`_take_dense` for a sparse message with the default decoder, in O(entries): applied in
        place, and the touched parameters restored exactly when it is refused (non-finite) or not taken
        (quarantine). Under the lock, so no reader sees it half applied: every reader of the parameters
        off the controller thread copies them under the lock (:meth:`Controller.params`), and PARAMS
        frames are built on this thread (``encode_frame`` copies the payload before signing)."""
        ctl = self.controller
        params = ctl._params
        # the touched parameters before the update; gathered before the native kernel validates the
        # message, so clipped (a malformed message's indices may be anything: it is refused, these unused).
        # check_update_entries made them distinct, so writing them back restores every one.
        indices = message_indices(message)
        assert indices is not None  # flag 0
        before = np.take(params, indices, mode="clip")
        try:
            subtract_message(message, params)  # a malformed message raises, params untouched
        except (ValueError, TypeError) as exc:
            raise FrameRejected("bad_update", f"malformed update from worker {sender}: {exc}") from None
        if not all_finite(params[indices]):
            params[indices] = before
            raise self._non_finite(sender, threshold)
        l1 = threshold * int(message[0])  # every entry moves one parameter by the threshold
        ratio = self._ledger.ratio(sender, l1, threshold, ctl._peers)
        if ratio > self._ledger.factor:
            params[indices] = before
        else:  # taken: scratch decodes it when read (the message views the received frame, kept alive)
            self._undecoded = message
        return ratio, l1

    @staticmethod
    def _non_finite(sender: int, threshold: float) -> FrameRejected:
        return FrameRejected(
            "non_finite",
            f"update from worker {sender} (threshold {threshold:.6g}) would make parameters "
            "non-finite: not applied",
        )

    def take(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        ctl, sender = self.controller, header.sender
        try:
            if header.payload_length > self.max_payload or header.payload_length < 16:
                raise FrameRejected(
                    "malformed",
                    f"update from worker {sender}: {header.payload_length} bytes, expected 16 to "
                    f"{self.max_payload} for {ctl._params.size} parameters",
                )
            message = update_payload(header, payload, f"worker {sender}")
            threshold = self._check_threshold(sender, message)
            check_update_entries(message, f"worker {sender}")
            with ctl._lock:
                if message[3] == 0 and self._sparse_in_place:
                    ratio, l1 = self._take_sparse(sender, message, threshold)
                else:
                    ratio, l1 = self._take_dense(sender, message, threshold)
        except FrameRejected as exc:  # authenticated sender: it is told why (its fit fails)
            ctl._refuse(identity, sender, exc)
            return
        if ratio > self._ledger.factor:
            self._quarantine(identity, sender, ratio)
            return
        if ratio > self._ledger.factor / 2:
            ctl.counters.outliers_flagged += 1
            ctl._log.warning(
                f"worker {sender}: its recent updates are {ratio:.3g} x the median other worker's"
            )
        self._ledger.record(sender, l1, threshold)
        self._thresholds[sender] = threshold
        with ctl._lock:
            ctl.updates_by_worker[sender] = ctl.updates_by_worker.get(sender, 0) + 1
            ctl.iteration = max(ctl.iteration, header.iteration)
            ctl.epoch = max(ctl.epoch, header.epoch)
            ctl.updates_applied += 1
        ctl._applied(header, message)
        ctl._relay(sender, frame)


@dataclass
class _Contribution:
    """One partition's AVERAGE of a round."""

    worker: int
    identity: bytes
    values: np.ndarray | None  # None: the partition had no data in the round
    minibatches: int
    score: float | None


class AveragingPolicy(Policy):
    """Parameter averaging: the mean of every round's AVERAGE vectors (module docstring).

    Args:
        controller: the controller.
        params: the controller's parameters.
        updater_state: the controller's updater state (None or empty when the updater has none).
        average_updater_state: average the workers' updater states too (the AVERAGE and AVERAGED vectors
            hold the parameters followed by the updater state); off when there is no state.
        mesh: whether the controller runs a MESH tree (refused: the rounds use the PLAIN topology).
        ranges: the parameters the vectors hold (a network's trained ranges); None: all of them.
    """

    kind = MessageType.AVERAGE

    def __init__(
        self,
        controller: PolicyHost,
        params: np.ndarray,
        updater_state: np.ndarray | None,
        average_updater_state: bool,
        mesh: bool,
        ranges: TrainedRanges | None = None,
    ) -> None:
        if mesh:
            raise ValueError("mesh: averaging rounds use the PLAIN topology")
        if ranges is not None and ranges.num_params != params.size:
            raise ValueError(
                f"ranges: cover {ranges.num_params} parameters, the controller has {params.size}"
            )
        super().__init__(controller)
        self._ranges = ranges or TrainedRanges(((0, params.size),), params.size)
        # an updater without state: only parameters are averaged
        state = updater_state if average_updater_state and updater_state is not None else None
        self._with_state = state is not None and state.size > 0
        # floats in an AVERAGE/AVERAGED vector: the parameters, then the updater state if averaged
        self._size = self._ranges.size + (state.size if state is not None else 0)
        self.max_payload = max_averaging_bytes(self._size)
        # the AVERAGE vectors of each (epoch, round) so far by partition, the rounds done
        self.rounds: dict[tuple[int, int], dict[int, _Contribution]] = {}
        self._averaged: set[tuple[int, int]] = set()

    def next_iteration(self, iteration: int) -> int:
        return iteration  # the controller's count is after the last averaged round

    def check_join(self, sender: int) -> None:
        ctl = self.controller
        if sender not in ctl.workers_seen and (
            self._averaged or len(ctl.workers_seen) >= ctl._expected_workers
        ):
            raise TransportError(
                f"worker {sender} joined after the averaging rounds began (a Spark task re-run after "
                "a failed task or a lost executor): the rounds of a one-job parameter-averaging fit "
                "cannot be resumed"
            )

    def take(self, identity: bytes, header: Header, payload: memoryview, frame: bytes) -> None:
        """A worker's AVERAGE: its vector (or none) for its partition in the header's (epoch, round)."""
        ctl, sender = self.controller, header.sender
        peer = f"worker {sender}"
        key = (header.epoch, header.iteration)
        try:
            body, values = parse_averaging_payload(header, payload, peer)
            partition, minibatches, score = body.get("partition"), body.get("minibatches"), body.get("score")
            expected = ctl._expected_workers
            if not (is_count(partition) and is_count(minibatches) and expected and partition < expected):
                raise FrameRejected("malformed", f"{peer}: bad averaging report {body!r}")
            if values is not None:
                if values.size != self._size or values.dtype != ctl._params.dtype.newbyteorder("<"):
                    raise FrameRejected(
                        "malformed",
                        f"{peer}: AVERAGE of {values.size} {values.dtype} values, expected "
                        f"{self._size} {ctl._params.dtype}",
                    )
                if not (minibatches and isinstance(score, (int, float)) and not isinstance(score, bool)):
                    raise FrameRejected("malformed", f"{peer}: AVERAGE values without minibatches or score")
                if not all_finite(values):
                    raise FrameRejected(
                        "non_finite", f"{peer}: AVERAGE of round {key} holds non-finite values"
                    )
            elif minibatches:
                raise FrameRejected("malformed", f"{peer}: {minibatches} minibatches but no AVERAGE values")
            reports = self.rounds.get(key, {})
            if key in self._averaged or partition in reports:
                raise FrameRejected("malformed", f"{peer}: partition {partition} reported round {key} twice")
        except FrameRejected as exc:
            ctl._refuse(identity, sender, exc)
            return
        reports = self.rounds.setdefault(key, reports)
        reports[partition] = _Contribution(
            sender, identity, None if values is None else values.copy(), minibatches, score
        )
        if len(reports) == ctl._expected_workers:
            self._finish_round(key)

    def _finish_round(self, key: tuple[int, int]) -> None:
        """Every partition reported the round: take the mean and send it to each of the round's workers."""
        ctl = self.controller
        reports = self.rounds.pop(key)
        self._averaged.add(key)
        given = [c for _, c in sorted(reports.items()) if c.values is not None]
        mean: np.ndarray | None = None
        score: float | None = None
        if given:
            total = np.zeros(self._size, np.float64)
            for c in given:  # partition order: the sum does not depend on the order of arrival
                assert c.values is not None  # given holds only the contributions with values
                total += c.values
            mean = (total / len(given)).astype(ctl._params.dtype)
            score = finite_mean(
                [float(c.score) for c in given if c.score is not None]
            )  # a worker's 1.7e308 cannot make it inf
            size = self._ranges.size
            with ctl._lock:
                ctl._params[:] = self._ranges.put_back(mean[:size], ctl._params)
                if self._with_state:
                    ctl._updater_state[:] = mean[size:]  # type: ignore[index]
        ctl.iteration += max(c.minibatches for c in reports.values())
        if score is not None:
            ctl.round_scores.append((key[0], ctl.iteration, score))
        ctl.epoch = max(ctl.epoch, key[0])
        ctl.rounds_averaged += 1
        body = {"iteration": ctl.iteration, "workers": len(given), "score": score}
        payload = averaging_payload(body, mean)
        for c in reports.values():
            if ctl._peers.get(c.worker) != c.identity:  # left meanwhile (its task failed): the fit fails
                continue
            frame = ctl._signed_frame(
                MessageType.AVERAGED,
                c.worker,
                payload,
                iteration=key[1],
                epoch=key[0],
                flags=float_flag(ctl._params),
            )
            ctl._send(c.identity, frame)
        ctl._round_averaged(key[0], sum(c.minibatches for c in given), score)


__all__ = ["AveragingPolicy", "Policy", "PolicyHost", "SharingPolicy"]
