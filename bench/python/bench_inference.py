"""Inference time of a conv + batch-norm + relu network with the batch norm folded into the convolutions
(``fold_batch_norm``, the default) against the layer-by-layer path, side by side in the same run.

Network (MultiLayerNetwork, float32, 3x3 "same" convolutions without activation, each followed by
BatchNormalization and ActivationLayer("relu"); batch norms with non-trivial running statistics):
  28x28x1 -> [conv 16, bn, relu] x2 -> maxpool 2 -> [conv 32, bn, relu] x2 -> maxpool 2 -> softmax 10

Prints, per batch size, the median and minimum wall time and the minimum process CPU time (all threads)
of ``output(x)`` in ms for both paths and the ratio folded / unfused. Rounds alternate between the two
so that machine load hits both; on a shared machine the CPU-time minimum estimates the unloaded speed.

    PYTHONPATH=python python bench/python/bench_inference.py [--threads N] [--rounds 7] [--calls 10] \
        [--batches 64,256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import sparkgrad
from sparkgrad.nn import (
    ActivationLayer,
    BatchNormalization,
    ConvolutionLayer,
    InputType,
    MultiLayerConfiguration,
    MultiLayerNetwork,
    OutputLayer,
    SubsamplingLayer,
)


def _network() -> MultiLayerNetwork:
    layers: list = []
    for channels in (16, 16, None, 32, 32, None):
        if channels is None:
            layers.append(SubsamplingLayer("max", kernel_size=(2, 2), stride=(2, 2)))
            continue
        same = {"kernel_size": (3, 3), "convolution_mode": "same", "activation": "identity"}
        layers += [ConvolutionLayer(channels, **same), BatchNormalization(), ActivationLayer("relu")]
    layers.append(OutputLayer(10))
    conf = MultiLayerConfiguration(layers, input_type=InputType.convolutional(28, 28, 1), seed=0)
    net = MultiLayerNetwork(conf).init()
    rng = np.random.default_rng(1)
    offset, flat = 0, net.params()
    for layer, input_type in zip(conf.layers, conf.layer_input_types):
        for spec in layer.param_specs(input_type):
            size = int(np.prod(spec.shape))
            if spec.role in ("gamma", "var"):  # trained-looking statistics: the fold changes the numbers
                flat[offset : offset + size] = rng.uniform(0.5, 2.0, size)
            elif spec.role in ("beta", "mean"):
                flat[offset : offset + size] = rng.normal(0, 0.5, size)
            offset += size
    return net


def _time(net: MultiLayerNetwork, x: np.ndarray, calls: int) -> tuple[float, float]:
    """(wall, process CPU) ms per ``output`` call."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        net.output(x)
    return (time.perf_counter() - wall) / calls * 1e3, (time.process_time() - cpu) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=sparkgrad.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7, help="alternating timed rounds")
    parser.add_argument("--calls", type=int, default=10, help="output() calls per timed round")
    parser.add_argument("--batches", default="64,256")
    args = parser.parse_args()
    sparkgrad.set_num_threads(args.threads)
    print(f"threads={args.threads} sparkgrad={sparkgrad.__version__}")
    net = _network()
    rng = np.random.default_rng(0)
    for batch in map(int, args.batches.split(",")):
        x = rng.random((batch, 1, 28, 28), dtype=np.float32)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        outputs = {}
        for fold in (True, False):  # warm-up (buffers) and the outputs compared below
            net.fold_batch_norm = fold
            outputs[fold] = net.output(x)
        for _ in range(args.rounds):
            for fold in (True, False):
                net.fold_batch_norm = fold
                times[fold].append(_time(net, x, args.calls))
        diff = float(np.abs(outputs[True] - outputs[False]).max())
        for label, pick, stat in (("median", 0, statistics.median), ("min", 0, min), ("cpu min", 1, min)):
            folded, unfused = (stat(t[pick] for t in times[f]) for f in (True, False))
            print(
                f"batch={batch:4d} {label:7s} folded {folded:8.2f} ms  unfused {unfused:8.2f} ms  "
                f"ratio {folded / unfused:5.2f}x  (max |output difference| {diff:.1e})"
            )


if __name__ == "__main__":
    main()
