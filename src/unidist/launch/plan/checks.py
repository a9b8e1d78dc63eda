"""Checks of ``unidist launch``'s inputs that run before anything is created.

Numbers (finite, in range), host names and endpoints (no control characters or spaces, a valid
host name or IP literal, a port 0-65535), the places the logs go (an existing folder or one
that can be created, writable, no file or link in the way), and whether this machine can hold
the processes at all (open files, processes, an absolute cap). A mistake is refused at once with
a :class:`~unidist.errors.ConfigurationError` that names the value, the limit, where the limit
comes from and the fix; no run folder, file or process exists yet.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import math
import os
import re
import resource
import stat
from collections.abc import Iterable
from pathlib import Path

from unidist._base import checks as _checks
from unidist.errors import ConfigurationError

__all__ = [
    "FDS_BASE",
    "FDS_PER_RANK",
    "MAX_LOCAL_PROCESSES",
    "MAX_RESTARTS",
    "MAX_SECONDS",
    "MAX_WORLD_SIZE",
    "MIN_MONITOR_INTERVAL",
    "MAX_ID_LENGTH",
    "check_agent_variables",
    "check_capacity",
    "check_endpoint",
    "check_name",
    "check_signals",
    "check_host",
    "check_log_file",
    "check_log_folder",
    "check_numbers",
    "check_option_seconds",
    "existing_problem",
    "unique",
]

#: The longest any time option may be: a year (0 means "for ever" where an option allows it).
MAX_SECONDS = _checks.YEAR
#: The shortest --monitor-interval: the launcher and torch's agent poll this often.
MIN_MONITOR_INTERVAL = 0.001
#: The most restarts --max-restarts takes.
MAX_RESTARTS = 1_000_000
#: The most processes one launcher starts on its node, whatever the limits allow.
MAX_LOCAL_PROCESSES = 4096
#: The most ranks a job may have (--nnodes MAX times the processes per node).
MAX_WORLD_SIZE = 1 << 20
#: Files the launcher holds open for each rank: its two log files as torch's agent writes them
#: and the console's two readers (two more with --stdout/--stderr, while unidist hands the
#: files over to torch's agent in a folder other users may write to).
FDS_PER_RANK = 4
#: Files the launcher holds open whatever the number of ranks (standard streams, the
#: rendezvous store's sockets, pipes, the interpreter's own), with a margin.
FDS_BASE = 64

#: The longest file or folder name and path Linux file systems take (NAME_MAX, PATH_MAX).
NAME_MAX, PATH_MAX = 255, 4096
#: The longest --rdzv-id: it is part of every rendezvous store key, and torch's store refuses a
#: key longer than 8192 bytes (with a C++ error that names neither the option nor the value).
MAX_ID_LENGTH = 1024

_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


# -- numbers --------------------------------------------------------------------------------------


def check_option_seconds(
    value: float | None,
    option: str,
    *,
    zero: str | None = None,
    minimum: float | None = None,
    example: str = "30",
) -> None:
    """A number of seconds: finite, above 0 (or 0, where ``zero`` says what it means), at most
    a year; :func:`unidist._base.checks.check_seconds`, with the option's example as the HINT.

    Raises:
        ConfigurationError: the option, its value and its range.
    """
    if value is None:
        return
    _checks.check_seconds(
        value,
        option,
        timedelta_ok=False,
        zero=zero,
        minimum=minimum,
        maximum=MAX_SECONDS,
        hint=f"e.g. {option} {example}" + (f"; {option} 0 {zero}." if zero else "."),
    )


def _count(value: int | None, option: str, low: int, high: int | None = None) -> None:
    if value is not None:
        _checks.check_int(value, option, minimum=low, maximum=high)


def hang_timeout(value: str | None, source: str) -> float | None:
    """``--hang-timeout`` (or ``UNIDIST_HANG_TIMEOUT``): None for ``auto``, 0 for off, seconds.

    Raises:
        ConfigurationError: neither ``auto`` nor a number of seconds (0 or more).
    """
    if value is None or value.strip().lower() == "auto":
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigurationError(
            f"{source} {value!r} is neither 'auto' nor a number of seconds. HINT: e.g. "
            f"{source} 300, {source} 0 to turn hang detection off, or {source} auto."
        ) from None
    check_option_seconds(seconds, source, zero="turns hang detection off", example="300")
    return seconds


def straggler_every(value: str | None) -> float | None:
    """``--straggler-report``: None for ``end`` (the default), 0 for ``off``, else seconds.

    Raises:
        ConfigurationError: neither ``end``, ``off`` nor a number of minutes above 0.
    """
    if value is None or value.strip().lower() == "end":
        return None
    if value.strip().lower() == "off":
        return 0.0
    try:
        minutes = float(value)
    except ValueError:
        minutes = -1.0
    if not math.isfinite(minutes) or minutes <= 0:
        raise ConfigurationError(
            f"--straggler-report {value!r} is not 'end', 'off' or a number of minutes above 0. "
            "HINT: e.g. --straggler-report 10 (every 10 minutes and at the end)."
        )
    check_option_seconds(minutes * 60, "--straggler-report (in seconds)", example="600")
    return minutes * 60


def check_numbers(args: argparse.Namespace) -> None:
    """Every number option of ``unidist launch``: finite, and in its range.

    Raises:
        ConfigurationError: the option, its value, the range it must be in.
    """
    check_option_seconds(args.timeout, "--timeout")
    check_option_seconds(args.grace, "--grace", example="3")
    check_option_seconds(args.shutdown_timeout, "--shutdown-timeout", example="3")
    check_option_seconds(args.exit_timeout, "--exit-timeout", zero="waits for ever", example="600")
    check_option_seconds(args.node_timeout, "--node-timeout", minimum=1, example="6")
    check_option_seconds(
        args.monitor_interval, "--monitor-interval", minimum=MIN_MONITOR_INTERVAL, example="0.1"
    )
    _count(args.max_restarts, "--max-restarts", 0, MAX_RESTARTS)
    _count(args.node_rank, "--node-rank", 0)
    _count(args.world_size, "--world-size", 1, MAX_WORLD_SIZE)
    _count(args.base_rank, "--base-rank", 0)
    _count(args.master_port, "--master-port", 0, 65535)


# -- names, signals and torch's agent variables ------------------------------------------------


def _shown(text: str, limit: int = 60) -> str:
    """``text`` as printed in an error: escaped (repr), cut to ``limit`` characters."""
    if len(text) > limit:
        return f"{text[:limit]!r}... ({len(text)} characters)"
    return repr(text)


def check_name(text: str | None, option: str, *, longest: int | None = None) -> None:
    """An id or name torchrun takes as is: printable, and at most ``longest`` characters.

    Raises:
        ConfigurationError: the option, the value (escaped, cut) and the rule.
    """
    if text is None:
        return
    if any(not ch.isprintable() for ch in text):
        raise ConfigurationError(
            f"{option} {_shown(text)} contains a control character (a newline, an escape). "
            "HINT: check the quoting of the value (a stray newline from a file or a variable)."
        )
    if longest is not None and len(text) > longest:
        raise ConfigurationError(
            f"{option} {_shown(text)} is longer than {longest} characters: it is part of every "
            "rendezvous store key, and torch's store refuses long keys. HINT: use a short id, "
            "such as the scheduler's job id."
        )


def check_signals(text: str | None, option: str) -> None:
    """A comma-separated list of signal names (``SIGTERM,SIGUSR1``) this system has.

    torch's agent logs a warning for a name it does not know and goes on without it; a
    preemption notice sent by that signal would then kill the launcher.
    """
    if text is None:
        return
    import signal

    names = [name.strip() for name in text.split(",")]
    unknown = [
        name for name in names if not isinstance(getattr(signal, name, None), signal.Signals)
    ]
    if unknown or not text.strip():
        raise ConfigurationError(
            f"{option} {_shown(text)}: {', '.join(map(repr, unknown)) or 'nothing'} is not a "
            "signal name on this system. HINT: e.g. SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1."
        )


#: torch's elastic agent reads these from the launcher's environment.
AGENT_VARIABLES = (
    "TORCHELASTIC_ENABLE_FILE_TIMER",
    "TORCHELASTIC_TIMER_FILE",
    "TORCHELASTIC_HEALTH_CHECK_PORT",
    "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT",
)


def check_agent_variables(values: dict[str, str]) -> None:
    """The ``TORCHELASTIC_`` variables torch's agent reads, checked before it starts.

    torch reads them leniently: a file timer starts only for ``1`` (``true`` or ``yes`` leave it
    off, silently), a timer file in a missing folder fails inside the rendezvous with a bare
    FileNotFoundError, a health-check port that is no port only logs a warning, an unreadable
    D-state timeout turns the check off. Here each gets one line naming it.

    Args:
        values: the variables that are set (name -> value).
    """
    enabled = values.get("TORCHELASTIC_ENABLE_FILE_TIMER")
    if enabled is not None and enabled not in ("0", "1"):
        raise ConfigurationError(
            f"TORCHELASTIC_ENABLE_FILE_TIMER={_shown(enabled)}: torch's agent starts its file "
            "timer only for 1 and leaves it off for anything else. HINT: set it to 1 (on) or 0 "
            "(off), or unset it."
        )
    timer = values.get("TORCHELASTIC_TIMER_FILE")
    if enabled == "1" and timer is not None:
        folder = Path(timer).parent
        if not timer or not folder.is_dir():
            raise ConfigurationError(
                f"TORCHELASTIC_TIMER_FILE={_shown(timer)}: the folder {_shown(str(folder))} "
                "does not exist, so torch's file timer cannot create its pipe there. HINT: "
                "create the folder, or unset the variable (torch then uses the temporary folder)."
            )
    port = values.get("TORCHELASTIC_HEALTH_CHECK_PORT")
    if port is not None:
        try:
            number = int(port)
        except ValueError:
            number = -1
        if not 0 <= number <= 65535:
            raise ConfigurationError(
                f"TORCHELASTIC_HEALTH_CHECK_PORT={_shown(port)} is not a port from 0 to 65535 "
                "(torch's agent would log a warning and run without its health check). HINT: "
                "set a port number, or unset it."
            )
    timeout = values.get("TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT")
    if timeout:
        try:
            seconds = float(timeout)
        except ValueError:
            seconds = math.nan
        if not math.isfinite(seconds):
            raise ConfigurationError(
                f"TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT={_shown(timeout)} is not a number "
                "of seconds (torch's agent would turn the check off, silently). HINT: e.g. 600; "
                "0 turns the check off."
            )


# -- hosts and endpoints ------------------------------------------------------------------------


def _bad_characters(text: str, option: str, what: str) -> None:
    if not text or any(ch.isspace() or not ch.isprintable() for ch in text):
        problem = "is empty" if not text else "contains a space or a control character"
        raise ConfigurationError(
            f"{option} {text!r} {problem}; it must be {what}. HINT: check the quoting of the "
            "value (a stray newline from a file or a variable)."
        )


def _host_problem(host: str) -> str | None:
    """Why ``host`` is no host name or IP literal (None: it is one)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return None
    if "%" in host:  # an IPv6 literal with a zone: fe80::1%eth0
        address, _, zone = host.partition("%")
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(address)
            return None if zone and all(c.isalnum() or c in "_.-" for c in zone) else "a bad zone"
    if re.fullmatch(r"[0-9.]+", host):
        return "not a valid IPv4 address"
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253:
        return "longer than 253 characters"
    if not all(_HOST_LABEL.fullmatch(label) for label in name.split(".")):
        return (
            "not a host name (dot-separated labels of letters, digits, '-' and '_', each 1 to 63 "
            "characters, not starting or ending with '-') nor an IP address"
        )
    return None


