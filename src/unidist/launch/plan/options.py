"""``unidist launch``'s command line: unidist's options, torchrun's and Composer's spellings.

Every option torchrun has (torch 2.7 to the newest) is either accepted with torchrun's meaning or
refused with a message that names unidist's equivalent (:data:`REFUSED`); Composer's launcher
spellings (``--world_size``, ``--base_rank``, ``--module_mode``, ``--command_mode``) work too.
As under torchrun, an option torchrun reads from ``PET_<OPTION>`` (``PET_NPROC_PER_NODE``,
``PET_MASTER_PORT``, ...) takes its default from that variable, and the console prefix from
``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``; the command line wins.
A mistake prints ``unidist launch``'s usage (not the top-level one) and, for a mistyped option,
the closest real one (``--nprocs`` -> ``--nproc``).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

__all__ = [
    "LOG_LINE_PREFIX",
    "PET_NEWER_OPTIONS",
    "PET_OPTIONS",
    "PET_REFUSED",
    "REFUSED",
    "CommandParser",
    "InvalidVariable",
    "add_arguments",
    "from_variable",
    "suggest",
    "torchrun_env_defaults",
]

#: torchrun options unidist does not take, and what to use instead.
REFUSED = {
    "--duplicate-stdout-filters": "every rank's whole output is kept in its log file (the report "
    "prints the paths): filter it there, e.g. grep PATTERN <log dir>/*/rank*.stdout.log",
    "--duplicate-stderr-filters": "every rank's whole output is kept in its log file (the report "
    "prints the paths): filter it there, e.g. grep PATTERN <log dir>/*/rank*.stderr.log",
    "--print-completion": "unidist launch has no completion script; torchrun's options are "
    "accepted under the same names, so torchrun's completion does not apply either",
}


class CommandParser(argparse.ArgumentParser):
    """An argument parser whose errors show this command's usage and suggest a correction.

    argparse hands options that a sub-command does not know up to the top-level parser, which
    prints ``usage: unidist [-h] [--version] COMMAND ...``; this parser refuses them itself.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}{suggest(message, self._known())}\n")

    def _known(self) -> list[str]:
        return [option for option in self._option_string_actions if option.startswith("--")]


def suggest(message: str, known: Sequence[str]) -> str:
    """``" (did you mean --nproc?)"`` for the first unknown option named in ``message``."""
    for word in message.replace(",", " ").split():
        if word.startswith("-") and word.split("=", 1)[0] not in known:
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


