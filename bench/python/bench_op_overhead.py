"""Per-call cost of a kernel's front door: the time from Python to the kernel's launch (argument checks,
dispatch, stream), measured on arrays so small that the kernel itself costs nearly nothing.

For each op the device's kernel namespace is called ``--calls`` times in a loop on tiny arrays and the
wall time per call is printed (median and minimum over ``--rounds``); on a GPU the loop ends with one
device synchronisation, so the figure is the host's cost per launch while the GPU keeps up. Run it against
two builds of sparkgrad (PYTHONPATH=<site> for each) to compare their front doors on the same machine:

    PYTHONPATH=python python bench/python/bench_op_overhead.py [--device cpu|cuda] [--calls 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

import sparkgrad
from sparkgrad.device import resolve_device


def _ops(device: Any) -> dict[str, Callable[[], None]]:
    k, xp = device.kernels, device.xp
    with device.scope():
        x = xp.asarray(np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(4, 8))
        b = xp.zeros(8, dtype=np.float32)
        y, dy, dx = xp.empty_like(x), xp.ones_like(x), xp.empty_like(x)
        w = xp.ones((8, 8), dtype=np.float32)
        out = xp.empty((4, 8), dtype=np.float32)
        grad, state = xp.ones(64, dtype=np.float32), xp.zeros(128, dtype=np.float32)
    return {
        "bias_add": lambda: k.bias_add(x, b),
        "activation_forward": lambda: k.activation_forward("relu", x, y),
        "activation_backward": lambda: k.activation_backward("relu", x, y, dy, dx),
        "gemm": lambda: k.gemm(x, w, out=out),
        "updater_apply(adam)": lambda: k.updater_apply("adam", grad, state, 1, 1e-3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = resolve_device(args.device)
    sync = (
        (lambda: device.xp.cuda.get_current_stream().synchronize())
        if device.name != "cpu"
        else (lambda: None)
    )
    print(f"bench_op_overhead: device={device.name} sparkgrad={sparkgrad.__file__} calls={args.calls}")
    with device.scope():
        for name, call in _ops(device).items():
            call()
            sync()
            per_call = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                for _ in range(args.calls):
                    call()
                sync()
                per_call.append((time.perf_counter() - start) / args.calls)
            print(
                f"{name:<22} median {statistics.median(per_call) * 1e6:7.2f} us/call  "
                f"min {min(per_call) * 1e6:7.2f} us/call"
            )


if __name__ == "__main__":
    main()