def check_host(host: str | None, option: str) -> None:
    """A host name, an IPv4 address or an IPv6 address (brackets allowed), nothing else.

    Raises:
        ConfigurationError: the option, the value and what is wrong with it.
    """
    if host is None:
        return
    _bad_characters(host, option, "a host name or an IP address")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    problem = _host_problem(bare)
    if problem is not None:
        raise ConfigurationError(
            f"{option} {host!r} is {problem}. HINT: e.g. {option} node0 or {option} 10.0.0.5."
        )


def check_endpoint(endpoint: str | None, option: str) -> None:
    """``HOST``, ``HOST:PORT``, ``[IPv6]`` or ``[IPv6]:PORT`` with a port from 0 to 65535.

    Raises:
        ConfigurationError: the option, the value and what is wrong with it.
    """
    if endpoint is None:
        return
    what = "HOST:PORT (or [IPv6]:PORT)"
    _bad_characters(endpoint, option, what)
    hint = f"HINT: e.g. {option} node0:29400 or {option} [fd00::5]:29400."
    if endpoint.startswith("["):
        match = re.fullmatch(r"\[([^\]]+)\](?::(.*))?", endpoint)
        host, port = (match[1], match[2]) if match else ("", None)
        ipv6 = True
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(host.partition("%")[0])
            ipv6 = False
        if ipv6:
            raise ConfigurationError(
                f"{option} {endpoint!r}: brackets hold an IPv6 address, and {host!r} is not "
                f"one. {hint}"
            )
    elif endpoint.count(":") > 1:
        host, _, port = endpoint.rpartition(":")
        if _host_problem(host) is not None or ":" not in host:
            raise ConfigurationError(
                f"{option} {endpoint!r} is not {what}: an IPv6 address goes in brackets. {hint}"
            )
    else:
        host, sep, port_text = endpoint.partition(":")
        port = port_text if sep else None
        problem = _host_problem(host) if host else "empty"
        if problem is not None:
            raise ConfigurationError(
                f"{option} {endpoint!r}: the host {host!r} is {problem}. {hint}"
            )
    if port is not None and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ConfigurationError(
            f"{option} {endpoint!r}: the port {port!r} is not a TCP port (0 to 65535). {hint}"
        )


