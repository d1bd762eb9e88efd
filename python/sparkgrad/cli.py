"""The ``sparkgrad`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

_DESCRIPTION = (
    "sparkgrad: neural networks trained on Apache Spark with parameter averaging or "
    "threshold-encoded gradient sharing."
)


def _cmd_info(_args: argparse.Namespace) -> int:
    import sparkgrad
    from sparkgrad import cuda

    for key, value in sparkgrad.info().items():
        print(f"{key:15s} {value}")
    for line in cuda.summary():
        print(line)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from sparkgrad.errors import EnvironmentNotReadyError
    from sparkgrad.spark.demo import run_demo

    try:
        result = run_demo(args.output, epochs=args.epochs, port=args.port, remote=args.remote)
    except EnvironmentNotReadyError as exc:
        print(f"sparkgrad demo: {exc}", file=sys.stderr)
        return 2
    print(
        f"test accuracy     {result.accuracy:.4f} after {result.epochs} epochs ({result.steps} worker steps)"
    )
    print(
        f"bytes sent        {result.bytes_sent:,} (dense float32 exchange of the same steps: "
        f"{result.dense_bytes:,}, {result.dense_bytes / max(result.bytes_sent, 1):.0f}x more)"
    )
    print(f"wall time         {result.wall_s:.1f} s (including Spark start-up)")
    print(f"model             {result.model_path}")
    print(f"training stats    {result.stats_path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import sparkgrad

    parser = argparse.ArgumentParser(prog="sparkgrad", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"sparkgrad {sparkgrad.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print version, OpenMP threads, BLAS and CUDA availability")
    info.set_defaults(func=_cmd_info)
    demo = sub.add_parser(
        "demo",
        help="train a small CNN on the digits data with SharedTrainingMaster on a local Spark (local[2])",
    )
    demo.add_argument(
        "--output", default="sparkgrad-demo", help="directory for model.zip and training-stats.html"
    )
    demo.add_argument("--epochs", type=int, default=6, help="passes over the training data (default 6)")
    demo.add_argument(
        "--port", type=int, default=0, help="controller port on 127.0.0.1 (default 0: a free port)"
    )
    demo.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="train on a Spark Connect server (sc://host:port) instead of a local Spark; its Python "
        "workers need sparkgrad installed",
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
