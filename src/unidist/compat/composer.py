"""Composer's ``composer.utils.dist``, name for name and behaviour for behaviour, on unidist.

Swap ``from composer.utils import dist`` for ``from unidist.compat import composer as dist``:
the collectives work in place and return None, as Composer's; when ``torch.distributed`` is
not initialised they are no-ops in a world of one and raise Composer's RuntimeError otherwise;
the signal-file helpers write and wait for the same files. The data goes through unidist
(``unidist.all_reduce``, ``unidist.one_rank_first``, ...), so it gains what unidist adds: a
wait that cannot last for ever (``local_rank_zero_download_and_wait`` gives up after
``timeout`` seconds and names the file), a failed local rank zero raised on the ranks waiting
for it in ``run_local_rank_zero_first``, and unidist launch's hang and failure reports.

``dist`` here is ``torch.distributed``, as in Composer's module, so tests that patch
``dist.dist.is_initialized`` keep working. Composer is not imported.
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import string
import time
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.utils.data

import unidist
from unidist.compat._groups import as_group
from unidist.compat._refusals import check_bitwise, check_sized, checked_src, pickles_type
from unidist.errors import ConfigurationError, ConfigurationTypeError

__all__ = [
    "MissingEnvironmentError",
    "all_gather",
    "all_gather_object",
    "all_gather_object_list_hpu",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "busy_wait_for_local_rank_zero",
    "get_global_rank",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_node_signal_file_name",
    "get_sampler",
    "get_world_size",
    "initialize_dist",
    "is_available",
    "is_initialized",
    "local_rank_zero_download_and_wait",
    "run_local_rank_zero_first",
    "write_signal_file",
]

T = TypeVar("T")

#: How long the file waits (``local_rank_zero_download_and_wait``, the busy wait) last before
#: they give up, naming the file: Composer's wait for ever.
WAIT_TIMEOUT = 3600.0
#: Composer's poll period for signal files.
_POLL = 0.1
#: Composer's reduce operations (upper case in any case given), as unidist spells them.
_OPS = {"SUM": "sum", "PRODUCT": "product", "MIN": "min", "MAX": "max", "BAND": "band"}
_OPS["BOR"] = "bor"
#: Composer's backend for each device name.
_BACKENDS = {"cpu": "gloo", "gpu": "nccl", "mps": "gloo", "tpu": "xla"}


class MissingEnvironmentError(Exception):
    """Composer's error type for a missing launcher variable (kept for ``except`` clauses)."""


# -- where this process runs -------------------------------------------------------------------


def get_world_size() -> int:
    """The number of processes in the job (1 when not distributed)."""
    return unidist.get_world_size()


def get_global_rank(group: Any = None) -> int:
    """This process's global rank, or its rank within ``group`` (0 when not distributed)."""
    if group is None:
        return unidist.get_rank()
    return unidist.get_rank(group=_group(group, "get_global_rank"))


def get_local_world_size() -> int:
    """The number of processes on this node (1 when not distributed)."""
    return unidist.get_local_world_size()


def get_local_rank() -> int:
    """This process's rank on its node (0 when not distributed)."""
    return unidist.get_local_rank()


def get_node_rank() -> int:
    """This node's rank (0 when not distributed)."""
    return unidist.get_node_rank()


def is_available() -> bool:
    """Whether torch was built with distributed support (Composer's meaning)."""
    return dist.is_available()


def is_initialized() -> bool:
    """Whether ``torch.distributed`` is initialised (Composer's meaning; not unidist's state)."""
    return dist.is_initialized()


def initialize_dist(device: Any = None, timeout: float = 300.0) -> None:
    """Start the process group for ``device`` ('cpu', 'gpu', 'mps', 'tpu' or Composer's Device).

    Through ``unidist.initialize``: the launcher's variables (any launcher unidist reads),
    the backend Composer picks for the device, ``timeout`` in seconds.

    Raises:
        RuntimeError: a process group is live on another backend (Composer's check).
        ValueError: a device Composer does not know.
    """
    backend = _backend_for(device)
    if dist.is_available() and dist.is_initialized():
        live = dist.get_backend()
        if live != backend:
            raise RuntimeError(
                f"The requested backend ({backend}) differs from the backend of the current "
                f"process group ({live}). HINT: restart the Python process to change backends."
            )
    unidist.initialize(backend, timeout=timeout)