# -- what this machine can hold -----------------------------------------------------------------


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tasks_now() -> int | None:
    """Threads running on this machine now (``/proc/loadavg``'s fourth field, R/TOTAL)."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return None


def _user_tasks() -> int:
    """Threads of this user now (what ``ulimit -u`` counts)."""
    uid, count = os.getuid(), 0
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


def check_capacity(
    nproc: int,
    max_nodes: int = 1,
    console: bool = True,
    templates: bool = False,
    option: str = "-n",
) -> None:
    """Whether this machine can run ``nproc`` ranks under one launcher (and the world exists).

    Checked before anything is created: the open-file limit (``ulimit -n``: the launcher holds
    :data:`FDS_PER_RANK` files per rank), the process limits (``ulimit -u`` for this user, and
    the kernel's ``pid_max`` and ``threads-max``), :data:`MAX_LOCAL_PROCESSES` processes per node
    and :data:`MAX_WORLD_SIZE` ranks in the job.

    Raises:
        ConfigurationError: the limit, where it comes from, and the fix.
    """
    if nproc > MAX_LOCAL_PROCESSES:
        raise ConfigurationError(
            f"{option} {nproc}: unidist launch starts at most {MAX_LOCAL_PROCESSES} processes "
            "per node (each rank is a Python process with torch loaded, hundreds of MB each). "
            f"HINT: use {option} {MAX_LOCAL_PROCESSES} or fewer, and more nodes (--nnodes)."
        )
    world = nproc * max_nodes
    if world > MAX_WORLD_SIZE:
        raise ConfigurationError(
            f"{option} {nproc} on up to {max_nodes} node(s) is {world} ranks; unidist launch "
            f"takes at most {MAX_WORLD_SIZE} ranks in a job. HINT: lower --nnodes or {option}."
        )
    per_rank = FDS_PER_RANK - (0 if console else 2) + (2 if templates else 0)
    need = FDS_BASE + per_rank * nproc
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and need > soft:
        fits = max((soft - FDS_BASE) // per_rank, 0)
        raise_to = need if hard == resource.RLIM_INFINITY else min(need, hard)
        fix = (
            f"raise it with `ulimit -n {raise_to}` before unidist launch"
            if raise_to >= need
            else f"the hard limit is {hard}: ask for a higher one (limits.conf, or LimitNOFILE= "
            "for a service)"
        )
        raise ConfigurationError(
            f"{option} {nproc} needs about {need} open files in the launcher ({per_rank} per "
            f"rank for its log files, plus {FDS_BASE}), but this shell's "
            f"open-file limit (RLIMIT_NOFILE, `ulimit -n`) is {soft}; {fits} rank(s) fit. HINT: "
            f"{fix}, or use {option} {fits} or fewer."
        )
    _check_processes(nproc, option)


def _check_processes(nproc: int, option: str) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if os.getuid() != 0 and soft != resource.RLIM_INFINITY:  # root is not held to it
        used = _user_tasks()
        if used + nproc > soft:
            raise ConfigurationError(
                f"{option} {nproc} starts {nproc} processes, but this user may run {soft} "
                f"processes and threads (RLIMIT_NPROC, `ulimit -u`) and already runs {used}. "
                f"HINT: raise it with `ulimit -u {used + nproc + 256}` if the hard limit allows, "
                f"or use {option} {max(soft - used, 0)} or fewer."
            )
    for name, path in (
        ("pid_max", "/proc/sys/kernel/pid_max"),
        ("threads-max", "/proc/sys/kernel/threads-max"),
    ):
        limit, running = _read_int(path), _tasks_now()
        if limit is None:
            continue
        free = limit - (running or 0)
        if nproc > free:
            raise ConfigurationError(
                f"{option} {nproc} starts {nproc} processes, but the kernel allows only {limit} "
                f"(kernel.{name.replace('-', '_')}, {path}) and {running or 0} threads already "
                f"run: {max(free, 0)} fit. HINT: use {option} {max(free, 0)} or fewer, or raise "
                f"it (sysctl kernel.{name.replace('-', '_')}=N, as root)."
            )


# -- where the logs go ----------------------------------------------------------------------------


def _first_existing(path: Path) -> Path:
    for above in (path, *path.parents):
        with contextlib.suppress(OSError):
            above.lstat()
            return above
    return Path("/")


def _planted_link(folder: Path) -> Path | None:
    """A link on the way to ``folder`` that another user may have planted: in a sticky folder
    anyone may write to (``/tmp``), owned by neither this user nor that folder's owner. A
    kernel with ``fs.protected_symlinks=1`` refuses to follow those; unidist refuses them
    everywhere."""
    path = Path(os.path.abspath(folder))
    for above in reversed((path, *path.parents)):
        try:
            info = above.lstat()
            outer = above.parent.stat()
        except OSError:
            return None  # from here on nothing exists yet
        if not stat.S_ISLNK(info.st_mode):
            continue
        sticky_shared = outer.st_mode & stat.S_ISVTX and outer.st_mode & stat.S_IWOTH
        if sticky_shared and info.st_uid not in (os.geteuid(), outer.st_uid):
            return above
    return None


def check_log_folder(folder: Path, what: str) -> None:
    """``folder`` is a folder this user can write in, or can be created (nothing is created).

    Raises:
        ConfigurationError: ``what`` (the start of the message), the folder and the reason.
    """
    too_long = [part for part in folder.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long or len(os.fsencode(str(folder))) > PATH_MAX:
        which = f"the name {_shown(too_long[0])}" if too_long else "the whole path"
        raise ConfigurationError(
            f"{what} {_shown(str(folder))}: {which} is longer than the file system takes "
            f"({NAME_MAX} bytes a name, {PATH_MAX} a path). HINT: choose a shorter --log-dir, "
            "--stdout or --stderr."
        )
    planted = _planted_link(folder)
    if planted is not None:
        raise ConfigurationError(
            f"{what} {str(folder)!r}: {str(planted)!r} is a symbolic link of another user's "
            f"(uid {planted.lstat().st_uid}) in a shared folder; unidist does not follow it. "
            "HINT: choose a folder of your own with --log-dir, --stdout or --stderr."
        )
    existing = _first_existing(folder)
    reason = None
    try:
        info = existing.stat()
    except OSError as exc:
        reason = str(exc.strerror or exc)
    else:
        if not stat.S_ISDIR(info.st_mode):
            reason = f"{str(existing)!r} is a file, not a folder"
        elif not os.access(existing, os.W_OK | os.X_OK):
            reason = f"no permission to write in {str(existing)!r}"
            if existing != folder:
                reason = f"{reason}, where it would be created"
    if reason is not None:
        raise ConfigurationError(
            f"{what} {str(folder)!r} ({reason}). HINT: choose a writable place with --log-dir, "
            "--stdout or --stderr."
        )


def check_log_file(path: Path) -> None:
    """Nothing at ``path`` that a log must not replace: a folder, a link, a file not this user's.

    An existing regular file of this user's (an earlier run's log) is fine: it is emptied.

    Raises:
        ConfigurationError: the path and what is there.
    """
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigurationError(
            f"cannot use the log file {str(path)!r} ({exc.strerror})."
        ) from None
    problem = existing_problem(info)
    if problem is not None:
        raise ConfigurationError(f"the log file {str(path)!r} {problem}")


def existing_problem(info: os.stat_result) -> str | None:
    """Why an existing file (its ``lstat``) must not become a log file, or None.

    A symbolic link could point anywhere (another user's link in a shared folder, at this user's
    files); a file with other hard links is another file too; a file of another user's could be
    read by them; anything but a regular file (a FIFO, a device) is not a log.
    """
    hint = "HINT: remove it, or choose another place with --log-dir, --stdout or --stderr."
    if stat.S_ISLNK(info.st_mode):
        return (
            "is a symbolic link; unidist never writes a log through a link (in a shared folder, "
            f"anyone could point one at your files). {hint}"
        )
    if stat.S_ISDIR(info.st_mode):
        return f"is a folder, not a file. {hint}"
    if not stat.S_ISREG(info.st_mode):
        return f"exists and is not a regular file (a FIFO, socket or device). {hint}"
    if info.st_uid != os.geteuid():
        return f"belongs to another user (uid {info.st_uid}); unidist never writes into it. {hint}"
    if info.st_nlink > 1:
        return f"has {info.st_nlink} hard links: writing it would change another file too. {hint}"
    return None


def unique(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without repeats, in order."""
    return list(dict.fromkeys(paths))
