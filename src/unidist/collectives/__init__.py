"""Collectives for tensors, Python numbers and objects, written once above the adapters.

Barriers and exchanges live in :mod:`unidist.collectives.sync`, groups in
:mod:`unidist.collectives.groups`.

Every function works unchanged in a single process (the identity), accepts a :class:`Group` from
:func:`new_group`, and sizes its results by that group. Object collectives and size exchanges
travel over a gloo "control" group, so they need no CUDA device and never touch NCCL. The work
itself is done by :mod:`unidist.session.transport`; this module checks the arguments and finds the
session and the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from unidist._base.migration import foreign_keywords
from unidist.adapters.base import REDUCE_OPS
from unidist.collectives.groups import Group, is_outsider, members
from unidist.errors import ConfigurationError
from unidist.session import lifecycle, transport

if TYPE_CHECKING:
    import torch

    from unidist.session.state import Session

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


def _op(op: str) -> str:
    name = _OP_NAMES.get(op) if isinstance(op, str) else None
    if name is None:
        name = _OP_NAMES.get(op.lower()) if isinstance(op, str) else None
    if name is None:
        raise ConfigurationError(
            f"op={op!r} is not a reduction unidist knows; expected one of {', '.join(REDUCE_OPS)}."
        )
    return name


_TENSOR = (
    "composer.utils.dist's and ignite.distributed's",
    "pass the tensor (or number) first, positionally; unidist calls it value",
)


@foreign_keywords(
    {
        "tensor": _TENSOR,
        "reduce_operation": (
            "composer.utils.dist.all_reduce",
            "use op= (any case: op='SUM' is op='sum')",
        ),
    }
)
def all_reduce(value: T, op: str = "sum", *, group: Group | None = None) -> T:
    """Reduce a tensor or a Python number across ranks.

    Tensors are reduced in place (like ``torch.distributed.all_reduce``) and returned. Python
    numbers come back as the same type (``int`` stays ``int``); ``mean`` always gives a float.

    Args:
        value: a tensor, or an ``int``, ``float`` or ``bool``.
        op: ``sum``, ``mean``, ``min``, ``max``, ``product``, ``band`` or ``bor`` (any case).
            ``mean`` needs a floating-point tensor; ``band``/``bor`` need integers or bools.
        group: reduce over this group instead of the whole world. A rank outside it gets
            ``value`` back unchanged, as in torch and Ignite.

    Returns:
        The reduced value; the input itself for tensors.

    Raises:
        TypeError: ``value`` is neither a tensor nor a number (as Ignite's ``all_reduce``).
        ConfigurationError: unknown op, an op the dtype cannot hold, or a ``group`` that is
            not a :class:`Group`.
        NotInitializedError: several processes are expected but no process group exists.
    """
    import torch

    if not isinstance(value, torch.Tensor | bool | int | float):
        raise TypeError(
            f"all_reduce takes a tensor or a Python number, got {type(value).__name__} "
            f"{value!r:.80}. HINT: use all_gather_object for other objects."
        )
    session = lifecycle.session_for("all_reduce")
    name = _op(op)
    if is_outsider(session, group, "all_reduce"):
        return value
    size, handle, _ = members(session, group, "all_reduce")
    if isinstance(value, torch.Tensor):
        return transport.reduce_tensor(session, value, name, size, handle)  # type: ignore[return-value]
    return transport.reduce_number(session, value, name, size, handle)  # type: ignore[return-value]


def all_gather(tensor: torch.Tensor, *, group: Group | None = None) -> list[torch.Tensor]:
    """Gather a tensor of the same shape and dtype from every rank.

    Args:
        tensor: this rank's contribution.
        group: gather over this group instead of the whole world.

    Returns:
        One new tensor per rank of the group, in rank order (``[tensor.clone()]`` alone, and
        on a rank outside ``group``: its own tensor, as Ignite returns it there).
    """
    import torch

    session = lifecycle.session_for("all_gather")
    if not isinstance(tensor, torch.Tensor):
        raise ConfigurationError(
            f"all_gather takes a tensor, got {type(tensor).__name__}. "
            "HINT: use all_gather_object for Python objects."
        )
    if is_outsider(session, group, "all_gather"):
        return [tensor.clone()]
    size, handle, _ = members(session, group, "all_gather")
    if size == 1:
        return [tensor.clone()]
    return transport.gather(session, tensor, size, handle, "all_gather")


def all_gather_uneven(tensor: torch.Tensor, *, group: Group | None = None) -> list[torch.Tensor]:
    """Gather tensors whose first dimension may differ per rank (same dtype and trailing dims).

    Args:
        tensor: this rank's contribution, at least one-dimensional.
        group: gather over this group instead of the whole world.

    Returns:
        One tensor per rank of the group, in rank order, each with its sender's shape (on a
        rank outside ``group``: its own tensor alone).

    Raises:
        ConfigurationError: a 0-d tensor, or ranks disagree on dtype or trailing dimensions
            (the message lists every rank's shape).
    """
    import torch

    session = lifecycle.session_for("all_gather_uneven")
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise ConfigurationError(
            "all_gather_uneven takes a tensor with at least one dimension, got "
            f"{getattr(tensor, 'shape', type(tensor).__name__)}. HINT: use all_gather for "
            "same-shaped tensors, or tensor.reshape(1) for a scalar."
        )
    if tensor.dim() > transport.MAX_DIMS:
        raise ConfigurationError(
            f"all_gather_uneven supports up to {transport.MAX_DIMS} dims, got {tensor.dim()}."
        )
    if is_outsider(session, group, "all_gather_uneven"):
        return [tensor.clone()]
    size, handle, control = members(session, group, "all_gather_uneven")
    if size == 1:
        return [tensor.clone()]
    return transport.gather_uneven(session, tensor, size, handle, control)


def all_gather_object(obj: T, *, group: Group | None = None) -> list[T]:
    """Gather any picklable object from every rank (over the gloo control group).

    Objects are pickled and unpickled, like ``torch.distributed.all_gather_object``: unpickling
    runs code, so use it only between the trusted ranks of one job (see the trust model).

    Returns:
        One object per rank of the group, in rank order (``[obj]`` alone, and on a rank
        outside ``group``).
    """
    session = lifecycle.session_for("all_gather_object")
    if is_outsider(session, group, "all_gather_object"):
        return [obj]
    size, _, control = members(session, group, "all_gather_object")
    return transport.gather_object(session, obj, size, control)


@foreign_keywords(
    {
        "tensor": _TENSOR,
        "safe_mode": (
            "ignite.distributed.broadcast",
            "use unidist.broadcast_object(obj, src) when the other ranks hold no value of the "
            "same kind (Ignite's safe_mode lets them pass None)",
        ),
    }
)
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
    session = lifecycle.session_for("broadcast")
    size, handle, _ = members(session, group, "broadcast")
    _check_src(session, src, group)
    return transport.broadcast_tensor(session, value, src, size, handle)  # type: ignore[return-value]


def broadcast_object(obj: T, src: int = 0, *, group: Group | None = None) -> T:
    """Send any picklable object from global rank ``src``; other ranks' ``obj`` is ignored.

    The object is pickled and unpickled, like ``torch.distributed.broadcast_object_list``:
    unpickling runs code, so use it only between the trusted ranks of one job.

    Returns:
        The source's object (on the source rank, ``obj`` itself).
    """
    session = lifecycle.session_for("broadcast_object")
    size, _, control = members(session, group, "broadcast_object")
    _check_src(session, src, group)
    return transport.broadcast_object(session, obj, src, size, control)


def _check_src(session: Session, src: int, group: Group | None) -> None:
    valid = group.ranks if group is not None else range(session.topology.world_size)
    if not isinstance(src, int) or src not in valid:
        where = (
            f"group {list(group.ranks)}"
            if group is not None
            else (f"the world of {session.topology.world_size}")
        )
        raise ConfigurationError(
            f"src={src!r} is not a rank of {where}. HINT: src is a global rank of a member."
        )
