"""torchrun's Python entry points (``torch.distributed.run``'s ``main``, ``run``, ``parse_args``,
``get_args_parser``) running the job through ``unidist launch``.

``unidist launch`` is a command: an option it refuses exits 2 with one line, a failed job exits
with the culprit's code after its report. Code that drives torchrun from Python instead
(``torch.distributed.run.main(args)``, as torch's own tests and some schedulers do) expects
exceptions: this module gives them, with torchrun's types. Options torchrun refuses after
parsing raise ``ValueError`` (unidist's ``ConfigurationError``, a ``ValueError``, with its
message and hint); argparse's own errors exit 2 as torchrun's do; a job whose ranks failed
raises torch's ``ChildFailedError`` after unidist's failure report is printed. The job itself
is unidist launch's: per-rank logs, culprit and hang reports, the same options.

An exception of torch's agent before any rank started is re-raised as torchrun re-raises it
(``unidist launch`` reports it as a ``LaunchError`` naming it, which stays its context); a
rendezvous that never completed is unidist's ``LaunchError``, whose message says why.
"""

from __future__ import annotations

import argparse
import gc
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from unidist.errors import LaunchError

if TYPE_CHECKING:
    from unidist.launch.plan.job import LaunchPlan
    from unidist.launch.supervise.report import Report

__all__ = ["get_args_parser", "main", "parse_args", "run"]


def get_args_parser() -> argparse.ArgumentParser:
    """The parser of ``unidist launch``: torchrun's options and unidist's own."""
    from unidist.launch.plan.options import CommandParser, add_arguments

    parser = CommandParser(prog="unidist launch")
    add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="show torch's agent logs")
    return parser


def parse_args(args: Sequence[str] | None) -> argparse.Namespace:
    """``args`` (default ``sys.argv[1:]``) parsed as ``unidist launch``'s command line."""
    return get_args_parser().parse_args(list(sys.argv[1:] if args is None else args))


def run(args: argparse.Namespace) -> None:
    """Run the job ``args`` describes (from :func:`parse_args`); return when every rank did.

    Raises:
        ValueError: options torchrun or unidist refuse (``unidist.ConfigurationError``).
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ranks failed.
        unidist.LaunchError: the rendezvous did not complete, or its store was lost.
        Exception: what torch's agent raised before any rank started, as torchrun re-raises it.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from unidist.launch.plan.dryrun import describe
    from unidist.launch.plan.job import plan_from_args
    from unidist.launch.supervise import runner

    plan = plan_from_args(args)
    if args.dry_run:
        print(describe(plan), end="")
        return
    program, argv = runner.script_command(plan)
    try:
        report = _run(plan, program, argv, verbose=bool(getattr(args, "verbose", False)))
    except LaunchError as exc:
        agent_error = exc.__cause__
        if agent_error is None:
            raise  # the rendezvous, or its store lost: unidist's message says which
        # torchrun's launcher re-raises what torch's agent raised (torch's test_run.py
        # test_launch_elastic_agent_raise_exception); unidist's report stays its context.
        exc.__cause__ = None
        raise agent_error  # noqa: B904 (the LaunchError is the context, on purpose)
    summary = report.format()
    if summary:
        print(summary, file=sys.stderr, end="")
    if not report.failed:
        return
    failures = {
        outcome.rank: ProcessFailure(
            local_rank=outcome.local_rank,
            pid=0,  # the rank has exited; unidist's report names it by rank and log
            exitcode=outcome.exit_code if outcome.exit_code else report.exit_code or 1,
            error_file="",
        )
        for outcome in report.outcomes
        if outcome.status != "ok" and not outcome.remote
    }
    if not failures:  # interrupted, or another node's ranks failed: this node's launcher fails
        failures = {
            0: ProcessFailure(local_rank=0, pid=0, exitcode=report.exit_code, error_file="")
        }
    raise ChildFailedError(name=str(args.target), failures=failures)


def _run(plan: LaunchPlan, program: str, argv: list[str], *, verbose: bool) -> Report:
    from unidist.launch.supervise import runner

    with warnings.catch_warnings():
        # torch's agent opens each rank's log files (SubprocessHandler) and closes them only
        # when it kills the rank, so the files of ranks that exited by themselves are left to
        # the garbage collector, with a ResourceWarning each; the command line never sees it
        # (it leaves with os._exit), a caller in Python would. Closed here, quietly.
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            report, _, _ = runner.run(plan, program, argv, verbose=verbose)
        finally:
            gc.collect()
    return report


def main(args: Sequence[str] | None = None) -> None:
    """``torch.distributed.run.main``: parse ``args`` and :func:`run` the job."""
    run(parse_args(args))
