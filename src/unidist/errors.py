"""unidist's exceptions: one tree; each class is also a built-in type, so old handlers still work.

```
UnidistError
├── ConfigurationError (ValueError)        bad argument or setting; the message names the fix
│   ├── TopologyError                      malformed or contradictory launcher environment
│   ├── DeviceUnavailableError             the device's runtime (driver, package) is missing
│   └── AdapterNotFoundError (LookupError) no adapter of that name is registered
├── AdapterUnavailableError (ImportError)  the adapter's framework is missing (has `pip_hint`)
├── NotInitializedError (RuntimeError)     several processes but no process group yet
├── DistributedTimeoutError (TimeoutError) a wait ran out of time; names what it waited for
├── RemoteError (RuntimeError)             another rank failed, so this one cannot go on
├── LaunchError (RuntimeError)             a launched job failed; names the culprit rank
├── CheckpointError (RuntimeError)         a checkpoint cannot be read, or is another job's
└── MicrobatchOOMError (RuntimeError)      out of memory even at the smallest microbatch size
```

Adapters translate framework and ``torch.distributed`` failures into this tree at their
boundary (:func:`translate_errors`), keeping the original exception as ``__cause__``.
"""

from __future__ import annotations

import contextlib
from types import TracebackType

__all__ = [
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "CheckpointError",
    "ConfigurationError",
    "DeviceUnavailableError",
    "DistributedTimeoutError",
    "LaunchError",
    "MicrobatchOOMError",
    "NotInitializedError",
    "RemoteError",
    "TopologyError",
    "UnidistError",
    "translate_errors",
    "translated",
]


class UnidistError(Exception):
    """Base class of every error raised by unidist."""


class ConfigurationError(UnidistError, ValueError):
    """An argument or setting is invalid; the message says what was given and what to do."""


class TopologyError(ConfigurationError):
    """The launcher's environment variables are malformed, incomplete or contradict each other."""


class DeviceUnavailableError(ConfigurationError):
    """The requested device cannot be used here: its driver, package or hardware is missing.

    Attributes:
        kind: the device kind asked for (``cuda``, ``mps``, ``xla``, ...).
        missing: what is missing, in words ("Found no NVIDIA driver on your system").
    """

    def __init__(self, message: str, *, kind: str, missing: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.missing = missing


class AdapterNotFoundError(ConfigurationError, LookupError):
    """No adapter is registered under the requested name."""


class AdapterUnavailableError(UnidistError, ImportError):
    """The adapter exists but its framework is not installed.

    Attributes:
        pip_hint: the ``pip install`` line that provides the framework.
    """

    def __init__(self, message: str, *, pip_hint: str) -> None:
        super().__init__(message)
        self.pip_hint = pip_hint


class NotInitializedError(UnidistError, RuntimeError):
    """A collective needs a process group, and none has been initialized."""


class DistributedTimeoutError(UnidistError, TimeoutError):
    """A distributed wait did not finish in time. The message names what it waited for."""


class RemoteError(UnidistError, RuntimeError):
    """Another rank failed (raised, exited or was killed), so this rank cannot continue."""


class LaunchError(UnidistError, RuntimeError):
    """A job started by ``unidist launch`` or :func:`unidist.spawn` failed.

    Attributes:
        exit_code: the culprit's exit code (128 + signal number for a signal).
        culprit: the global rank held responsible, or None if unknown.
        report: the failure summary (also the message).
    """

    def __init__(self, report: str, *, exit_code: int, culprit: int | None) -> None:
        super().__init__(report)
        self.report = report
        self.exit_code = exit_code
        self.culprit = culprit


class CheckpointError(UnidistError, RuntimeError):
    """A checkpoint cannot be trusted or read, or it belongs to another job.

    The message says what was found (the file, its owner or mode, the job that wrote it) and
    what to do about it.
    """


class MicrobatchOOMError(UnidistError, RuntimeError):
    """A rank ran out of memory at the smallest allowed microbatch size; raised on every rank.

    :func:`unidist.is_oom` does not count it as an out-of-memory error: it is the final verdict,
    not something to retry.
    """


# Fragments of torch.distributed / gloo / NCCL messages, mapped to the error class they mean.
_TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")
_PEER_GONE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
    "ncclremoteerror",
)


def translated(exc: BaseException, what: str) -> UnidistError | None:
    """The unidist error that ``exc`` (raised by torch.distributed or a framework) stands for.

    Args:
        exc: the original exception.
        what: what was being done, for the message ("all_reduce over 2 ranks").

    Returns:
        A new error to raise ``from exc``, or None when ``exc`` should propagate unchanged.
    """
    if isinstance(exc, UnidistError) or not isinstance(exc, RuntimeError):
        return None
    text = str(exc).lower()
    if any(marker in text for marker in _PEER_GONE_MARKERS):
        return RemoteError(
            f"{what} failed because another rank went away: {exc}. HINT: look for the first "
            "rank that failed; this rank is collateral damage."
        )
    if any(marker in text for marker in _TIMEOUT_MARKERS):
        return DistributedTimeoutError(
            f"{what} timed out: {exc}. HINT: another rank is probably stuck, has crashed or "
            "never reached this call; check every rank's log."
        )
    return None


def translate_errors(what: str) -> contextlib.AbstractContextManager[None]:
    """Re-raise torch.distributed failures in the block as unidist errors (:func:`translated`).

    Args:
        what: what the block was doing, for the message.
    """
    return _Translating(what)


class _Translating:
    """:func:`translate_errors`' context: a class, not a generator, for it wraps every
    collective (entering and leaving costs a tenth of what ``@contextmanager`` does)."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(exc, RuntimeError):
            new = translated(exc, self.what)
            if new is not None:
                raise new from exc
