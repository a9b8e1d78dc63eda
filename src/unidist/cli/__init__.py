"""The ``unidist`` command line (also ``python -m unidist``), and the programs it runs.

:mod:`~unidist.cli.diagnostics` is ``unidist config`` and ``unidist probe`` (also
:func:`unidist.show_config` and :func:`unidist.probe`); :mod:`~unidist.cli.smoke` is the program
``unidist smoke`` runs on every rank, written on the public API as a user's script would be.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from unidist.errors import LaunchError, UnidistError
from unidist.launch.leaving import leave_now

if TYPE_CHECKING:
    from unidist.launch.plan.options import CommandParser
    from unidist.launch.supervise.report import Report

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    from unidist._base.version import __version__
    from unidist.launch.plan.options import CommandParser

    parser = argparse.ArgumentParser(
        prog="unidist", description="One API for distributed PyTorch: inspect and launch jobs."
    )
    parser.add_argument("--version", action="version", version=f"unidist {__version__}")
    # Each command's parser reports its own mistakes (its usage, a did-you-mean), not the top one.
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
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
    _add_launch(commands)
    return parser


def _add_launch(commands: argparse._SubParsersAction[CommandParser]) -> None:
    from unidist.launch.plan.options import add_arguments

    launch = commands.add_parser(
        "launch",
        help="run a script on N processes per node (torch's elastic agent)",
        description="Run a training script (or -m module) on several processes and nodes, with "
        "torchrun's rendezvous and restarts, per-rank logs, a console prefixed by rank, and a "
        "report that names the rank that failed. torchrun's and Composer's option spellings "
        "work.",
    )
    add_arguments(launch)
    launch.add_argument("-v", "--verbose", action="store_true", help="show torch's agent logs")
    smoke = commands.add_parser(
        "smoke",
        help="check every collective across N local processes (run before debugging a job)",
        description="Start a tiny job through the launcher that checks each collective across "
        "ranks, through every installed adapter, and prints a pass/fail table with timings.",
    )
    smoke.add_argument("-n", "--nproc", default="2", help="processes (default 2, or 'auto')")
    smoke.add_argument("--backend", default=None, help="gloo, nccl, ... (default: unidist's)")
    smoke.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    report = commands.add_parser(
        "report",
        help="show a run's hang and straggler reports again (hang.json, stragglers.json)",
        description="Render the hang report (hang.json) and the straggler report "
        "(stragglers.json) that unidist launch wrote in a run folder.",
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run folder unidist launch made")


def _launch(args: argparse.Namespace) -> int:
    from unidist.launch.plan.dryrun import describe
    from unidist.launch.plan.job import plan_from_args
    from unidist.launch.supervise import runner

    plan = plan_from_args(args)
    if args.dry_run:
        print(describe(plan), end="")
        return 0
    program, argv = runner.script_command(plan)
    report, _, _ = runner.run(plan, program, argv, verbose=args.verbose)
    _finish(report)
    return report.exit_code  # pragma: no cover (_finish exits)


def _smoke(args: argparse.Namespace) -> int:
    from unidist.launch.plan.job import add_arguments, plan_from_args
    from unidist.launch.plan.options import CommandParser
    from unidist.launch.supervise import runner

    parser = CommandParser(prog="unidist smoke")
    add_arguments(parser)
    extra = ["--backend", args.backend] if args.backend else []
    launch_args = parser.parse_args(
        [
            "-n",
            str(args.nproc),
            "--timeout",
            str(args.timeout),
            "-m",
            "unidist.cli.smoke",
            *extra,
            "--timeout",
            str(args.timeout),
        ]
    )
    plan = plan_from_args(launch_args)
    program, argv = runner.script_command(plan)
    report, _, _ = runner.run(plan, program, argv)
    _finish(report)
    return report.exit_code  # pragma: no cover (_finish exits)


def _report(run_dir: str) -> int:
    from pathlib import Path

    from unidist.errors import ConfigurationError
    from unidist.launch.supervise.hang import render

    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigurationError(
            f"{run_dir!r} is not a folder. HINT: give a run folder of unidist launch (each run "
            "makes one in --log-dir, or in the per-user temp folder; its path is in the report)."
        )
    text = render(folder)
    if not text:
        raise ConfigurationError(
            f"{run_dir!r} holds no hang.json or stragglers.json: the run was not called hung, "
            "or it is not a run folder of unidist launch."
        )
    print(text, end="")
    return 0


def _finish(report: Report) -> None:
    """Print the report and leave with the job's exit code, skipping this process's teardown.

    Every rank has been accounted for and its logs are written; tearing down torch here would
    only delay the exit code that schedulers and scripts wait for.
    """
    summary = report.format()  # a failure, or a success after restarts; nothing otherwise
    if summary:
        print(summary, file=sys.stderr, end="")
    leave_now(report.exit_code)


def run() -> NoReturn:
    """The ``unidist`` command's process: :func:`main`, then leave with its exit status.

    A launch that ended by a :class:`~unidist.errors.LaunchError` (the rendezvous store lost,
    torch's agent broke) returns here, where :func:`_finish` would have left: a daemon thread
    may still be inside torch's store client, whose connect cannot be interrupted
    (``unidist.session.link.connect_within``). On Python 3.13 and older, interpreter finalization
    ends such a thread with ``pthread_exit`` when it next takes the GIL; unwinding through
    torch's C++ frames then aborts the process (SIGABRT, "terminate called without an active
    exception"; CPython gh-87135, whose threads hang instead from 3.14), and the status is lost
    (a launcher whose rendezvous host left is one such case). With a daemon thread alive the
    process leaves as :func:`_finish` does: streams flushed, no teardown.
    """
    import threading

    code = main()
    if any(thread.daemon and thread.is_alive() for thread in threading.enumerate()):
        leave_now(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command in ("config", "probe"):
            from unidist.cli import diagnostics

            show = diagnostics.show_config if args.command == "config" else diagnostics.show_probe
            show(as_json=args.json)
            return 0
        if args.command == "launch":
            return _launch(args)
        if args.command == "smoke":
            return _smoke(args)
        if args.command == "report":
            return _report(args.run_dir)
    except LaunchError as exc:  # the job could not start (a rendezvous that never completed)
        print(exc.report, file=sys.stderr, end="")
        return exc.exit_code
    except UnidistError as exc:
        print(f"unidist {args.command}: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2  # pragma: no cover (parser.error exits)
