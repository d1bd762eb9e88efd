"""What CURVE encryption of the controller's connections costs (``ZmqTransportConfiguration.encrypt``).

Usage: PYTHONPATH=python:tests/distributed python bench/python/bench_encryption.py [--params 1048576]
       [--updates 200] [--reps 3]

One worker sends ``--updates`` bitmap UPDATEs (every parameter encoded: the largest message of the
vector, ``params / 16 + 5`` int32 words) to a live controller on 127.0.0.1 and waits for its SYNC_ACK,
in the clear and encrypted, alternately ``--reps`` times. Prints one line per mode: the best wall time,
updates per second, MB/s of UPDATE payload, and the encrypted/clear time ratio measured in the same run.
The controller applies every update (decode, finiteness check), so the ratio is of the whole path.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from wire_helpers import FAST, REFERENCE, SECRET, controller

from sparkgrad import compress
from sparkgrad.transport import WorkerConnection


def run(port: int, job: int, n: int, updates: int, encrypt: bool) -> float:
    config = dataclasses.replace(FAST, encrypt=encrypt, sync_timeout_ms=120_000)
    message, _ = compress.bitmap_encode(np.full(n, 0.5, np.float32), REFERENCE / 4)
    with controller(np.zeros(n, np.float32), job, port, config=config, decode=compress.decode) as ctl:
        conn = WorkerConnection(
            "127.0.0.1",
            port,
            job,
            1,
            SECRET,
            n,
            config,
            controller_key=ctl.controller_key,
            threshold_reference=REFERENCE,
            curve_key=ctl.curve_key,
        )
        try:
            conn.hello({})
            start = time.perf_counter()
            for k in range(updates):
                conn.send_update(message, k + 1, 0)
            conn.sync(lambda h, m: None)
            elapsed = time.perf_counter() - start
        finally:
            conn.close()
        assert ctl.updates_applied == updates
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=1 << 20)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--port", type=int, default=47_374)
    args = parser.parse_args()
    payload_mb = 4 * (args.params // 16 + 5) * args.updates / 1e6
    best = {False: float("inf"), True: float("inf")}
    job = 0
    for _ in range(args.reps):
        for encrypt in (False, True):
            job += 1
            best[encrypt] = min(best[encrypt], run(args.port, job, args.params, args.updates, encrypt))
    for encrypt in (False, True):
        t, mode = best[encrypt], "encrypted" if encrypt else "clear"
        print(
            f"{mode:>9}: {args.updates} updates of {args.params} parameters in {t:.3f} s, "
            f"{args.updates / t:,.0f} updates/s, {payload_mb / t:,.1f} MB/s payload"
            + (f", {t / best[False]:.2f}x the clear time" if encrypt else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