def _backend_for(device: Any) -> str:
    if device is None:
        return "nccl" if torch.cuda.is_available() else "gloo"
    backend = getattr(device, "dist_backend", None)  # Composer's Device objects say it
    if isinstance(backend, str):
        return backend.lower()
    if isinstance(device, str) and device.lower() in _BACKENDS:
        return _BACKENDS[device.lower()]
    raise ValueError(
        f"initialize_dist(device={device!r}): expected one of {sorted(_BACKENDS)} or a "
        "Composer Device. HINT: initialize_dist('cpu') for gloo, 'gpu' for nccl."
    )


# -- collectives: in place, None returned, as Composer's ---------------------------------------


def _ready() -> bool:
    """Composer's test: a live torch process group (read through ``dist`` so tests can patch it)."""
    return bool(dist.is_available() and dist.is_initialized())


def _not_ready() -> RuntimeError:
    world = get_world_size()
    return RuntimeError(
        f"The world_size({world}) > 1, but the distributed package is not available or has "
        "not been initialized (Composer's check: no live torch.distributed process group). "
        "HINT: call dist.initialize_dist('cpu') or unidist.initialize() first, on every rank."
    )


def _serial(what: str) -> bool:
    """True to skip the collective (world of one, no group); raises Composer's error otherwise."""
    if _ready():
        return False
    if get_world_size() == 1:
        return True
    raise _not_ready()


def _group(group: Any, what: str) -> Any:
    return as_group(group, what, lists=False)


#: What to use instead of a tensor collective, for a value that is not a tensor.
_OBJECTS = {
    "all_reduce": "unidist.all_reduce(value) also takes a number and returns the result",
    "broadcast": "broadcast_object_list([obj], src) sends any picklable object",
    "all_gather": "all_gather_object(obj) gathers any picklable object",
}


def _tensor(tensor: Any, what: str) -> None:
    """torch's check of a collective's tensor: Composer's collectives work on it in place."""
    if not isinstance(tensor, torch.Tensor):
        raise ConfigurationTypeError(
            f"{what} takes a torch.Tensor, which it changes in place, got "
            f"{type(tensor).__name__} {tensor!r:.40} (Composer's raises TypeError here, in "
            f"torch). HINT: pass a tensor; {_OBJECTS[what]}."
        )


def _src(src: Any, group: Any, what: str) -> int:
    """``src`` checked as torch checks it (against the world when there is no ``group``)."""
    return checked_src(src, get_world_size() if group is None else None, what)


def barrier(group: Any = None) -> None:
    """Wait for every rank of ``group`` (with unidist's deadline, naming who did not arrive)."""
    if _serial("barrier"):
        return
    unidist.barrier(group=_group(group, "barrier"))


def all_reduce(tensor: torch.Tensor, reduce_operation: str = "SUM", group: Any = None) -> None:
    """Reduce ``tensor`` in place across ranks; ``reduce_operation`` is a ``ReduceOp`` name.

    SUM, PRODUCT, MIN, MAX, BAND and BOR go through unidist; the others torch knows (AVG,
    BXOR, PREMUL_SUM) through torch itself, as in Composer (gloo has no AVG or BXOR).

    Raises:
        AttributeError: a name that is not one of torch's ``ReduceOp`` (Composer's type).
        unidist.errors.ConfigurationTypeError: ``tensor`` is not a tensor (a TypeError).
        unidist.errors.ConfigurationRuntimeError: BAND or BOR of a floating-point tensor (a
            RuntimeError, torch's).
    """
    op = str(reduce_operation).upper()
    if op not in _OPS and not hasattr(dist.ReduceOp, op):
        raise AttributeError(
            f"all_reduce(reduce_operation={reduce_operation!r}) is not a name of torch's "
            f"ReduceOp; expected one of {[*_OPS, 'AVG', 'BXOR']} (any case). HINT: "
            "reduce_operation='SUM'."
        )
    if _serial("all_reduce"):
        return
    _tensor(tensor, "all_reduce")
    chosen = _group(group, "all_reduce")
    if op in _OPS:
        if chosen is None or get_global_rank() in chosen.ranks:  # torch skips an outsider
            check_bitwise(_OPS[op], tensor, "all_reduce")
        unidist.all_reduce(tensor, op=_OPS[op], group=chosen)
        return
    # Not one of unidist's reductions: torch's own, on the same group, as Composer does.
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=chosen.handle if chosen else None)


