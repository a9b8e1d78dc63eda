"""The ``unidist`` command line (also ``python -m unidist``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from unidist.errors import UnidistError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from unidist._version import __version__

    parser = argparse.ArgumentParser(
        prog="unidist", description="One API for distributed PyTorch: inspect and launch jobs."
    )
    parser.add_argument("--version", action="version", version=f"unidist {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    config = commands.add_parser(
        "config",
        help="show the detected launcher, topology, adapter and backends",
        description="Show what unidist detects in this process. Starts no process group.",
    )
    config.add_argument("--json", action="store_true", help="print JSON for scripts")
    probe = commands.add_parser(
        "probe",
        help="show devices, drivers, backends and the device unidist would use",
        description="Report torch's build, CUDA (driver, devices, memory), MPS and other "
        "accelerators, process-group backends, installed adapters, the launcher and topology, "
        "and the device and backend unidist would pick. Starts no training and no process group.",
    )
    probe.add_argument("--json", action="store_true", help="print JSON for scripts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "config":
            from unidist.config import show_config

            show_config(as_json=args.json)
            return 0
        if args.command == "probe":
            from unidist.hardware import show_probe

            show_probe(as_json=args.json)
            return 0
    except UnidistError as exc:
        print(f"unidist {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2  # pragma: no cover (parser.error exits)
