"""Ignite's ``ignite.distributed``, name for name and behaviour for behaviour, on unidist.

Swap ``import ignite.distributed as idist`` for ``import unidist.compat.ignite as idist`` and
the script and its tests keep working: ``all_gather`` concatenates tensors along dim 0 and
turns numbers into lists; ``broadcast`` sends numbers as float32 and takes ``safe_mode``;
``group=`` takes a list of ranks; ``auto_dataloader``'s ``batch_size`` is the global batch and
``num_workers`` is per node; the errors have Ignite's types, with messages that also give the
fix. The data moves through unidist's collectives, so a job started by ``unidist launch`` gets
its hang and failure reports, ``one_rank_first`` raises a failed first rank's error on the
ranks waiting for it, and every wait has a deadline. Ignite is not imported.

Where Ignite's behaviour cannot be kept, the call is refused with a ``TypeError`` or
``ValueError`` that names Ignite's behaviour and unidist's spelling: processes across several
nodes from ``spawn``/``Parallel`` (use ``unidist launch``), ``init_method="file://..."``,
``set_local_rank`` (deprecated in Ignite), and torch's ``new_group`` keywords.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import socket
import warnings
from collections.abc import Callable, Iterator, Sequence
from numbers import Number
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data.distributed import DistributedSampler

import unidist
from unidist.collectives.groups import Group
from unidist.compat._groups import as_group, remember
from unidist.compat._refusals import check_bitwise, check_sized, checked_src, pickles_type
from unidist.errors import ConfigurationAttributeError, ConfigurationError

__all__ = [
    "DistributedProxySampler",
    "Parallel",
    "all_gather",
    "all_gather_tensors_with_shapes",
    "all_reduce",
    "auto_dataloader",
    "auto_model",
    "auto_optim",
    "available_backends",
    "backend",
    "barrier",
    "broadcast",
    "device",
    "finalize",
    "get_local_rank",
    "get_nnodes",
    "get_node_rank",
    "get_nproc_per_node",
    "get_rank",
    "get_world_size",
    "has_hvd_support",
    "has_native_dist_support",
    "has_xla_support",
    "hostname",
    "initialize",
    "model_name",
    "new_group",
    "one_rank_first",
    "one_rank_only",
    "set_local_rank",
    "show_config",
    "spawn",
    "sync",
]

logger = logging.getLogger(__name__)

has_native_dist_support: bool = dist.is_available()
has_xla_support: bool = False  # unidist's xla device is unidist.device("xla"); not Ignite's model
has_hvd_support: bool = False  # unidist has no Horovod adapter

#: Ignite's reduction names (exact case, as Ignite's native model checks them) -> unidist's.
_OPS = {"SUM": "sum", "PRODUCT": "product", "MIN": "min", "MAX": "max", "AND": "band", "OR": "bor"}
#: The order Ignite lists its native backends in.
_NATIVE_ORDER = ("nccl", "gloo", "mpi")


def _serial() -> bool:
    """Ignite's serial model: one process and no process group.

    A process group of one rank is Ignite's native model (``backend()`` is its backend); a
    launcher's ``WORLD_SIZE=2`` before the group starts is a job of two to unidist, where
    Ignite reads it as serial until ``initialize`` (docs/migration/ignite.md).
    """
    return unidist.get_world_size() == 1 and not (dist.is_available() and dist.is_initialized())


# -- where this process runs -------------------------------------------------------------------


def get_rank() -> int:
    """Global rank (0 in one process)."""
    return unidist.get_rank()


def get_world_size() -> int:
    """Number of processes (1 in one process)."""
    return unidist.get_world_size()


def get_local_rank() -> int:
    """Rank on this node (0 in one process)."""
    return unidist.get_local_rank()


def get_nproc_per_node() -> int:
    """Processes on this node (1 in one process)."""
    return unidist.get_local_world_size()


def get_nnodes() -> int:
    """Number of nodes (1 in one process)."""
    return unidist.get_num_nodes()


def get_node_rank() -> int:
    """This node's rank (0 in one process)."""
    return unidist.get_node_rank()


