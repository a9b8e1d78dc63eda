"""Collectives over an adapter's primitives, on a session given explicitly.

:mod:`unidist.collectives` checks the arguments, finds the active session and the group, and calls
these; :func:`unidist.initialize` calls them on the session it is still building (its survey of
the ranks and the control store's port travel here), so start-up never publishes a session that
is not finished. ``size``, ``handle`` and ``control`` describe the group (the whole world:
``world_size``, ``None`` and ``session.control``).

What is written once here for every adapter: tensors are staged (made contiguous, moved to the
GPU for nccl) and copied back, bools travel as bytes, Python numbers as tensors of a dtype that
holds them, objects as pickled bytes over the gloo control group (unpickled as torch's object
collectives do: for trusted ranks only, see ``docs/trust-model.md``), and ``torch.distributed``
failures become unidist errors (:func:`unidist.errors.translate_errors`).
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from unidist.errors import ConfigurationError, RemoteError, translate_errors

if TYPE_CHECKING:
    import torch

    from unidist.adapters.base import Adapter, PrimitiveOp
    from unidist.environments.variables import Topology

__all__ = [
    "MAX_DIMS",
    "broadcast_bytes",
    "broadcast_object",
    "broadcast_tensor",
    "gather",
    "gather_object",
    "gather_uneven",
    "reduce_number",
    "reduce_tensor",
]

T = TypeVar("T")


class Primitives(Protocol):
    """The data movers of a session's communicator (:mod:`unidist.session.communicator`): every
    collective here reaches the adapter through them, never the adapter directly."""

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, handle: Any) -> torch.Tensor: ...
    def all_gather(self, tensor: torch.Tensor, handle: Any) -> list[torch.Tensor]: ...
    def broadcast(self, tensor: torch.Tensor, src: int, handle: Any) -> torch.Tensor: ...


class SessionView(Protocol):
    """What these functions read of a session (:class:`unidist.session.state.Session` has it).

    A protocol, not an import: the transport sits below :mod:`unidist.session.state`, which
    holds the control plane.
    """

    @property
    def adapter(self) -> Adapter: ...
    @property
    def comm(self) -> Primitives: ...
    @property
    def backend(self) -> str | None: ...
    @property
    def topology(self) -> Topology: ...


#: Longest shape gather_uneven can describe.
MAX_DIMS = 16


def _staged(
    session: SessionView, tensor: torch.Tensor, *, on_control: bool = False
) -> torch.Tensor:
    """``tensor`` as the backend takes it: contiguous, and on the GPU for nccl.

    The control group is gloo and takes CPU tensors, so control messages stay where they are.
    """
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    if session.backend == "nccl" and not on_control and work.device.type != "cuda":
        work = work.cuda()
    return work


def _in_place(
    work: torch.Tensor,
    tensor: torch.Tensor,
    what: str,
    primitive: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """Run ``primitive`` on the staged ``work`` and leave its result in ``tensor``."""
    with translate_errors(what):
        result = primitive(work)
    if result is not work:
        work.copy_(result)  # the adapter returned a new tensor
    if work is not tensor and work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work)  # ran on a contiguous or device copy


# -- reductions --------------------------------------------------------------------------------


def _check_dtype(tensor: torch.Tensor, op: str) -> None:
    import torch

    if op == "mean" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise ConfigurationError(
            f"op='mean' needs a floating-point tensor to hold the result, got {tensor.dtype}. "
            "HINT: reduce tensor.float(), or use op='sum' and divide yourself."
        )
    if op in ("band", "bor") and (tensor.is_floating_point() or tensor.is_complex()):
        raise ConfigurationError(
            f"op={op!r} is bitwise and needs an integer or bool tensor, got {tensor.dtype}."
        )
    if tensor.dtype == torch.bool and op in ("sum", "product", "mean"):
        raise ConfigurationError(
            f"op={op!r} on a bool tensor cannot be stored in bool. HINT: reduce tensor.int(), "
            "or use band/bor (all/any) or min/max."
        )


def reduce_tensor(
    session: SessionView, tensor: torch.Tensor, op: str, size: int, handle: Any
) -> torch.Tensor:
    """Reduce ``tensor`` in place with ``op`` (a canonical name; ``mean`` is built on ``sum``)."""
    import torch

    _check_dtype(tensor, op)
    if size == 1:
        return tensor
    work = _staged(session, tensor)
    if work.dtype == torch.bool:
        work = work.view(torch.uint8)  # gloo has no bool reductions; 0/1 bytes reduce the same
    primitive = "sum" if op == "mean" else op
    _in_place(
        work,
        tensor,
        f"all_reduce(op={op!r}) over {size} ranks",
        lambda staged: session.comm.all_reduce(staged, primitive, handle),  # type: ignore[arg-type]
    )
    if op == "mean":
        tensor.div_(size)
    return tensor


def reduce_number(
    session: SessionView, value: bool | int | float, op: str, size: int, handle: Any
) -> bool | int | float:
    """Reduce a Python number; the result has the same type (``mean`` gives a float)."""
    import torch

    kind: type[bool] | type[int] | type[float]
    if isinstance(value, bool) and op in ("band", "bor", "min", "max"):
        dtype, kind = torch.uint8, bool
    elif isinstance(value, float) or op == "mean":
        dtype, kind = torch.float64, float
    else:
        dtype, kind = torch.int64, int
    if op in ("band", "bor") and dtype == torch.float64:
        raise ConfigurationError(f"op={op!r} is bitwise and needs an int or bool, got {value!r}.")
    if dtype == torch.int64 and not -(2**63) <= value < 2**63:
        # Checked here: torch itself raises RuntimeError (2.7) or ValueError (2.14) for this.
        raise ConfigurationError(
            f"all_reduce cannot carry {value!r}: it does not fit in {dtype}. HINT: reduce a "
            "float, or split the number into parts that fit in 64 bits."
        )
    tensor = torch.tensor([value], dtype=dtype)
    reduce_tensor(session, tensor, op, size, handle)
    return kind(tensor.item())


# -- gathers -----------------------------------------------------------------------------------


def gather(
    session: SessionView,
    tensor: torch.Tensor,
    size: int,
    handle: Any,
    what: str,
    *,
    on_control: bool = False,
) -> list[torch.Tensor]:
    """Same-shaped tensors from every rank of the group, in rank order, on ``tensor``'s device."""
    device = tensor.device
    work = _staged(session, tensor, on_control=on_control)
    with translate_errors(f"{what} over {size} ranks"):
        out = session.comm.all_gather(work, handle)
    if len(out) != size:
        raise RemoteError(
            f"adapter {session.adapter.name!r} returned {len(out)} tensors from all_gather over "
            f"{size} ranks. HINT: the adapter breaks the contract; run "
            "unidist.testing.check_adapter on it."
        )
    return [t.to(device) for t in out] if work.device != device else out


