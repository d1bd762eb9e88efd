"""Where a gradient-sharing worker's step goes at 17M parameters, and a peer's sparse message applied the
old way (decoded into a zeroed scratch of the parameters' size, then ``apply_update``) against the new
(``apply_message``: ``subtract_message`` straight into the parameters), side by side in one process
(issue 39).

Model: bench_workloads.py's click-through graph (two lazy-Adam embedding tables of ``--vocab`` rows,
float32), batches of 64 of its data. The handler is SharedTrainingMaster's default (target-sparsity
threshold algorithm starting at its target, no residual post-processing) but measures every message
against N (``written_cap=False``), so that the old path, which knows no support, sends the same messages
as the new; ``--warmup`` steps bring the
threshold to its level first, so the messages are the sizes the workload's workers send. Per step it
times: ``compute_update``; the handler's passes over the flat vector (the residual add, the sparse/bitmap
count and encode) on a copy of the residual, the count and encode also with the residual's block bounds
(reading only the blocks that reach the threshold, as a handler fed a step's support does; checked to
leave the same residual); the worker's own step as ``share_update`` took it (the residual add over the
whole vector, then the message decoded into a zeroed scratch) and takes it now (the add at the step's
``update_support``, its blocks' bounds refreshed, the bounded count, no decode), two handlers fed the
same updates; and the step's
message applied to two replicas as a peer's, old path and new; and the driver's controller taking the
message (``SharingPolicy.take`` on two live controllers, no worker connected: the checks, the apply and
the ledger) the old way (dense passes: the scratch zeroed, the message decoded into it, the parameters
minus it into a second buffer, that checked finite, the buffers swapped; what the policy still does with
a decoder other than the default, so one controller is given a wrapper of it) against the new (the
message subtracted in place in O(entries), the touched parameters checked finite). It checks after each
step that the two handlers' messages, the two replicas and the two controllers' parameters are
bit-identical.

Prints the median and minimum ms of each over ``--steps`` steps and the old / new ratios (medians). On a
shared machine the minimum is the better estimate of the work.

    PYTHONPATH=python python bench/python/bench_sparse_sharing.py [--vocab 1000000] [--steps 30] \
        [--warmup 40]

The controller's take of one worker's message, ``nice -n 19`` on the shared 2-core machine, vocab 1M
(17M parameters), 30 steps after 40 of warm-up (results in bench/results/sparse_sharing/):

    controller message, old: take, dense passes    median   19.887 ms   min   15.189 ms
    controller message, new: take, in place        median    0.250 ms   min    0.194 ms
    controller message old / new: x79.5 (medians), x78.4 (minimums)

(messages of 385 to 2,353 entries, median 1,341). With 8 workers the old path cost the controller about
8 x 15 ms of memory traffic per fit step; the new about 8 x 0.2 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
from bench_workloads import ctr_conf, ctr_data

from sparkgrad import _core
from sparkgrad.compress import (
    EncodingHandler,
    NoOpResidualPostProcessor,
    apply_message,
    decode,
    decode_message_into,
    default_threshold_algorithm,
)
from sparkgrad.data import DataSet
from sparkgrad.nn import ComputationGraph
from sparkgrad.transport import Controller
from sparkgrad.transport.frame import Flag, Header, MessageType


def _batches(vocab: int, steps: int) -> list[DataSet]:
    rows, labels = ctr_data(np.random.default_rng(0), 64 * steps, vocab)
    x = np.asarray(rows, dtype=np.float32)[:, None, :]  # (rows, 1 channel, FIELDS steps)
    y = np.eye(2, dtype=np.float32)[labels.astype(int)]
    return [DataSet(x[i : i + 64], y[i : i + 64]) for i in range(0, len(x), 64)]


def _ms(start: float) -> float:
    return 1000 * (time.perf_counter() - start)


def _controller(params: np.ndarray, dense: bool) -> Controller:
    """A live controller on a free local port (no worker joins); ``dense``: given a wrapper of the default
    decoder, which keeps the dense passes."""
    return Controller(
        params,
        0x39,
        bytes(range(32)),
        "127.0.0.1",
        0,
        decode=(lambda m, t: decode(m, t)) if dense else None,
        threshold_reference=1.0,
    )


def _take_ms(ctl: Controller, message: np.ndarray, step: int) -> float:
    """The controller's take of worker 1's UPDATE, as its socket loop calls it once the frame is admitted."""
    payload = memoryview(message.astype("<i4").tobytes())
    header = Header(MessageType.UPDATE, Flag.AUTHENTICATED, 0x39, 1, step, 0, step, payload.nbytes)
    applied = ctl.updates_applied
    start = time.perf_counter()
    ctl._policy.take(b"worker-1", header, payload, b"")
    ms = _ms(start)
    if ctl.updates_applied != applied + 1:
        raise AssertionError(f"step {step}: the controller did not apply the message: {ctl.counters}")
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=40)
    args = parser.parse_args()
    worker, old, new = (ComputationGraph(ctr_conf(args.vocab)).init() for _ in range(3))
    n = worker.num_params()
    # the default algorithm without written_cap: the old path gives its handler no support, so only the
    # measure against N sends the same messages from both
    uncapped = dataclasses.replace(default_threshold_algorithm(), written_cap=False)
    handler_old, handler_new = (
        EncodingHandler(n, uncapped, NoOpResidualPostProcessor(), dtype="float32", update_scale=1.0)
        for _ in range(2)
    )
    scratch_own, scratch_old, scratch_new = (np.zeros(n, np.float32) for _ in range(3))
    ctl_old, ctl_new = (_controller(worker.params(), dense) for dense in (True, False))
    times: dict[str, list[float]] = {}
    entries: list[int] = []
    for step, batch in enumerate(_batches(args.vocab, args.warmup + args.steps)):
        timed = step >= args.warmup
        start = time.perf_counter()
        update, _ = worker.compute_update(batch, copy=False)
        compute = _ms(start)
        it, ep = int(worker.iteration_count), int(worker.epoch_count)
        if timed:  # the handler's passes, on a copy of its residual (at the threshold it will choose)
            threshold = float(handler_old.threshold_algorithm.last_threshold)
            residual = np.array(handler_old.residual)
            start = time.perf_counter()
            _core.accumulate(residual, update)
            add = _ms(start)
            bounded = residual.copy()  # the same residual with its exact block bounds, as support steps keep
            bounds = np.empty(_core.bounds_length(n), residual.dtype)
            _core.residual_bounds(bounded, bounds)
            start = time.perf_counter()
            _core.encode_smaller(residual, threshold)
            encode = _ms(start)
            start = time.perf_counter()
            _core.encode_smaller(bounded, threshold, bounds)
            encode_bounded = _ms(start)
            if residual.tobytes() != bounded.tobytes():
                raise AssertionError(f"step {step}: the bounded encode left another residual")
        # the worker's own step, encoding and its own message's decode: as share_update did, and does now
        start = time.perf_counter()
        message = handler_old.encode(update, it, ep)
        if message is not None:
            decode_message_into(message, scratch_own)
        own_old = _ms(start)
        start = time.perf_counter()
        sent = handler_new.encode(update, it, ep, support=worker.update_support(update))
        own_new = _ms(start)
        if (message is None) != (sent is None) or (
            message is not None and message.tobytes() != sent.tobytes()
        ):
            raise AssertionError(f"step {step}: the handlers' messages differ")
        worker.apply_update(update)
        if message is None:
            continue
        # the message applied as a peer's, old path and new
        start = time.perf_counter()
        decode_message_into(message, scratch_old)
        old.apply_update(scratch_old)
        old_ms = _ms(start)
        start = time.perf_counter()
        apply_message(message, new, scratch_new)
        new_ms = _ms(start)
        if old.params().tobytes() != new.params().tobytes():
            raise AssertionError(f"step {step}: the replicas differ after the peer's message")
        # the message taken by the driver's controller, old path and new
        take_old, take_new = _take_ms(ctl_old, message, step), _take_ms(ctl_new, message, step)
        if not np.array_equal(ctl_old._params.view(np.uint32), ctl_new._params.view(np.uint32)):
            raise AssertionError(f"step {step}: the controllers' parameters differ")
        if not timed:
            continue
        entries.append(int(message[0]) if message[3] == 0 else -1)
        for key, value in (
            ("compute_update", compute),
            ("  pass: residual add (accumulate, whole vector)", add),
            ("  pass: count + encode, whole residual (encode_smaller)", encode),
            ("  pass: count + encode, blocks reaching the threshold", encode_bounded),
            ("own message, old: encode + decode into scratch", own_old),
            ("own message, new: encode at the support, no decode", own_new),
            ("peer message, old: decode_message_into + apply_update", old_ms),
            ("peer message, new: apply_message", new_ms),
            ("controller message, old: take, dense passes", take_old),
            ("controller message, new: take, in place", take_new),
        ):
            times.setdefault(key, []).append(value)
    print(
        f"vocab {args.vocab:,}: {n:,} parameters, {len(entries)} timed steps, message entries median "
        f"{int(statistics.median(entries)):,} (min {min(entries):,}, max {max(entries):,}; -1: a bitmap); "
        "messages, replicas and controllers' parameters bit-identical, old and new, after every step"
    )
    for key, values in times.items():
        print(f"  {key:56s} median {statistics.median(values):8.3f} ms   min {min(values):8.3f} ms")
    for ctl in (ctl_old, ctl_new):
        ctl.close()
    for what in ("own", "peer", "controller"):
        old_key, new_key = (
            next(k for k in times if k.startswith(f"{what} message, {v}")) for v in ("old", "new")
        )
        ratio = statistics.median(times[old_key]) / statistics.median(times[new_key])
        low = min(times[old_key]) / min(times[new_key])
        print(f"  {what} message old / new: x{ratio:,.1f} (medians), x{low:,.1f} (minimums)")


if __name__ == "__main__":
    main()