class _Refuse(argparse.Action):
    """An option torchrun has and unidist does not: a clear error naming the equivalent."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"{option_string} is torchrun's; unidist launch does not take it. HINT: "
            f"{REFUSED[self.option_strings[0]]}."
        )


def _both(name: str) -> tuple[str, str]:
    """torchrun accepts ``--a-b`` and ``--a_b`` for every option."""
    return name, name.replace("-", "_").replace("__", "--", 1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``unidist launch`` option to ``parser``."""
    _sizing(parser)
    _rendezvous(parser)
    _agent(parser)
    _logs(parser)
    _program(parser)
    for option in REFUSED:
        parser.add_argument(*_both(option), action=_Refuse, dest=f"refused_{option[2:]}")
    parser.add_argument("target", help="the training script (or module, with -m)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.set_defaults(**torchrun_env_defaults())


#: torchrun's options that it also reads from ``PET_<DEST>`` (dest -> a flag?), torch 2.7 on.
PET_OPTIONS = {
    "nnodes": False,
    "nproc_per_node": False,
    "rdzv_backend": False,
    "rdzv_endpoint": False,
    "rdzv_id": False,
    "rdzv_conf": False,
    "standalone": True,
    "max_restarts": False,
    "monitor_interval": False,
    "start_method": False,
    "role": False,
    "module": True,
    "no_python": True,
    "run_path": True,
    "log_dir": False,
    "redirects": False,
    "tee": False,
    "local_ranks_filter": False,
    "node_rank": False,
    "master_addr": False,
    "master_port": False,
    "local_addr": False,
}
#: The ``PET_`` variables that newer torchrun releases read too (torch 2.14 reads all of them).
#: Where the installed torch has the setting they apply as under its torchrun; where it has not,
#: its torchrun ignores them and so does ``unidist launch``, saying so in the plan's notes.
PET_NEWER_OPTIONS = {
    "signals_to_handle": False,
    "event_log_handler": False,
    "shutdown_timeout": False,
    "virtual_local_rank": True,
    "log_line_prefix_template": False,
}
#: ``PET_`` variables of options that ``unidist launch`` refuses (see :data:`REFUSED`).
PET_REFUSED = ("duplicate_stdout_filters", "duplicate_stderr_filters")
#: The numbers among them: dest -> (type, what torchrun expects).
_PET_NUMBERS: dict[str, tuple[type, str]] = {
    "max_restarts": (int, "a whole number"),
    "node_rank": (int, "a whole number"),
    "master_port": (int, "a port number"),
    "monitor_interval": (float, "a number of seconds"),
    "shutdown_timeout": (int, "a whole number of seconds"),
}

#: torchrun's variable for the console prefix (``--log-line-prefix-template`` wins over it).
LOG_LINE_PREFIX = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


@dataclasses.dataclass(frozen=True)
class InvalidVariable:
    """The default of an option whose ``PET_`` variable cannot be read: what is wrong with it.

    Not a string, so argparse leaves it unconverted; ``plan_from_args`` refuses it when no
    command-line option replaced it (torchrun, too, fails only then).
    """

    problem: str

    def __str__(self) -> str:
        return self.problem


def _pet_problem(dest: str, flag: bool, value: str) -> str | None:
    name = f"PET_{dest.upper()}"
    if flag and value.strip() not in ("0", "1"):
        return f"{name}={value!r}: torchrun reads a flag's PET_ variable as 0 or 1"
    if dest in _PET_NUMBERS:
        kind, what = _PET_NUMBERS[dest]
        try:
            kind(value)
        except ValueError:
            option = f"--{dest.replace('_', '-')}"
            return f"{name}={value!r} is not {what} (torchrun reads it as {option})"
    if dest in PET_REFUSED:
        option = f"--{dest.replace('_', '-')}"
        return (
            f"{name} sets torchrun's {option}, which unidist launch does not take: "
            f"{REFUSED[option]}"
        )
    return None


def torchrun_env_defaults(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Option defaults from torchrun's variables: ``PET_<OPTION>`` for each option torchrun
    reads from the environment, and ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``.

    As in torchrun, an option on the command line wins over its variable; a flag's variable is
    ``1`` (on) or ``0`` (off). ``pet`` lists the options that have a variable, ``pet_values``
    their values (:func:`from_variable` says whether the command line replaced one). A
    variable that cannot be read (a flag that is neither 0 nor 1, a number that is none) gives
    its option an :class:`InvalidVariable` default, refused by ``plan_from_args`` with the
    variable's name unless the command line set the option.
    """
    env = os.environ if environ is None else environ
    found: dict[str, Any] = {}
    every = {**PET_OPTIONS, **PET_NEWER_OPTIONS, **dict.fromkeys(PET_REFUSED, False)}
    for dest, flag in every.items():
        value = env.get(f"PET_{dest.upper()}")
        if value is None or (not flag and value == ""):
            continue
        problem = _pet_problem(dest, flag, value)
        if problem is not None:
            found[dest] = InvalidVariable(problem)
        else:
            found[dest] = value.strip() == "1" if flag else value
    prefix = env.get(LOG_LINE_PREFIX)
    if prefix and "log_line_prefix_template" not in found:  # torch 2.14: PET_ first
        found["log_line_prefix_template"] = prefix
    read = {d: v for d, v in found.items() if d in every and not isinstance(v, InvalidVariable)}
    found["pet"] = tuple(sorted(read))
    found["pet_values"] = read
    return found


def from_variable(args: argparse.Namespace, dest: str) -> bool:
    """Whether option ``dest`` has the value of its ``PET_`` variable (the command line did not
    give another)."""
    values = getattr(args, "pet_values", {})
    if dest not in values:
        return False
    current, raw = getattr(args, dest, None), values[dest]
    if current == raw:
        return True
    # argparse converts a string default with the option's type: PET_SHUTDOWN_TIMEOUT=7 is the
    # option's 7.0, not the text "7".
    if isinstance(raw, str) and isinstance(current, int | float) and not isinstance(current, bool):
        try:
            return type(current)(raw) == current
        except ValueError:
            return False
    return False


def _sizing(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("processes and nodes")
    add = group.add_argument
    add(
        "-n",
        "--nproc",
        default=None,
        help="processes on this node: a number; 'auto' (one per GPU, else 1); 'gpu'; 'cpu' (one "
        "per CPU core). Default 1; at most 4096, and what the open-file limit (ulimit -n: about "
        "4 files per rank) and the process limits allow, checked before anything starts",
    )
    add(
        *_both("--nproc-per-node"),
        dest="nproc_per_node",
        default=None,
        help="torchrun's spelling, counted by the installed torch's torchrun: a number, 'auto' "
        "(one per device of the accelerator, CUDA only before torch 2.8, else one per CPU "
        "core), 'gpu', 'cpu', 'xpu'",
    )
    add(
        "--nnodes",
        default=None,
        help="nodes in the job (one launcher each): N, or MIN:MAX for an elastic job (needs a "
        "dynamic rendezvous such as --rdzv-backend c10d)",
    )
    add(
        *_both("--node-rank"),
        type=int,
        default=None,
        help="this node's index, for the static rendezvous (--nnodes N without --rdzv-backend)",
    )
    add(*_both("--world-size"), type=int, default=None, help="Composer's: nnodes * nproc")
    add(
        *_both("--base-rank"),
        type=int,
        default=None,
        help="Composer's: global rank of this node's first process (node_rank * nproc)",
    )


def _rendezvous(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rendezvous (as torchrun)")
    add = group.add_argument
    add(
        *_both("--rdzv-backend"),
        default=None,
        help="c10d (nodes find each other at --rdzv-endpoint; node ranks are assigned), static "
        "(--node-rank on each node), etcd or etcd-v2 (needs python-etcd), or a torchrun.handlers "
        "plugin. Default: c10d on one node, static with --node-rank",
    )
    add(*_both("--rdzv-endpoint"), default=None, help="HOST:PORT of the rendezvous store")
    add(
        *_both("--rdzv-id"),
        "--run-id",
        "--run_id",
        dest="rdzv_id",
        default=None,
        help="job id, the same on every node (default 'unidist'; a fresh one on a single node)",
    )
    add(
        *_both("--rdzv-conf"),
        default=None,
        help="rendezvous settings KEY=VALUE,..., e.g. last_call_timeout=5,join_timeout=600",
    )
    add(
        "--standalone",
        action="store_true",
        help="one node, rendezvous on a free local port (torchrun's --standalone)",
    )
    add(*_both("--master-addr"), default=None, help="host of node 0 (static rendezvous)")
    add(
        *_both("--master-port"),
        type=int,
        default=None,
        help="port on node 0 (static rendezvous; default 29500 across nodes, free on one node)",
    )
    add(*_both("--local-addr"), default=None, help="this node's address, as others reach it")


def _agent(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("restarts and stopping")
    add = group.add_argument
    add(
        *_both("--max-restarts"),
        type=int,
        default=0,
        help="restart the local group this many times after a failure (default 0)",
    )
    add(
        *_both("--monitor-interval"),
        type=float,
        default=0.1,
        help="seconds between torch's agent's checks of the ranks (default 0.1)",
    )
    add("--role", default="default", help="the ranks' role name (ROLE_NAME; default 'default')")
    add(
        *_both("--start-method"),
        choices=["spawn", "fork", "forkserver"],
        default=None,
        help="accepted for torchrun's sake: as under torchrun, a script always starts as a new "
        "process",
    )
    add(
        "--timeout",
        type=float,
        default=None,
        help="seconds a collective may wait in the ranks (sets UNIDIST_TIMEOUT)",
    )
    add(
        "--grace",
        type=float,
        default=None,
        help="seconds a stopped rank gets between SIGTERM and SIGKILL (default 3)",
    )
    add(
        *_both("--shutdown-timeout"),
        type=float,
        default=None,
        help="torchrun's name for --grace",
    )
    add(
        "--exit-timeout",
        type=float,
        default=600.0,
        help="once a rank has finished, seconds the others get to finish before they are "
        "reported as hung and killed (default 600; 0 waits for ever)",
    )
    add(
        "--node-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="unidist's: a node silent for SECONDS is taken for gone (the c10d and etcd "
        "rendezvous drop it, the other launchers name it); default 6, torch's keep-alive is "
        "15; rounded to whole seconds (torch's keep-alive counts in them), at least 1. "
        "--rdzv-conf keep_alive_interval/keep_alive_max_attempt take precedence",
    )
    add(
        "--hang-timeout",
        default=None,
        metavar="SECONDS",
        help="when no rank makes progress (collectives, steps, its own code moving) for SECONDS, "
        "report where every rank is and stop the job with exit code 125; 0 turns it off "
        "(default 'auto': ten times the longest silence seen, at least 2 minutes, 5 in the "
        "first 10; also UNIDIST_HANG_TIMEOUT)",
    )
    add(
        "--straggler-report",
        default=None,
        metavar="MINUTES",
        help="report ranks consistently slower than the others every MINUTES as well as at the "
        "end; 'end' (the default): at the end only; 'off': never",
    )
    add(*_both("--signals-to-handle"), default=None, help=argparse.SUPPRESS)
    add(*_both("--event-log-handler"), default=None, help=argparse.SUPPRESS)
    add(*_both("--numa-binding"), default=None, help=argparse.SUPPRESS)
    add(*_both("--virtual-local-rank"), action="store_true", help=argparse.SUPPRESS)


def _logs(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("logs and console")
    add = group.add_argument
    add(
        *_both("--log-dir"),
        default=None,
        help="each run gets a new private folder in DIR (default: a per-user folder in the "
        "temp dir)",
    )
    add("--stdout", default=None, help="per-rank stdout file template, e.g. out_{rank}.log")
    add("--stderr", default=None, help="per-rank stderr file template, e.g. err_{rank}.log")
    add(
        "--console-ranks",
        default=None,
        help="global ranks whose output reaches this console, e.g. 0 or 0,2-3, 'all' (default) "
        "or 'none'; ranks the job does not have are refused; the log files always get everything",
    )
    add(
        *_both("--local-ranks-filter"),
        default=None,
        help="torchrun's: local ranks whose output reaches this console, e.g. 0,1",
    )
    add(
        "-r",
        "--redirects",
        default=None,
        help="torchrun's: streams that go to the files only (0 none, 1 stdout, 2 stderr, 3 both; "
        "or per local rank, 0:3,1:2)",
    )
    add(
        "-t",
        "--tee",
        default=None,
        help="torchrun's: streams that go to the files and the console (same format)",
    )
    add(
        *_both("--log-line-prefix-template"),
        default=None,
        help="console prefix with ${rank}, ${local_rank}, ${role_name}, ${hostname} "
        "(default '[rank${rank}]: ')",
    )
    add(
        *_both("--logs-specs"),
        default=None,
        help="torchrun's: the name of a torchrun.logs_specs entry point (a LogsSpecs class) "
        "that decides where each rank's stdout and stderr go, built as torchrun builds it "
        "(from --log-dir, --redirects, --tee, --local-ranks-filter)",
    )
    add(
        "--no-console",
        dest="console",
        action="store_false",
        help="no rank output on this console (files only)",
    )


def _program(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what each rank runs")
    add = group.add_argument
    add(
        "-m",
        "--module",
        "--module_mode",
        dest="module",
        action="store_true",
        help="run the target as a module (python -m)",
    )
    add(
        *_both("--no-python"),
        "-c",
        "--command_mode",
        dest="no_python",
        action="store_true",
        help="run the target as a program, not with python",
    )
    add(
        *_both("--run-path"),
        action="store_true",
        help="torchrun's: run the script with runpy.run_path (what unidist always does)",
    )
    add(
        *_both("--dry-run"),
        action="store_true",
        help="print the resolved topology, log paths and equivalent commands; start nothing",
    )