def broadcast(tensor: torch.Tensor, src: int, group: Any = None) -> None:
    """Overwrite ``tensor`` on every rank with global rank ``src``'s, in place.

    Raises:
        unidist.errors.ConfigurationTypeError: ``tensor`` is not a tensor, or ``src`` not an
            int (TypeErrors, torch's).
        unidist.errors.ConfigurationRuntimeError: ``src`` is not a rank of the world (a
            RuntimeError, torch's).
    """
    if _serial("broadcast"):
        return
    _tensor(tensor, "broadcast")
    src = _src(src, group, "broadcast")
    unidist.broadcast(tensor, src=src, group=_group(group, "broadcast"))


def broadcast_object_list(object_list: list[Any], src: int = 0, group: Any = None) -> None:
    """Replace ``object_list``'s items, in place, by those of rank ``src``.

    Raises:
        TypeError: ``object_list`` is not a list (it is filled in place).
        unidist.errors.ConfigurationTypeError: ``src`` is not an int, or pickle refuses an
            object with a TypeError.
        unidist.errors.ConfigurationRuntimeError: ``src`` is not a rank of the world.
        unidist.errors.ConfigurationAttributeError: pickle refuses an object with an
            AttributeError (a local function or class).
    """
    if not isinstance(object_list, list):
        raise TypeError(
            f"broadcast_object_list takes a list to fill in place, got "
            f"{type(object_list).__name__}. HINT: broadcast_object_list([obj]), or "
            "unidist.broadcast_object(obj), which returns it."
        )
    if _serial("broadcast_object_list"):
        return
    src = _src(src, group, "broadcast_object_list")
    try:
        sent = unidist.broadcast_object(list(object_list), src, group=_group(group, "broadcast"))
    except ConfigurationError as exc:
        raise pickles_type(exc) from exc.__cause__
    if len(sent) != len(object_list):
        raise ValueError(
            f"broadcast_object_list: rank {src} sent {len(sent)} objects into a list of "
            f"{len(object_list)} here; every rank passes a list of the same length."
        )
    object_list[:] = sent


def all_gather(tensor: torch.Tensor, group: Any = None) -> Sequence[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on each), as a list indexed by rank.

    Raises:
        unidist.errors.ConfigurationTypeError: ``tensor`` is not a tensor (a TypeError).
    """
    if _serial("all_gather"):
        return [tensor]
    _tensor(tensor, "all_gather")
    return unidist.all_gather(tensor, group=_group(group, "all_gather"))


def all_gather_object(obj: T, group: Any = None) -> list[T]:
    """Every rank's ``obj``, as a list indexed by rank.

    Raises:
        unidist.errors.ConfigurationAttributeError: pickle refuses ``obj`` with an
            AttributeError (a local function or class); ``ConfigurationTypeError`` with a
            TypeError (a lock).
    """
    if _serial("all_gather_object"):
        return [obj]
    try:
        return unidist.all_gather_object(obj, group=_group(group, "all_gather_object"))
    except ConfigurationError as exc:
        raise pickles_type(exc) from exc.__cause__


def all_gather_object_list_hpu(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill ``object_list`` with every rank's ``obj`` (Composer's HPU variant; any device here)."""
    object_list[:] = all_gather_object(obj, group=group)


# -- samplers ----------------------------------------------------------------------------------