def hostname() -> str:
    """This host's name."""
    return socket.gethostname()


def device() -> torch.device:
    """Ignite's device: the current CUDA device (``cuda`` in one process), MPS alone, or CPU."""
    if torch.cuda.is_available():
        if _serial():
            return torch.device("cuda")
        index = torch.cuda.current_device()
        if index < get_local_rank():
            warnings.warn(
                "Current device index is less than current local rank. Please, make sure to "
                "call torch.cuda.set_device(local_rank) (or use unidist.device()).",
                stacklevel=2,
            )
        return torch.device(f"cuda:{index}")
    if _serial() and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def backend() -> str | None:
    """The process group's backend (None in one process)."""
    return None if _serial() else unidist.backend()


def available_backends() -> tuple[str, ...]:
    """The backends this torch can use, in Ignite's order (nccl, gloo, mpi)."""
    usable = set(unidist.available_backends())
    return tuple(b for b in _NATIVE_ORDER if b in usable) + tuple(
        sorted(usable - set(_NATIVE_ORDER))
    )


def model_name() -> str:
    """Ignite's name of the computation model: ``serial`` or ``native-dist``."""
    return "serial" if _serial() else "native-dist"


def show_config() -> None:
    """Log the configuration at INFO, line by line, as Ignite does.

    Through Ignite's logger name and line format (``ignite.distributed.utils INFO: rank: 0``,
    to stderr), so whatever reads Ignite's lines keeps reading them.
    """
    log = _ignites_logger("ignite.distributed.utils")
    for key, value in (
        ("distributed configuration", model_name()),
        ("backend", backend()),
        ("device", device().type),
        ("hostname", hostname()),
        ("world size", get_world_size()),
        ("rank", get_rank()),
        ("local rank", get_local_rank()),
        ("num processes per_node", get_nproc_per_node()),
        ("num nodes", get_nnodes()),
        ("node rank", get_node_rank()),
    ):
        log.info("%s: %s", key, value)


