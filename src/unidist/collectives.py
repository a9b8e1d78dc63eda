"""Collectives for tensors, Python numbers and objects, written once above the adapters.

Barriers and exchanges live in :mod:`unidist.sync`, groups in :mod:`unidist.groups`.

Every function works unchanged in a single process (the identity), accepts a :class:`Group` from
:func:`new_group`, and sizes its results by that group. Object collectives and size exchanges
travel over a gloo "control" group, so they need no CUDA device and never touch NCCL.
"""

from __future__ import annotations

import functools
import pickle
from typing import TYPE_CHECKING, Any, TypeVar

from unidist import _state
from unidist.adapters.base import REDUCE_OPS
from unidist.errors import ConfigurationError, RemoteError
from unidist.groups import Group, fail, members

if TYPE_CHECKING:
    import torch

    from unidist._state import Session

__all__ = [
    "all_gather",
    "all_gather_object",
    "all_gather_uneven",
    "all_reduce",
    "broadcast",
    "broadcast_object",
]

T = TypeVar("T")
#: Accepted spellings of each op ("sum", "SUM", "Sum" ...).
_OP_NAMES = {name: name for name in REDUCE_OPS} | {name.upper(): name for name in REDUCE_OPS}
#: Longest shape all_gather_uneven can describe.
_MAX_DIMS = 16


def _op(op: str) -> str:
    name = _OP_NAMES.get(op) if isinstance(op, str) else None
    if name is None:
        name = _OP_NAMES.get(op.lower()) if isinstance(op, str) else None
    if name is None:
        raise ConfigurationError(
            f"op={op!r} is not a reduction unidist knows; expected one of {', '.join(REDUCE_OPS)}."
        )
    return name


# -- all_reduce --------------------------------------------------------------------------------


def all_reduce(value: T, op: str = "sum", *, group: Group | None = None) -> T:
    """Reduce a tensor or a Python number across ranks.

    Tensors are reduced in place (like ``torch.distributed.all_reduce``) and returned. Python
    numbers come back as the same type (``int`` stays ``int``); ``mean`` always gives a float.

    Args:
        value: a tensor, or an ``int``, ``float`` or ``bool``.
        op: ``sum``, ``mean``, ``min``, ``max``, ``product``, ``band`` or ``bor`` (any case).
            ``mean`` needs a floating-point tensor; ``band``/``bor`` need integers or bools.
        group: reduce over this group instead of the whole world.

    Returns:
        The reduced value; the input itself for tensors.

    Raises:
        ConfigurationError: unknown op, or an op the dtype cannot hold.
        NotInitializedError: several processes are expected but no process group exists.
    """
    import torch

    s = _state.session("all_reduce")
    name = _op(op)
    size, handle, _ = members(s, group, "all_reduce")
    if isinstance(value, torch.Tensor):
        return _reduce_tensor(s, value, name, size, handle)  # type: ignore[return-value]
    if isinstance(value, bool | int | float):
        return _reduce_number(s, value, name, size, handle)  # type: ignore[return-value]
    raise ConfigurationError(
        f"all_reduce takes a tensor or a Python number, got {type(value).__name__}. "
        "HINT: use all_gather_object for other objects."
    )


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


def _reduce_tensor(
    s: Session, tensor: torch.Tensor, op: str, size: int, handle: Any
) -> torch.Tensor:
    import torch

    _check_dtype(tensor, op)
    if size == 1:
        return tensor
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    if work.dtype == torch.bool:
        work = work.view(torch.uint8)  # gloo has no bool reductions; 0/1 bytes reduce the same
    if s.backend == "nccl" and work.device.type != "cuda":
        work = work.cuda()
    primitive = "sum" if op == "mean" else op
    try:
        result = s.adapter.all_reduce(work, primitive, handle)  # type: ignore[arg-type]
    except RuntimeError as exc:
        raise fail(exc, f"all_reduce(op={op!r}) over {size} ranks") from exc
    if result is not work:
        work.copy_(result)  # the adapter returned a new tensor
    if work.data_ptr() != tensor.data_ptr():
        tensor.copy_(work)  # reduced a contiguous or device copy
    if op == "mean":
        tensor.div_(size)
    return tensor


def _reduce_number(
    s: Session, value: bool | int | float, op: str, size: int, handle: Any
) -> bool | int | float:
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
    _reduce_tensor(s, tensor, op, size, handle)
    return kind(tensor.item())


# -- gathers -----------------------------------------------------------------------------------


def all_gather(tensor: torch.Tensor, *, group: Group | None = None) -> list[torch.Tensor]:
    """Gather a tensor of the same shape and dtype from every rank.

    Args:
        tensor: this rank's contribution.
        group: gather over this group instead of the whole world.

    Returns:
        One new tensor per rank of the group, in rank order (``[tensor.clone()]`` alone).
    """
    import torch

    s = _state.session("all_gather")
    size, handle, _ = members(s, group, "all_gather")
    if not isinstance(tensor, torch.Tensor):
        raise ConfigurationError(
            f"all_gather takes a tensor, got {type(tensor).__name__}. "
            "HINT: use all_gather_object for Python objects."
        )
    if size == 1:
        return [tensor.clone()]
    return _gather(s, tensor, size, handle, "all_gather")


def _gather(
    s: Session, tensor: torch.Tensor, size: int, handle: Any, what: str, *, control: bool = False
) -> list[torch.Tensor]:
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    device = work.device
    if s.backend == "nccl" and not control and device.type != "cuda":
        work = work.cuda()  # the control group is gloo and takes CPU tensors
    try:
        out = s.adapter.all_gather(work, handle)
    except RuntimeError as exc:
        raise fail(exc, f"{what} over {size} ranks") from exc
    if len(out) != size:
        raise RemoteError(
            f"adapter {s.adapter.name!r} returned {len(out)} tensors from all_gather over "
            f"{size} ranks. HINT: the adapter breaks the contract; run "
            "unidist.testing.check_adapter on it."
        )
    return [t.to(device) for t in out] if work.device != device else out


