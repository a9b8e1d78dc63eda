"""Splitting a batch into microbatches along dim 0, counting its samples, reading results.

A batch is a tensor, or a tuple, list (including namedtuples) or mapping of them, nested in any
way. Every tensor is split along dim 0 into views (no copy); a list of plain values (strings,
numbers) as long as the batch is sliced the same way; other values (a scalar, None, a string)
are repeated in every microbatch. All tensors must agree on dim 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from unidist.errors import ConfigurationError

__all__ = ["batch_size", "detached", "split_batch", "unpack_loss"]

_HINT = "HINT: pass split_fn= and size_fn= to MicroBatcher for other batch types."


def batch_size(batch: Any) -> int:
    """The number of samples in ``batch``: dim 0 of its first tensor (depth first).

    Raises:
        ConfigurationError: the batch holds no tensor, or its first tensor is 0-dimensional.
    """
    tensor = _first_tensor(batch)
    if tensor is None:
        raise ConfigurationError(
            f"cannot count the samples of a batch of type {type(batch).__name__}: it holds no "
            f"tensor. {_HINT}"
        )
    if tensor.dim() == 0:
        raise ConfigurationError(
            "cannot split a batch whose first tensor is 0-dimensional (a scalar); microbatches "
            f"are cut along dim 0. {_HINT}"
        )
    return int(tensor.shape[0])


def split_batch(batch: Any, size: int) -> list[Any]:
    """Cut ``batch`` into microbatches of ``size`` samples (the last may be smaller).

    Args:
        batch: a tensor, or a (nested) tuple, list or mapping holding tensors.
        size: samples per microbatch, at least 1.

    Returns:
        ``ceil(n / size)`` microbatches with the structure of ``batch``; tensors are views.

    Raises:
        ConfigurationError: tensors disagree on dim 0, or ``size`` is not a positive int.
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigurationError(f"microbatch size must be a positive int, got {size!r}.")
    total = batch_size(batch)
    _check_lengths(batch, total, "batch")
    if total <= size:
        return [batch]
    starts = list(range(0, total, size))
    return [_slice(batch, start, min(start + size, total), total) for start in starts]


def _is_tensor(value: object) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


def _first_tensor(batch: Any) -> Any:
    if _is_tensor(batch):
        return batch
    children: Sequence[Any] = ()
    if isinstance(batch, Mapping):
        children = list(batch.values())
    elif isinstance(batch, tuple | list):
        children = batch
    for child in children:
        found = _first_tensor(child)
        if found is not None:
            return found
    return None


def _holds_tensors(value: object) -> bool:
    return _first_tensor(value) is not None


def _check_lengths(batch: Any, total: int, where: str) -> None:
    if _is_tensor(batch):
        if batch.dim() == 0 or batch.shape[0] != total:
            raise ConfigurationError(
                f"every tensor of a batch must have the batch size ({total}) as dim 0, but "
                f"{where} has shape {tuple(batch.shape)}. {_HINT}"
            )
        return
    if isinstance(batch, Mapping):
        for key, value in batch.items():
            _check_lengths(value, total, f"{where}[{key!r}]")
    elif isinstance(batch, tuple | list) and any(_holds_tensors(v) for v in batch):
        for i, value in enumerate(batch):
            _check_lengths(value, total, f"{where}[{i}]")


def _slice(batch: Any, start: int, stop: int, total: int) -> Any:
    if _is_tensor(batch):
        return batch[start:stop]
    if isinstance(batch, Mapping):
        fields = {key: _slice(value, start, stop, total) for key, value in batch.items()}
        kind: Any = type(batch)
        try:
            return kind(fields)  # dict, OrderedDict, BatchEncoding-like classes
        except TypeError:
            return fields
    if isinstance(batch, tuple | list):
        if any(_holds_tensors(v) for v in batch):  # fields (x, y, ...): split each
            parts = [_slice(value, start, stop, total) for value in batch]
            if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
                return type(batch)(*parts)
            return type(batch)(parts)
        if len(batch) == total:  # one plain value per sample (e.g. ids, strings)
            return batch[start:stop]
    return batch  # anything else (a scalar, None, a string) belongs to every microbatch


def unpack_loss(result: Any) -> tuple[Any, Any]:
    """(loss, output) from what a microbatch's loss function returned: a loss or a pair.

    Raises:
        ConfigurationError: the loss is not a one-element tensor.
    """
    import torch

    loss, output = result if isinstance(result, tuple) and len(result) == 2 else (result, None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ConfigurationError(
            f"loss_fn must return the loss of its microbatch as a one-element tensor (or a "
            f"(loss, output) pair), got {got}. HINT: reduce the loss with .mean() or .sum()."
        )
    return (loss if loss.dim() == 0 else loss.reshape(())), output


def detached(output: Any) -> Any:
    """``output`` with every tensor in it detached (tuples, lists and dicts followed)."""
    if _is_tensor(output):
        return output.detach()
    if isinstance(output, tuple | list):
        return type(output)(detached(o) for o in output)
    if isinstance(output, dict):
        return {k: detached(v) for k, v in output.items()}
    return output