def gather_uneven(
    session: SessionView,
    tensor: torch.Tensor,
    size: int,
    handle: Any,
    control: Any,
    *,
    on_control: bool = False,
) -> list[torch.Tensor]:
    """Tensors whose first dimension may differ per rank (shapes travel first, as a descriptor)."""
    import torch

    descriptor = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
    descriptor[0] = tensor.dim()
    descriptor[1] = _dtypes().index(tensor.dtype) if tensor.dtype in _dtypes() else -1
    descriptor[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    rows = [
        d.tolist()
        for d in gather(session, descriptor, size, control, "all_gather_uneven", on_control=True)
    ]
    shapes = [tuple(row[2 : 2 + row[0]]) for row in rows]
    if len({(row[0], row[1], *row[3 : 2 + row[0]]) for row in rows}) != 1:
        described = ", ".join(
            f"rank {r}: {_dtypes()[row[1]] if row[1] >= 0 else '?'}{list(shape)}"
            for r, (row, shape) in enumerate(zip(rows, shapes, strict=True))
        )
        raise ConfigurationError(
            "all_gather_uneven needs the same dtype and trailing dimensions on every rank; only "
            f"the first dimension may differ. Got {described}."
        )
    longest = max(shape[0] for shape in shapes)
    if longest == 0:
        return [tensor.new_empty(shape) for shape in shapes]
    padded = tensor.new_zeros((longest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    gathered = gather(session, padded, size, handle, "all_gather_uneven", on_control=on_control)
    return [t[: shape[0]] for t, shape in zip(gathered, shapes, strict=True)]


def gather_object(session: SessionView, obj: T, size: int, control: Any) -> list[T]:
    """Any picklable object from every rank, over the control group, in rank order."""
    payload = _to_bytes(obj)  # also alone: an unpicklable object fails the same way everywhere
    if size == 1:
        return [obj]
    parts = gather_uneven(session, payload, size, control, control, on_control=True)
    return [pickle.loads(part.numpy().tobytes()) for part in parts]


# -- broadcasts --------------------------------------------------------------------------------


def broadcast_tensor(
    session: SessionView, value: torch.Tensor, src: int, size: int, handle: Any
) -> torch.Tensor:
    """Overwrite ``value`` with global rank ``src``'s, in place."""
    if size == 1:
        return value
    _in_place(
        _staged(session, value),
        value,
        f"broadcast from rank {src} over {size} ranks",
        lambda staged: session.comm.broadcast(staged, src, handle),
    )
    return value


def broadcast_object(session: SessionView, obj: T, src: int, size: int, control: Any) -> T:
    """Global rank ``src``'s picklable object, over the control group."""
    is_src = session.topology.rank == src
    payload = _to_bytes(obj) if is_src else None  # also alone, so failures match everywhere
    if size == 1:
        return obj
    data = payload.numpy().tobytes() if payload is not None else None
    what = f"broadcast_object from rank {src} over {size} ranks"
    received: T = pickle.loads(broadcast_bytes(session, data, src, size, control, what))
    return obj if is_src else received


def broadcast_bytes(
    session: SessionView, data: bytes | None, src: int, size: int, control: Any, what: str
) -> bytes:
    """Global rank ``src``'s bytes (``data`` there; ignored elsewhere), over the control group.

    Nothing is unpickled: start-up uses it to hand out the control store's address and secret.
    """
    import torch

    if size == 1:
        return data or b""
    is_src = session.topology.rank == src
    length = torch.tensor([len(data or b"") if is_src else 0], dtype=torch.int64)
    with translate_errors(what):
        length = session.comm.broadcast(length, src, control)
        count = int(length.item())
        payload = torch.empty(count, dtype=torch.uint8)
        if is_src and count:
            payload = torch.frombuffer(bytearray(data or b""), dtype=torch.uint8)
        payload = session.comm.broadcast(payload, src, control)
    return bytes(payload.numpy().tobytes())


def _to_bytes(obj: object) -> torch.Tensor:
    import torch

    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ConfigurationError(
            f"cannot send {type(obj).__name__}: it is not picklable ({exc})."
        ) from exc
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@functools.cache
def _dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes gather_uneven's descriptor can name, by index."""
    import torch

    return (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
