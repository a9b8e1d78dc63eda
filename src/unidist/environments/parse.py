"""Reading the environment: the launcher variables into one frozen :class:`EnvReading`.

:func:`read` recognises torchrun/torchelastic, ``unidist launch``, Composer's launcher, Ignite's
``Parallel``/``spawn`` (the torch variables), SLURM's ``srun`` and MPI
(:mod:`unidist.environments.schedulers`); :func:`read_settings` parses unidist's own variables, and
:func:`timeout_seconds` every ``timeout=`` argument.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from unidist._base.checks import check_seconds
from unidist.environments import places as environments
from unidist.environments.places import LAUNCHER_MARKER
from unidist.environments.topology import EnvReading

__all__ = [
    "HANG_PAGE",
    "LAUNCHER_MARKER",
    "OwnSettings",
    "chosen",
    "hang_page_file",
    "read",
    "read_settings",
    "run_id",
    "storage_secrets",
    "timeout_seconds",
]

#: Set by ``unidist launch`` and the test harness in each rank: where it keeps its page of
#: facts for hang attribution (see :mod:`unidist.hangs.page`).
HANG_PAGE = "UNIDIST_PROGRESS"


@dataclass(frozen=True)
class OwnSettings:
    """unidist's own variables: ``UNIDIST_ADAPTER``, ``UNIDIST_TIMEOUT``, ``UNIDIST_LAUNCHER``."""

    adapter: str | None = None
    timeout: float | None = None
    launcher: str | None = None
    #: ``UNIDIST_TESTING_PRELOAD``: modules the test harness's fork server imports.
    testing_preload: tuple[str, ...] | None = None
    #: ``UNIDIST_HANG_TIMEOUT``: ``unidist launch``'s ``--hang-timeout`` (parsed by the launcher).
    hang_timeout: str | None = None


def read(environ: Mapping[str, str] | None = None) -> EnvReading:
    """Parse the launcher variables of ``environ`` (default: this process's environment).

    The first environment that detects its variables reads them (see
    :mod:`unidist.environments.places`: the torch variables, third-party environments, SLURM,
    MPI, else one process).

    Raises:
        TopologyError: a value is not an integer, is out of range, or contradicts another.
        ConfigurationError: a third-party environment could not be loaded.
    """
    env = os.environ if environ is None else environ
    return environments.choose(env).read(env)


def chosen(names: tuple[str, ...], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables among ``names`` that are set (name -> value), for checks of other tools'
    variables (torch's agent reads its ``TORCHELASTIC_`` ones itself)."""
    env = os.environ if environ is None else environ
    return {name: env[name] for name in names if name in env}


def read_settings(environ: Mapping[str, str] | None = None) -> OwnSettings:
    """Parse unidist's own variables.

    Raises:
        ConfigurationError: ``UNIDIST_TIMEOUT`` is not a positive number.
    """
    env = os.environ if environ is None else environ
    timeout: float | None = None
    raw = env.get("UNIDIST_TIMEOUT")
    if raw is not None:
        timeout = check_seconds(
            _float_or_text(raw),
            "UNIDIST_TIMEOUT",
            timedelta_ok=False,
            hint="set it to e.g. 300, or unset it for the default.",
        )
    preload = env.get("UNIDIST_TESTING_PRELOAD")
    return OwnSettings(
        adapter=env.get("UNIDIST_ADAPTER") or None,
        timeout=timeout,
        launcher=env.get(LAUNCHER_MARKER) or None,
        testing_preload=None
        if preload is None
        else tuple(name.strip() for name in preload.split(",") if name.strip()),
        hang_timeout=env.get("UNIDIST_HANG_TIMEOUT") or None,
    )


#: ``UNIDIST_WORKER_START_TIMEOUT``: seconds a forked DataLoader worker of unidist's loaders gets
#: to run its first line before it is started again (:mod:`unidist.data._forks`); 0: no watch.
WORKER_START_TIMEOUT = "UNIDIST_WORKER_START_TIMEOUT"
DEFAULT_WORKER_START_TIMEOUT = 10.0


def worker_start_timeout(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds a forked DataLoader worker gets to start (default 10); None when set to 0.

    Raises:
        ConfigurationError: the value is not a number of seconds (0 or more).
    """
    env = os.environ if environ is None else environ
    raw = env.get(WORKER_START_TIMEOUT)
    if raw is None or not raw.strip():
        return DEFAULT_WORKER_START_TIMEOUT
    seconds = check_seconds(
        _float_or_text(raw),
        WORKER_START_TIMEOUT,
        timedelta_ok=False,
        zero="waits as long as torch does: for ever",
        hint="set it to the seconds a forked DataLoader worker gets to start (default "
        f"{DEFAULT_WORKER_START_TIMEOUT:g}).",
    )
    return seconds or None


def _float_or_text(raw: str) -> float | str:
    """``raw`` as a float where it reads as one, else ``raw`` itself (shown in the error)."""
    try:
        return float(raw)
    except ValueError:
        return raw


def hang_page_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Where this rank keeps its hang page (``UNIDIST_PROGRESS``), if its launcher asked."""
    env = os.environ if environ is None else environ
    return env.get(HANG_PAGE) or None


#: Variables whose values are credentials for object stores: never shown in a message.
_SECRETS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)


def storage_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The object-store credentials set in the environment (to keep out of every message)."""
    env = os.environ if environ is None else environ
    return [env[name] for name in _SECRETS if env.get(name)]


def run_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The elastic run's id (``TORCHELASTIC_RUN_ID``), the same in every restart of the run.

    torchrun and ``unidist launch`` set it from ``--rdzv-id`` (or a fresh one per launch); None
    outside torch's elastic agent.
    """
    env = os.environ if environ is None else environ
    return env.get("TORCHELASTIC_RUN_ID") or None


def timeout_seconds(timeout: float | timedelta, name: str = "timeout") -> float:
    """Seconds in a ``timeout=`` argument: a positive number of seconds or a timedelta.

    The one converter for every ``timeout=`` unidist takes (``UNIDIST_TIMEOUT`` is read above);
    the check itself is :func:`unidist._base.checks.check_seconds`.

    Args:
        timeout: the value given.
        name: the keyword it was given as, for the message (``stop_timeout``, say).

    Raises:
        ConfigurationError: zero, a negative or infinite value, or not a number.
    """
    return check_seconds(timeout, name)