def _ignites_logger(name: str) -> logging.Logger:
    """Ignite's ``setup_logger(name)``: INFO to stderr as ``time name LEVEL: message``."""
    log = logging.getLogger(name)
    if not any(getattr(h, "_unidist_compat", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        handler._unidist_compat = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(logging.INFO)
    return log


def set_local_rank(index: int) -> None:
    """Refused: deprecated in Ignite; the launcher's environment gives the local rank.

    Raises:
        TypeError: always, with unidist's spelling.
    """
    raise TypeError(
        f"set_local_rank({index!r}) is deprecated in Ignite and not kept here: the local rank "
        "comes from the launcher's environment (LOCAL_RANK, SLURM, MPI). HINT: start the "
        "processes with unidist launch, torchrun or Parallel; get_local_rank() reads it."
    )


# -- starting and stopping ---------------------------------------------------------------------


def sync(temporary: bool = False) -> None:
    """Nothing to do: unidist adopts a process group started elsewhere on first use."""
    del temporary


def initialize(backend: str, **kwargs: Any) -> None:
    """Start the process group from the launcher's environment, as Ignite's ``initialize``.

    Keywords: ``timeout`` (a ``timedelta`` or seconds), ``init_method`` (``env://`` or None),
    ``rank`` and ``world_size`` (must agree with the environment when it has them).

    Raises:
        ValueError: a backend torch cannot use here, or ``rank``/``world_size`` that contradict
            the launcher's variables.
        TypeError: ``init_method`` other than ``env://``, or a keyword Ignite does not take.
    """
    if backend not in available_backends():
        raise ValueError(f"Backend should be one of '{available_backends()}', got {backend!r}.")
    timeout = kwargs.pop("timeout", None)
    init_method = kwargs.pop("init_method", None)
    if init_method not in (None, "env://"):
        raise TypeError(
            f"initialize(init_method={init_method!r}): unidist meets the other ranks through "
            "the launcher's environment only. HINT: set MASTER_ADDR and MASTER_PORT (or start "
            "with unidist launch / torchrun) and drop init_method."
        )
    for key, read in (("rank", get_rank), ("world_size", get_world_size)):
        if key in kwargs and kwargs[key] != read():
            raise ValueError(
                f"initialize({key}={kwargs[key]!r}), but the launcher's environment says "
                f"{read()}. HINT: drop {key}= (unidist reads it from the launcher: RANK, "
                "WORLD_SIZE, ...), or start the processes with a launcher that sets it."
            )
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(
            f"initialize() got {sorted(kwargs)}; Ignite's native model takes timeout, "
            "init_method, rank and world_size."
        )
    unidist.initialize(backend, timeout=timeout)


def finalize() -> None:
    """End the process group (never hangs on torch 2.7's gloo teardown)."""
    unidist.finalize()


def _with_kwargs(
    fn: Callable[..., Any], kwargs_dict: dict[str, Any], local_rank: int, *args: Any
) -> Any:
    return fn(local_rank, *args, **kwargs_dict)


def spawn(
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs_dict: dict[str, Any] | None = None,
    nproc_per_node: int = 1,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    init_method: str | None = None,
    **kwargs: Any,
) -> None:
    """Start ``nproc_per_node`` processes here; each calls ``fn(local_rank, *args, **kwargs_dict)``.

    Through ``unidist.spawn``: the failing rank is named, and the processes meet on a port
    chosen free (Ignite's ``master_port``, 2222 by default, is not needed on one host). Every
    process starts with the process group initialised on ``backend``.

    Raises:
        TypeError: several nodes, another host's ``master_addr``, ``init_method`` (use
            ``unidist launch`` across nodes), ``join=False`` or ``daemon=True``.
        ValueError: a backend torch cannot use here, or ``nproc_per_node < 1``.
    """
    if backend not in available_backends():
        raise ValueError(f"Backend should be one of '{available_backends()}', got {backend!r}.")
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"Argument nproc_per_node should positive, but given {nproc_per_node}")
    refused = {
        "nnodes": nnodes != 1,
        "node_rank": node_rank != 0,
        # One host: the processes meet on loopback at a port unidist.spawn picks free, so an
        # address of this host and any port give the same run.
        "master_addr": master_addr not in (None, "127.0.0.1", "localhost", hostname()),
        "init_method": init_method not in (None, "env://"),
        "join": not kwargs.pop("join", True),
        "daemon": bool(kwargs.pop("daemon", False)),
    }
    kwargs.pop("start_method", None)  # unidist's launcher starts the processes its own way
    timeout = kwargs.pop("timeout", None)
    if any(refused.values()) or kwargs:
        names = [k for k, v in refused.items() if v] + sorted(kwargs)
        raise TypeError(
            f"spawn(): {names} are not kept by unidist.compat.ignite: it starts the processes "
            "of one host through unidist.spawn (free port, joined). HINT: across nodes, run "
            "the script with unidist launch --nnodes N --node-rank R --master-addr A."
        )
    target = functools.partial(_with_kwargs, fn, dict(kwargs_dict or {}))
    unidist.spawn(
        target, *args, nproc=nproc_per_node, backend=backend, timeout=timeout, pass_local_rank=True
    )


def _check_spawn(
    nproc_per_node: int,
    nnodes: int | None,
    node_rank: int | None,
    master_addr: str | None,
    master_port: int | None,
    init_method: str | None,
) -> None:
    """Ignite's checks of ``Parallel``'s spawn parameters (its ValueErrors, in its order)."""
    if nproc_per_node < 1:
        raise ValueError(f"Argument nproc_per_node should positive, but given {nproc_per_node}")
    nodes = 1 if nnodes is None else nnodes
    if nodes < 1:
        raise ValueError(f"Argument nnodes should positive, but given {nodes}")
    if node_rank is None and nodes > 1:
        raise ValueError("If number of nodes larger than one, arguments node_rank should be given")
    here = 0 if node_rank is None else node_rank
    if not 0 <= here < nodes:
        raise ValueError(
            f"Argument node_rank should be between 0 and {nodes - 1}, but given {node_rank}"
        )
    if nodes > 1 and (master_addr is None or master_port is None) and init_method is None:
        raise ValueError(
            "If number of nodes larger than one, arguments master_addr and master_port or "
            f"init_method should be specified, but given master_addr={master_addr}, "
            f"master_port={master_port} and init_method={init_method}."
        )


class Parallel:
    """Ignite's ``Parallel``: run a function in a distributed context, spawning or not.

    With ``nproc_per_node``, ``run`` spawns the processes (see :func:`spawn`); with a backend
    alone, the processes were started by a launcher and the context initialises and finalises
    the process group; with neither, ``run`` calls the function in this process.
    """

    def __init__(
        self,
        backend: str | None = None,
        nproc_per_node: int | None = None,
        nnodes: int | None = None,
        node_rank: int | None = None,
        master_addr: str | None = None,
        master_port: int | None = None,
        init_method: str | None = None,
        **spawn_kwargs: Any,
    ) -> None:
        given = {
            "nproc_per_node": nproc_per_node,
            "nnodes": nnodes,
            "node_rank": node_rank,
            "master_addr": master_addr,
            "master_port": master_port,
        }
        if backend is None:
            for name, value in given.items():
                if value is not None:
                    raise ValueError(
                        f"If backend is None, argument '{name}' should be also None, but "
                        f"given {value}"
                    )
        elif backend not in available_backends():
            raise ValueError(
                f"Unknown backend '{backend}'. Available backends: {available_backends()}"
            )
        if init_method is not None and init_method.startswith("tcp://"):
            raise ValueError(
                f"TCP initialization via init_method='{init_method}' will hang. To fix this, "
                "please configure MASTER_ADDR and MASTER_PORT in the environment and use "
                "'env://' (or omit init_method)."
            )
        if backend is not None and nproc_per_node is not None:
            _check_spawn(nproc_per_node, nnodes, node_rank, master_addr, master_port, init_method)
        self.backend = backend
        self.init_method = init_method
        self._spawn: dict[str, Any] | None = None
        if backend is not None and nproc_per_node is not None:
            self._spawn = {k: v for k, v in given.items() if v is not None}
            self._spawn.update(spawn_kwargs)
            if init_method is not None:
                self._spawn["init_method"] = init_method

    def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``func(local_rank, *args, **kwargs)`` in every process of the context."""
        if self._spawn is not None and self.backend is not None:
            spawn(self.backend, func, args=args, kwargs_dict=kwargs, **self._spawn)
        else:
            func(get_local_rank(), *args, **kwargs)

    def __enter__(self) -> Parallel:
        if self.backend is not None and self._spawn is None:
            initialize(self.backend, init_method=self.init_method)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.backend is not None and self._spawn is None:
            finalize()


# -- collectives -------------------------------------------------------------------------------


def _group(group: object, what: str) -> Group | None:
    chosen = as_group(group, what, lists=True)
    return None if isinstance(chosen, list) else chosen


def _outside(group: Group | None) -> bool:
    return group is not None and unidist.get_rank() not in group.ranks


def _to_tensor(value: Number) -> torch.Tensor:
    # Ignite's number handling: floats as float64, ints as torch's default (int64).
    dtype = torch.double if isinstance(value, float) else None
    return torch.tensor(value, device=device(), dtype=dtype)


def _on_device(fn: Callable[[torch.Tensor], torch.Tensor], tensor: torch.Tensor) -> torch.Tensor:
    """Run ``fn`` on a copy of ``tensor`` on :func:`device`, back on its own device (Ignite)."""
    home = tensor.device
    here = device()
    if home == here:
        return fn(tensor)
    return fn(tensor.to(here)).to(home)


def all_reduce(
    tensor: torch.Tensor | float, op: str = "SUM", group: Any | list[int] | None = None
) -> torch.Tensor | float:
    """Reduce a tensor (in place) or a number across ranks; ops SUM PRODUCT MIN MAX AND OR.

    A number comes back as a number (a float stays a float, an int an int); a rank outside
    ``group`` gets its value back.

    Raises:
        TypeError: neither a tensor nor a number.
        ValueError: an op Ignite does not take (exact case), or a bad ``group``.
        unidist.errors.ConfigurationRuntimeError: AND or OR of floating-point values (a
            RuntimeError, torch's).
    """
    if _serial():
        return tensor
    if not isinstance(tensor, torch.Tensor | Number):
        raise TypeError(
            f"Unhandled input type {type(tensor)}: all_reduce takes a tensor or a number. "
            "HINT: for other objects, all_gather(obj) and reduce the list."
        )
    chosen = _group(group, "all_reduce")
    if op not in _OPS:
        raise ValueError(
            f"Unsupported reduction operation: '{op}' (expected one of {list(_OPS)}, upper "
            "case, as Ignite)."
        )
    if _outside(chosen):
        # Ignite calls torch's all_reduce here, which warns and leaves the value as it is.
        warnings.warn(
            f"Running all_reduce on global rank {get_rank()} which does not belong to the "
            "given group.",
            stacklevel=2,
        )
        return tensor
    check_bitwise(_OPS[op], tensor, "all_reduce")
    if isinstance(tensor, torch.Tensor):
        return _on_device(lambda t: unidist.all_reduce(t, op=_OPS[op], group=chosen), tensor)
    reduced = unidist.all_reduce(_to_tensor(tensor), op=_OPS[op], group=chosen)
    return cast(float, reduced.tolist())


def all_gather(
    tensor: torch.Tensor | float | str | Any, group: Any | list[int] | None = None
) -> torch.Tensor | float | list[float] | list[str] | list[Any]:
    """Gather from every rank: tensors concatenated along dim 0, numbers and strings as lists.

    A 0-d tensor gathers into a tensor of shape ``(world_size,)``; other objects are gathered
    with ``all_gather_object`` into a list. A rank outside ``group`` gets its value back.

    Raises:
        unidist.errors.ConfigurationAttributeError: pickle refuses the object with an
            AttributeError (a local function or class); ``ConfigurationTypeError`` with a
            TypeError (a lock).
    """
    if _serial():
        return tensor if isinstance(tensor, torch.Tensor) else [tensor]
    chosen = _group(group, "all_gather")
    if _outside(chosen):
        return tensor if not isinstance(tensor, str) else [tensor]
    if isinstance(tensor, torch.Tensor):
        return _on_device(lambda t: _cat(t, chosen), tensor)
    if isinstance(tensor, Number):
        return cast(list[float], _cat(_to_tensor(tensor), chosen).tolist())
    try:
        return unidist.all_gather_object(tensor, group=chosen)
    except ConfigurationError as exc:
        raise pickles_type(exc) from exc.__cause__


def _cat(tensor: torch.Tensor, group: Group | None) -> torch.Tensor:
    part = tensor.unsqueeze(0) if tensor.ndim == 0 else tensor
    return torch.cat(unidist.all_gather(part, group=group), dim=0)


def all_gather_tensors_with_shapes(
    tensor: torch.Tensor, shapes: Sequence[Sequence[int]], group: Any | list[int] | None = None
) -> list[torch.Tensor]:
    """Gather tensors whose shapes differ by rank (same number of dimensions); ``shapes`` says them.

    Raises:
        ValueError: ``shapes`` does not have one entry per rank of the group, or this rank's
            entry is not its tensor's shape.
    """
    chosen = _group(group, "all_gather_tensors_with_shapes")
    if _outside(chosen):
        return [tensor]
    size = chosen.size if chosen is not None else get_world_size()
    me = chosen.rank_of(get_rank()) if chosen is not None else get_rank()
    if len(shapes) != size or me is None or list(shapes[me]) != list(tensor.shape):
        raise ValueError(
            f"all_gather_tensors_with_shapes: shapes={[list(s) for s in shapes]} needs one shape "
            f"per rank of the group ({size}), this rank's ({me}) being its tensor's "
            f"{list(tensor.shape)}. HINT: unidist.all_gather_uneven(t) needs no shapes when "
            "only dim 0 differs."
        )
    largest = [max(dims) for dims in zip(*shapes, strict=True)]
    padding: list[int] = []
    for have, want in reversed(list(zip(tensor.shape, largest, strict=True))):
        padding += [0, want - have]
    padded = torch.nn.functional.pad(tensor, padding)
    gathered = unidist.all_gather(padded, group=chosen)
    return [t[tuple(slice(0, n) for n in shape)] for t, shape in zip(gathered, shapes, strict=True)]


def broadcast(
    tensor: torch.Tensor | float | str | Path | None, src: int = 0, safe_mode: bool = False
) -> torch.Tensor | float | str | Path:
    """Send a tensor, number, string or path from rank ``src``; numbers arrive as floats (float32).

    Without ``safe_mode`` every rank passes a placeholder of the source's type (and, for a
    tensor, shape and dtype); with it, the other ranks may pass anything, ``None`` included.

    Raises:
        TypeError: a value Ignite cannot broadcast (a list, a dict, ...).
        ValueError: ``None`` on the source, or ``None`` elsewhere without ``safe_mode``.
        unidist.errors.ConfigurationRuntimeError: ``src`` is not a rank of the world (a
            RuntimeError, torch's); ``ConfigurationTypeError`` when it is not an int.
    """
    if _serial():  # Ignite's serial model returns any value but None as it is
        if tensor is None:
            raise ValueError("Argument tensor should not be None")
        return tensor
    if not (isinstance(tensor, torch.Tensor | Number | str | Path) or tensor is None):
        raise TypeError(
            f"Unhandled input type {type(tensor)}: broadcast takes a tensor, a number, a str "
            "or a Path. HINT: unidist.broadcast_object(obj, src) sends any picklable object."
        )
    rank = get_rank()
    if tensor is None:
        if rank == src:
            raise ValueError("Source data can not be None")
        if not safe_mode:
            raise ValueError("Argument safe_mode should be True if None is passed for non src rank")
    src = checked_src(src, get_world_size(), "broadcast")
    if safe_mode:
        tensor = _placeholder(tensor, src, rank == src)
    if isinstance(tensor, Number):
        value = [tensor] if rank == src else [0.0]
        sent = unidist.broadcast(torch.tensor(value, device=device(), dtype=torch.float), src)
        return cast(float, sent.item())
    if isinstance(tensor, str | Path):
        text = unidist.broadcast_object(str(tensor) if rank == src else "", src)
        return Path(text) if isinstance(tensor, Path) else text
    return _on_device(lambda t: unidist.broadcast(t, src), cast(torch.Tensor, tensor))


def _placeholder(value: Any, src: int, is_src: bool) -> Any:
    """The other ranks' placeholder for the source's value (Ignite's ``safe_mode``)."""
    kind: tuple[Any, ...] = ()
    if is_src:
        if isinstance(value, torch.Tensor):
            kind = ("tensor", list(value.shape), str(value.dtype).removeprefix("torch."))
        else:
            kind = ("number",) if isinstance(value, Number) else ("path",)
            kind = ("str",) if isinstance(value, str) else kind
    kind = tuple(unidist.broadcast_object(list(kind), src))
    if is_src:
        return value
    if kind[0] == "tensor":
        return torch.empty(kind[1], device=device(), dtype=getattr(torch, kind[2]))
    return {"number": 0.0, "str": "", "path": Path("")}[kind[0]]


def barrier() -> None:
    """Wait for every rank (with unidist's deadline, naming the ranks that did not arrive)."""
    if not _serial():
        unidist.barrier()


def new_group(ranks: list[int], **kwargs: Any) -> Any:
    """A group of ``ranks`` for ``group=`` (in one process, the list itself, as Ignite).

    Raises:
        ValueError: ``ranks`` is not a list of int.
        TypeError: torch's ``new_group`` keywords (unidist's groups use the session's backend
            and timeout).
    """
    if not (isinstance(ranks, list) and all(isinstance(r, int) for r in ranks)):
        raise ValueError(f"Argument ranks should be list of int, got {ranks!r:.80}")
    if kwargs:
        raise TypeError(
            f"new_group(ranks, {', '.join(sorted(kwargs))}=...): unidist's groups use the "
            "session's backend and timeout. HINT: new_group(ranks)."
        )
    if _serial():
        return ranks
    # Ignite gives torch's ProcessGroup (with its .rank() and .size()); group= takes it back.
    return remember(unidist.new_group(ranks))


def one_rank_only(rank: int = 0, with_barrier: bool = False) -> Callable[..., Any]:
    """Decorator: run the function on ``rank`` only (others get None), then a barrier if asked."""
    return unidist.one_rank_only(rank, barrier=with_barrier)


@contextlib.contextmanager
def one_rank_first(rank: int = 0, local: bool = False) -> Iterator[None]:
    """``rank`` (a local rank with ``local=True``) runs the block before the others.

    Raises:
        ValueError: ``rank`` is not a rank of the world (of the node with ``local=True``).
        unidist.RemoteError: on the waiting ranks, when the first rank failed in the block.
    """
    size = get_nproc_per_node() if local else get_world_size()
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank should be between 0 and {size - 1}, but given {rank}")
    with unidist.one_rank_first(rank, local=local):
        yield


# -- data, model, optimizer --------------------------------------------------------------------


class DistributedProxySampler(DistributedSampler[Any]):
    """Ignite's proxy: shard any sampler's output across ranks, epoch by epoch.

    As Ignite's, each epoch seeds torch's global generator with the epoch before drawing the
    wrapped sampler, so a ``RandomSampler`` inside draws the same order on every rank;
    :class:`unidist.DistributedSamplerWrapper` does the same without touching the global
    generator (and resumes).
    """

    def __init__(
        self, sampler: Sampler[Any], num_replicas: int | None = None, rank: int | None = None
    ) -> None:
        if not isinstance(sampler, Sampler):
            raise TypeError(
                f"Argument sampler should be instance of torch Sampler, but given: {type(sampler)}"
            )
        if isinstance(sampler, DistributedSampler):
            raise TypeError("Argument sampler must not be a distributed sampler already")
        if not hasattr(sampler, "__len__"):
            raise TypeError("Argument sampler should have length")
        world = get_world_size() if num_replicas is None else num_replicas
        here = get_rank() if rank is None else rank
        super().__init__(cast(Dataset[Any], sampler), num_replicas=world, rank=here, shuffle=False)
        self.sampler = sampler

    def __iter__(self) -> Iterator[Any]:
        torch.manual_seed(self.epoch)
        drawn: list[Any] = []
        while len(drawn) < self.total_size:
            drawn += list(self.sampler)
        mine = drawn[: self.total_size][self.rank : self.total_size : self.num_replicas]
        if len(mine) != self.num_samples:
            raise RuntimeError(
                f"the wrapped sampler's length changed: {len(mine)} indices for rank "
                f"{self.rank}, expected {self.num_samples}"
            )
        return iter(mine)


def auto_dataloader(dataset: Dataset[Any], **kwargs: Any) -> DataLoader[Any]:
    """Ignite's ``auto_dataloader``: ``batch_size`` global, ``num_workers`` per node.

    With several ranks: ``batch_size`` becomes ``batch_size // world_size`` when at least the
    world size (kept otherwise); ``num_workers`` becomes ``ceil(num_workers / nproc_per_node)``
    when at least ``nproc_per_node``; a map-style dataset gets torch's ``DistributedSampler``
    order (``shuffle`` by default), a user's sampler is wrapped in
    :class:`DistributedProxySampler`, a distributed sampler is kept (with Ignite's warning when
    it was built for another rank or world size); a ``batch_sampler`` is used as given. In one
    process, DataLoader's own behaviour. The loader is a :class:`unidist.StatefulDataLoader`.
    """
    world = get_world_size()
    if world > 1:
        if isinstance(kwargs.get("batch_size"), int) and kwargs["batch_size"] >= world:
            kwargs["batch_size"] //= world
        nproc = get_nproc_per_node()
        if isinstance(kwargs.get("num_workers"), int) and kwargs["num_workers"] >= nproc:
            kwargs["num_workers"] = math.ceil(kwargs["num_workers"] / nproc)
        if "batch_sampler" in kwargs:
            warnings.warn(
                "Found batch_sampler in provided kwargs. Please, make sure that it is "
                "compatible with distributed configuration",
                stacklevel=2,
            )
        elif isinstance(dataset, IterableDataset):
            logger.info(
                "Found iterable dataset, dataloader will be created without any distributed "
                "sampling. Please, make sure that the dataset itself produces different data on "
                "different ranks (unidist.shard_iterable does it)."
            )
        else:
            kwargs["sampler"] = _distributed(dataset, kwargs, world)
    kwargs.setdefault("pin_memory", "cuda" in device().type)
    logger.info("Use data loader kwargs for dataset '%s': %s", repr(dataset)[:20].strip(), kwargs)
    return unidist.StatefulDataLoader(dataset, **kwargs)


def _distributed(dataset: Dataset[Any], kwargs: dict[str, Any], world: int) -> Sampler[Any]:
    rank = get_rank()
    sampler = kwargs.get("sampler")
    if isinstance(sampler, DistributedSampler):
        if sampler.rank != rank:
            warnings.warn(
                f"Found distributed sampler with rank={sampler.rank}, but process rank is {rank}",
                stacklevel=3,
            )
        if sampler.num_replicas != world:
            warnings.warn(
                f"Found distributed sampler with num_replicas={sampler.num_replicas}, but world "
                f"size is {world}",
                stacklevel=3,
            )
        return sampler
    if sampler is None:
        check_sized(dataset, "auto_dataloader")  # torch's DistributedSampler, in Ignite's
        shuffle = kwargs.pop("shuffle", True)
        return unidist.DistributedSampler(
            cast(Any, dataset), num_replicas=world, rank=rank, shuffle=shuffle, order="torch"
        )
    return DistributedProxySampler(sampler, num_replicas=world, rank=rank)


def auto_model(model: torch.nn.Module, sync_bn: bool = False, **kwargs: Any) -> torch.nn.Module:
    """Ignite's ``auto_model``: on the device, DDP with several ranks (``kwargs`` go to DDP).

    In one process with several GPUs, ``DataParallel`` (as Ignite).

    Raises:
        unidist.errors.ConfigurationAttributeError: ``model`` is not a ``torch.nn.Module`` (an
            AttributeError, as Ignite's reading its parameters).
    """
    if not isinstance(model, torch.nn.Module):
        raise ConfigurationAttributeError(
            f"auto_model: {type(model).__name__!r} object has no attribute 'parameters': "
            f"expected a torch.nn.Module, got {type(model).__name__} {model!r:.40} (Ignite's "
            "raises AttributeError here). HINT: pass the model itself, built before the call."
        )
    if _serial() and torch.cuda.device_count() > 1:
        return torch.nn.DataParallel(model.to(device()), **kwargs)
    return unidist.auto_model(model, sync_batchnorm=sync_bn, **kwargs)


def auto_optim(optimizer: torch.optim.Optimizer, **kwargs: Any) -> torch.optim.Optimizer:
    """Ignite's ``auto_optim``: the optimizer itself for torch's native backends."""
    return unidist.auto_optim(optimizer, **kwargs)
