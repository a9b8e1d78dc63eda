"""unidist's exceptions: one tree; each class is also a built-in type, so old handlers still work.

```
UnidistError
├── ConfigurationError (ValueError)        bad argument or setting; the message names the fix
│   ├── TopologyError                      malformed or contradictory launcher environment
│   ├── DeviceUnavailableError             the device's runtime (driver, package) is missing
│   ├── AdapterNotFoundError (LookupError) no adapter of that name is registered
│   ├── ConfigurationTypeError (TypeError)           ┐ refused where the owner of a borrowed
│   ├── ConfigurationRuntimeError (RuntimeError)     │ name raises that type (unidist.compat),
│   └── ConfigurationAttributeError (AttributeError) ┘ so both `except` clauses still work
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
import enum
import sys
from types import TracebackType

__all__ = [
    "AdapterNotFoundError",
    "AdapterUnavailableError",
    "CheckpointError",
    "ConfigurationAttributeError",
    "ConfigurationError",
    "ConfigurationRuntimeError",
    "ConfigurationTypeError",
    "DeviceUnavailableError",
    "DistributedTimeoutError",
    "LaunchError",
    "MicrobatchOOMError",
    "NotInitializedError",
    "RemoteError",
    "TopologyError",
    "TorchFailure",
    "UnidistError",
    "from_communication_library",
    "torch_failure",
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


class ConfigurationTypeError(ConfigurationError, TypeError):
    """A refused argument where the owner of the name (Ignite, Composer, torch) raises TypeError.

    Raised by ``unidist.compat``: a value of a type the call cannot take (a list to Composer's
    ``all_gather``, a dataset without ``len()``, an object pickle refuses with a TypeError).
    """


class ConfigurationRuntimeError(ConfigurationError, RuntimeError):
    """A refused argument where the owner of the name raises RuntimeError.

    Raised by ``unidist.compat`` where torch's communication library refuses the call: a
    ``src`` that is not a rank of the world, a bitwise reduction of floating-point values.
    """


class ConfigurationAttributeError(ConfigurationError, AttributeError):
    """A refused argument where the owner of the name raises AttributeError.

    Raised by ``unidist.compat``: a model that is not a ``torch.nn.Module``, an object pickle
    refuses with an AttributeError (a local function or class).
    """


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


# Fragments of torch.distributed / gloo / NCCL messages, mapped to what they mean. torch raises
# most of its failures as bare RuntimeErrors (or DistError subclasses that say little more), so
# their text is read here, once: every caller asks :func:`torch_failure` and matches its answer.
_TIMEOUT_MARKERS = ("timed out", "timeout", "deadline exceeded")
_PEER_GONE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "socket closed",
    "ncclremoteerror",
)
_NCCL_MARKERS = ("nccl error", "ncclunhandledcudaerror", "ncclsystemerror", "processgroupnccl")


class TorchFailure(enum.Enum):
    """What a failure raised by ``torch.distributed`` (or a framework over it) means."""

    #: Another rank went away: a connection closed, reset or refused.
    PEER_GONE = "peer gone"
    #: A store wait ran out (``DistStoreError``: the key never came).
    STORE_TIMEOUT = "store timeout"
    #: A store's host did not answer in time (``DistNetworkError``: a socket timed out).
    NETWORK_TIMEOUT = "network timeout"
    #: A collective or another wait timed out.
    TIMEOUT = "timeout"
    #: Some other failure of the communication library (an NCCL or store error).
    COMMUNICATION = "communication"
    #: Not a communication failure that unidist recognises.
    OTHER = "other"


def torch_failure(exc: BaseException) -> TorchFailure:
    """Classify ``exc`` once, where torch's untyped errors enter unidist.

    Callers above match the answer (or the unidist error :func:`translated` makes of it), never
    the message.
    """
    if isinstance(exc, UnidistError):
        return TorchFailure.OTHER
    try:
        text = str(exc).lower()
    except Exception:  # a broken __str__ must not hide the original error
        text = ""
    kind = type(exc).__name__
    timed_out = any(marker in text for marker in _TIMEOUT_MARKERS)
    if isinstance(exc, RuntimeError) and any(marker in text for marker in _PEER_GONE_MARKERS):
        return TorchFailure.PEER_GONE
    if kind == "DistStoreError" and timed_out:
        return TorchFailure.STORE_TIMEOUT
    if kind == "DistNetworkError" and timed_out:
        return TorchFailure.NETWORK_TIMEOUT
    if isinstance(exc, RuntimeError) and timed_out:
        return TorchFailure.TIMEOUT
    if from_communication_library(exc, text):
        return TorchFailure.COMMUNICATION
    return TorchFailure.OTHER


def from_communication_library(exc: BaseException, text: str | None = None) -> bool:
    """Whether ``exc`` comes from the communication library itself: a ``torch.distributed``
    ``DistError`` (timeouts and lost peers of the store included) or an NCCL error."""
    dist = sys.modules.get("torch.distributed")
    dist_error = getattr(dist, "DistError", None) if dist is not None else None
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    if text is None:
        try:
            text = str(exc).lower()
        except Exception:  # a broken __str__ must not hide the original error
            return False
    return any(marker in text for marker in _NCCL_MARKERS)


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
    failure = torch_failure(exc)
    if failure is TorchFailure.PEER_GONE:
        return RemoteError(
            f"{what} failed because another rank went away: {exc}. HINT: look for the first "
            "rank that failed; this rank is collateral damage."
        )
    if failure in (TorchFailure.TIMEOUT, TorchFailure.STORE_TIMEOUT, TorchFailure.NETWORK_TIMEOUT):
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
