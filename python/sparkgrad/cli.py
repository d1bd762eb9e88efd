"""The ``sparkgrad`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _cmd_info(_args: argparse.Namespace) -> int:
    import sparkgrad

    for key, value in sparkgrad.info().items():
        print(f"{key:15s} {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkgrad", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="print version, OpenMP threads, BLAS and CUDA availability")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