def get_sampler(
    dataset: torch.utils.data.Dataset[Any],
    *,
    drop_last: bool = False,
    shuffle: bool = False,
    num_replicas: int | None = None,
    rank: int | None = None,
    seed: int = 0,
) -> torch.utils.data.DistributedSampler[Any]:
    """Composer's sampler: torch's ``DistributedSampler`` indices, epoch by epoch.

    A :class:`unidist.DistributedSampler` (a subclass of torch's), so it also resumes through
    ``state_dict()``.

    Raises:
        unidist.errors.ConfigurationTypeError: ``dataset`` has no ``len()`` (a TypeError, as
            torch's sampler raises; unidist's own ``get_sampler`` also takes a length).
    """
    check_sized(dataset, "get_sampler")
    return unidist.get_sampler(
        dataset,  # type: ignore[arg-type]  # a sized dataset, as torch's sampler needs
        shuffle=shuffle,
        drop_last=drop_last,
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
        order="torch",
    )


# -- local rank zero first, with signal files --------------------------------------------------


def get_node_signal_file_name(rng: random.Random | None = None) -> str:
    """A signal file name, the same on every rank (rank 0's random suffix is broadcast)."""
    rng = random.Random() if rng is None else rng
    suffix = "".join(rng.choices(string.ascii_letters + string.digits, k=6))
    names = [f"._signal_file_node{get_node_rank()}_{suffix}"]
    broadcast_object_list(names, src=0)
    return str(names[0])


def write_signal_file(signal_file_name: str, dir_path: str | None = None) -> str:
    """Local rank zero writes ``signal_file_name`` in ``dir_path`` (default: the working folder).

    Returns the file's path on every rank. The file is created, never followed through a link.
    """
    if dir_path is not None:
        os.makedirs(dir_path, exist_ok=True)
    path = os.path.join(dir_path or os.getcwd(), signal_file_name)
    if get_local_rank() == 0:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write("local rank zero done")
    return path


@contextlib.contextmanager
def local_rank_zero_download_and_wait(
    expected_file_path: str, *, timeout: float = WAIT_TIMEOUT
) -> Iterator[None]:
    """Ranks other than local rank zero wait until ``expected_file_path`` exists.

    ``timeout`` (unidist's; Composer waits for ever) bounds the wait.

    Raises:
        TimeoutError: the file did not appear in ``timeout`` seconds.
        PermissionError: the file that appeared belongs to another user (it was not this
            job's local rank zero that made it).
    """
    if get_local_rank() != 0:
        _wait_for_file(expected_file_path, timeout)
    yield


def _wait_for_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            info = None
        if info is not None:
            if info.st_uid != os.getuid() and os.getuid() != 0:
                raise PermissionError(
                    f"{path!r} appeared but belongs to uid {info.st_uid}, not this job's user "
                    f"({os.getuid()}); another user's file cannot end the wait. HINT: use a "
                    "folder only you can write to."
                )
            if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"local rank {get_local_rank()} waited {timeout:g} s for local rank zero to "
                f"create {path!r}, and it did not. HINT: check local rank zero's log; pass "
                "timeout= for longer downloads."
            )
        time.sleep(_POLL)


@contextlib.contextmanager
def busy_wait_for_local_rank_zero(dir_path: str | None = None) -> Iterator[None]:
    """Every rank runs the block; then local rank zero writes a signal file the others await.

    As Composer's: the file is removed by local rank zero after a barrier across all ranks.
    """
    name = get_node_signal_file_name()
    yield
    path = write_signal_file(name, dir_path=dir_path)
    with local_rank_zero_download_and_wait(path):
        barrier()
    if get_local_rank() == 0:
        os.remove(path)


@contextlib.contextmanager
def run_local_rank_zero_first() -> Iterator[None]:
    """Local rank zero of every node runs the block first, then the other ranks.

    A failure of local rank zero is raised on the others (``unidist.RemoteError``) instead of
    leaving them waiting.

    Raises:
        RuntimeError: several ranks but no live process group (Composer's error).
    """
    if _ready():
        with unidist.one_rank_first(0, local=True):
            yield
        return
    if get_world_size() == 1:
        yield
        return
    raise _not_ready()
