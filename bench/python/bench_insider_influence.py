"""How far one compromised executor (it holds the fit's secret) moves a parameter in 100 updates.

Usage: PYTHONPATH=python:tests/distributed python bench/python/bench_insider_influence.py [--steps 100]

A live controller on 127.0.0.1 with 10,000 float32 parameters and reference threshold 1e-3; three honest
workers each send, per step, one update of 100 distinct random indices (never index 0) at the reference
threshold. The insider sends one update per step aimed at parameter 0, with one of several strategies:
``repeat``: index 0 repeated 10,000 times at the largest float32 threshold the fixed bound (2**20 x the
reference) allows; ``max``: index 0 once at that threshold; ``max/x8``: ``max`` until one is refused,
then ``x8``; ``x<m>``: index 0 once at m x the reference; ``x16/x1``: 16x and 1x alternately;
``ahead/x<m>``: nine updates of index 0 at the reference first, every step (a count lead, which widens
the bound by the threshold algorithm's step growth, ``--growth``, per update ahead), then one at m x the
reference. The controller's ``threshold_growth`` is ``--growth``, by default the default threshold
algorithm's, as a SharedTrainingMaster fit sets it. A refused
update fails an honest worker's fit; the insider ignores that and goes on (told to re-join, it
re-joins). Prints one line per strategy:
parameter 0's displacement after the steps (absolute and in reference thresholds), the insider's
applied, refused and quarantined updates, and the honest workers' largest displacement of one parameter
over the same steps for comparison. Runs against whatever ``sparkgrad`` is on the path, so the same
script measures the code before and after a change.
"""

from __future__ import annotations

import argparse

import numpy as np
from wire_helpers import CONTROLLER_KEY, CURVE_KEY, SECRET, controller, sparse_message

from sparkgrad.compress import default_threshold_algorithm
from sparkgrad.errors import TransportError
from sparkgrad.transport import RejoinRequired, WorkerConnection, ZmqTransportConfiguration

N = 10_000
REFERENCE = 1e-3
CONFIG = ZmqTransportConfiguration(connect_timeout_ms=5000, sync_timeout_ms=10000, poll_interval_ms=10)


def _connect(port: int, job: int, wid: int) -> WorkerConnection:
    conn = WorkerConnection(
        "127.0.0.1",
        port,
        job,
        wid,
        SECRET,
        N,
        CONFIG,
        controller_key=CONTROLLER_KEY,
        curve_key=CURVE_KEY,
        threshold_reference=REFERENCE,
    )
    conn.hello({})
    return conn


def run(port: int, job: int, strategy: str, steps: int, growth: float) -> tuple[float, float, int, int, int]:
    rng = np.random.default_rng(0)
    ctl = controller(
        np.zeros(N, np.float32),
        job,
        port,
        config=CONFIG,
        threshold_reference=REFERENCE,
        threshold_growth=growth,
    )
    honest = [_connect(port, job, wid) for wid in (1, 2, 3)]
    insider = _connect(port, job, 9)
    applied = refused = 0
    # "ahead/<aim>": a lead of nine updates at the reference every step (counted as applied or refused)
    aim = strategy.removeprefix("ahead/")
    lead = [sparse_message([0], [-1], N, REFERENCE)] * (9 if aim != strategy else 0)
    try:
        for step in range(1, steps + 1):
            for conn in honest:
                indices = sorted(rng.choice(np.arange(1, N), 100, replace=False).tolist())
                signs = rng.choice([-1, 1], 100).tolist()
                conn.send_update(sparse_message(indices, signs, N, REFERENCE), step, 0)
            top = float(np.nextafter(np.float32(2**20 * REFERENCE), np.float32(0)))  # float32 <= the bound
            if aim == "repeat":
                message = sparse_message([0] * N, [-1] * N, N, top)
            elif aim == "max" or (aim == "max/x8" and not refused):
                message = sparse_message([0], [-1], N, top)
            elif aim == "max/x8":  # the largest step while it passes, then the quarantine edge
                message = sparse_message([0], [-1], N, 8 * REFERENCE)
            elif aim == "x16/x1":  # spikes between small steps: the moving average stays lower
                message = sparse_message([0], [-1], N, (16.0 if step % 2 else 1.0) * REFERENCE)
            else:
                message = sparse_message([0], [-1], N, float(aim[1:]) * REFERENCE)
            for sent in [*lead, message]:
                try:
                    insider.send_update(sent, step, 0)
                    insider.sync(lambda h, m: None)
                    applied += 1
                except RejoinRequired:  # quarantined: it re-joins and goes on
                    refused += 1
                    insider.hello({})
                except TransportError:  # refused: an honest worker's fit would fail, the insider goes on
                    refused += 1
        for conn in honest:
            conn.sync(lambda h, m: None)
        params = ctl.params()
        quarantined = ctl.counters.dropped_reasons.get("quarantined", 0)
        return float(abs(params[0])), float(np.abs(params[1:]).max()), applied, refused, quarantined
    finally:
        for conn in [*honest, insider]:
            conn.close()
        ctl.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--port", type=int, default=47_373)
    parser.add_argument("--growth", type=float, default=default_threshold_algorithm().max_step_growth())
    args = parser.parse_args()
    print(f"threshold_growth {args.growth:.6g}", flush=True)
    strategies = ["repeat", "max", "max/x8", "x1024", "x16", "x16/x1", "x8", "x1"]
    strategies += ["ahead/x1", "ahead/x8", "ahead/x16", "ahead/x128", "ahead/x1024"]
    for job, strategy in enumerate(strategies, start=1):
        moved, honest, applied, refused, quarantined = run(args.port, job, strategy, args.steps, args.growth)
        print(
            f"{strategy:>9}: parameter 0 moved {moved:.6g} ({moved / REFERENCE:,.0f} x reference) in "
            f"{args.steps} steps; insider applied {applied}, refused {refused}, quarantined {quarantined}; "
            f"honest workers' largest move {honest:.6g} ({honest / REFERENCE:,.0f} x reference)",
            flush=True,
        )


if __name__ == "__main__":
    main()