def all_gather_uneven(tensor: torch.Tensor, *, group: Group | None = None) -> list[torch.Tensor]:
    """Gather tensors whose first dimension may differ per rank (same dtype and trailing dims).

    Args:
        tensor: this rank's contribution, at least one-dimensional.
        group: gather over this group instead of the whole world.

    Returns:
        One tensor per rank of the group, in rank order, each with its sender's shape.

    Raises:
        ConfigurationError: a 0-d tensor, or ranks disagree on dtype or trailing dimensions
            (the message lists every rank's shape).
    """
    import torch

    s = _state.session("all_gather_uneven")
    size, handle, control = members(s, group, "all_gather_uneven")
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise ConfigurationError(
            "all_gather_uneven takes a tensor with at least one dimension, got "
            f"{getattr(tensor, 'shape', type(tensor).__name__)}. HINT: use all_gather for "
            "same-shaped tensors, or tensor.reshape(1) for a scalar."
        )
    if tensor.dim() > _MAX_DIMS:
        raise ConfigurationError(
            f"all_gather_uneven supports up to {_MAX_DIMS} dims, got {tensor.dim()}."
        )
    if size == 1:
        return [tensor.clone()]
    return _gather_uneven(s, tensor, size, handle, control)


def _gather_uneven(
    s: Session,
    tensor: torch.Tensor,
    size: int,
    handle: Any,
    control: Any,
    *,
    on_control: bool = False,
) -> list[torch.Tensor]:
    import torch

    descriptor = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64)
    descriptor[0] = tensor.dim()
    descriptor[1] = _dtypes().index(tensor.dtype) if tensor.dtype in _dtypes() else -1
    descriptor[2 : 2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    rows = [
        d.tolist() for d in _gather(s, descriptor, size, control, "all_gather_uneven", control=True)
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
    gathered = _gather(s, padded, size, handle, "all_gather_uneven", control=on_control)
    return [t[: shape[0]] for t, shape in zip(gathered, shapes, strict=True)]


def all_gather_object(obj: T, *, group: Group | None = None) -> list[T]:
    """Gather any picklable object from every rank (over the gloo control group).

    Returns:
        One object per rank of the group, in rank order (``[obj]`` alone).
    """
    s = _state.session("all_gather_object")
    size, _, control = members(s, group, "all_gather_object")
    payload = _to_bytes(obj)  # also alone: an unpicklable object fails the same way everywhere
    if size == 1:
        return [obj]
    parts = _gather_uneven(s, payload, size, control, control, on_control=True)
    return [pickle.loads(part.numpy().tobytes()) for part in parts]


# -- broadcasts --------------------------------------------------------------------------------


def broadcast(value: T, src: int = 0, *, group: Group | None = None) -> T:
    """Send ``value`` from global rank ``src`` to every rank.

    Tensors are overwritten in place on the receiving ranks and returned (every rank passes a
    tensor of the same shape and dtype). Python numbers and other objects are sent with
    :func:`broadcast_object`, so the receivers' values are ignored and types are preserved.

    Raises:
        ConfigurationError: ``src`` is not a rank of the group.
    """
    import torch

    if not isinstance(value, torch.Tensor):
        return broadcast_object(value, src, group=group)
    s = _state.session("broadcast")
    size, handle, _ = members(s, group, "broadcast")
    _check_src(s, src, group)
    if size == 1:
        return value
    work = value if value.is_contiguous() else value.contiguous()
    if s.backend == "nccl" and work.device.type != "cuda":
        work = work.cuda()
    try:
        result = s.adapter.broadcast(work, src, handle)
    except RuntimeError as exc:
        raise fail(exc, f"broadcast from rank {src} over {size} ranks") from exc
    if result is not work:
        work.copy_(result)
    if work.data_ptr() != value.data_ptr():
        value.copy_(work)
    return value


def broadcast_object(obj: T, src: int = 0, *, group: Group | None = None) -> T:
    """Send any picklable object from global rank ``src``; other ranks' ``obj`` is ignored.

    Returns:
        The source's object (on the source rank, ``obj`` itself).
    """
    import torch

    s = _state.session("broadcast_object")
    size, _, control = members(s, group, "broadcast_object")
    _check_src(s, src, group)
    is_src = s.topology.rank == src
    payload = _to_bytes(obj) if is_src else None  # also alone, so failures match everywhere
    if size == 1:
        return obj
    length = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64)
    what = f"broadcast_object from rank {src} over {size} ranks"
    try:
        length = s.adapter.broadcast(length, src, control)
        if payload is None:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        payload = s.adapter.broadcast(payload, src, control)
    except RuntimeError as exc:
        raise fail(exc, what) from exc
    received: T = pickle.loads(payload.numpy().tobytes())
    return obj if is_src else received


def _check_src(s: Session, src: int, group: Group | None) -> None:
    valid = group.ranks if group is not None else range(s.topology.world_size)
    if not isinstance(src, int) or src not in valid:
        where = (
            f"group {list(group.ranks)}"
            if group is not None
            else (f"the world of {s.topology.world_size}")
        )
        raise ConfigurationError(
            f"src={src!r} is not a rank of {where}. HINT: src is a global rank of a member."
        )


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
    """The dtypes all_gather_uneven's descriptor can name, by index."""
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
