"""Is this exception an out-of-memory error, and why? Plus freeing the device caches after one.

:func:`is_oom` looks at exception *types* first (``torch.OutOfMemoryError``, which is also
``torch.cuda.OutOfMemoryError``, and Python's ``MemoryError``), then at the types along the
``__cause__``/``__context__`` chain (and inside exception groups), and only then at messages,
for allocators that raise a plain ``RuntimeError``: CUDA, cuDNN, cuBLAS, HIP, XPU, MPS, HPU, XLA
and the CPU allocator. Peers match a substring of ``args[0]`` only, so a wrapped OOM (torch.compile,
a DataLoader, a framework callback) or a new message wording (mosaicml/composer#3397) slips through.

A failure inside a collective is never an OOM here, even if its text says "out of memory": the
communicator is broken, and retrying on it would hang.

This module imports nothing heavy; it finds torch in ``sys.modules`` (an exception from torch
implies torch is imported).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

from unidist.errors import from_communication_library

__all__ = ["free_memory", "is_oom"]

#: (substring of the message, what raised it). Checked in order; matching is case-sensitive,
#: because the allocators' wording is fixed and "out of memory" alone also appears in advice.
_MESSAGES: tuple[tuple[str, str], ...] = (
    ("CUDA out of memory", "the CUDA caching allocator"),
    ("CUDA error: out of memory", "the CUDA runtime (cudaErrorMemoryAllocation)"),
    ("cudaErrorMemoryAllocation", "the CUDA runtime"),
    ("CUBLAS_STATUS_ALLOC_FAILED", "cuBLAS (workspace allocation)"),
    (
        "CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`",
        "cuBLAS handle creation (no memory left for its workspace)",
    ),
    ("CUDNN_STATUS_ALLOC_FAILED", "cuDNN (workspace allocation)"),
    (
        "CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a non-contiguous input",
        "cuDNN NOT_SUPPORTED, which large batches (e.g. with BatchNorm) raise instead of an OOM; "
        "if it persists at small sizes, check for non-contiguous inputs",
    ),
    ("CUSOLVER_STATUS_ALLOC_FAILED", "cuSOLVER (workspace allocation)"),
    ("CUSPARSE_STATUS_ALLOC_FAILED", "cuSPARSE (workspace allocation)"),
    ("HIP out of memory", "the HIP (ROCm) caching allocator"),
    ("HIP error: out of memory", "the HIP runtime"),
    ("hipErrorOutOfMemory", "the HIP runtime"),
    ("XPU out of memory", "the XPU (Intel GPU) allocator"),
    ("UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY", "the XPU runtime"),
    ("MPS backend out of memory", "the MPS (Apple GPU) allocator"),
    ("MODULE:PT_DEVMEM Allocation failed", "the HPU (Gaudi) device allocator"),
    ("DefaultCPUAllocator: can't allocate memory", "the CPU allocator"),
    ("DefaultCPUAllocator: not enough memory", "the CPU allocator"),
    ("RESOURCE_EXHAUSTED: Out of memory", "the XLA (TPU) allocator"),
)

#: How deep to follow causes and contexts (chains are short; cycles are cut separately).
_MAX_DEPTH = 32


def is_oom(exc: BaseException) -> str | None:
    """Why ``exc`` is an out-of-memory error, or None when it is not one.

    Args:
        exc: any exception.

    Returns:
        A short reason, such as ``"torch.OutOfMemoryError"``, ``"__cause__ is
        torch.OutOfMemoryError"`` or ``"message 'CUDA error: out of memory' (the CUDA runtime
        (cudaErrorMemoryAllocation))"``; None for every other error (including unidist's own
        errors and failures inside collectives).

    Example:
        >>> is_oom(RuntimeError("CUDA error: out of memory"))  # doctest: +ELLIPSIS
        "message 'CUDA error: out of memory' (the CUDA runtime...)"
        >>> is_oom(ValueError("bad shape")) is None
        True
    """
    chain = list(_chain(exc))
    if any(_is_communication_failure(node) for _, node in chain):
        return None
    for path, node in chain:
        name = _oom_type(node)
        if name is not None:
            return f"{path} is {name}" if path else name
    for path, node in chain:
        text = _text(node)
        for fragment, source in _MESSAGES:
            if fragment in text:
                where = f"{path} has " if path else ""
                return f"{where}message {fragment!r} ({source})"
    return None


def _chain(exc: BaseException) -> Iterator[tuple[str, BaseException]]:
    """``exc`` and what it wraps, breadth first, as (path, exception); unidist errors excluded."""
    from unidist.errors import UnidistError

    seen: set[int] = set()
    queue: list[tuple[str, BaseException, int]] = [("", exc, 0)]
    while queue:
        path, node, depth = queue.pop(0)
        if id(node) in seen or isinstance(node, UnidistError) or depth > _MAX_DEPTH:
            continue  # a unidist error (e.g. the final "OOM at size 1") is a verdict, not an OOM
        seen.add(id(node))
        yield path, node
        links: list[tuple[str, BaseException | None]] = [("__cause__", node.__cause__)]
        if not node.__suppress_context__:
            links.append(("__context__", node.__context__))
        links.extend(
            (f"exceptions[{i}]", inner)
            for i, inner in enumerate(getattr(node, "exceptions", None) or ())
            if isinstance(inner, BaseException)
        )
        for name, linked in links:
            if linked is not None:
                queue.append((f"{path}.{name}" if path else name, linked, depth + 1))


def _oom_type(exc: BaseException) -> str | None:
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return "torch.OutOfMemoryError"
    if isinstance(exc, MemoryError):
        return "MemoryError"
    return None


def _is_communication_failure(exc: BaseException) -> bool:
    # A failed collective (the communicator is gone) is never "just an OOM".
    return from_communication_library(exc)


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not hide the original error
        return ""


def free_memory(device_types: Iterator[str] | tuple[str, ...] = ()) -> None:
    """Collect garbage and return cached device memory to the driver after an OOM.

    Args:
        device_types: device types whose caching allocator to empty (``cuda``, ``xpu``, ``mps``,
            ``hpu``); CPU needs nothing beyond the garbage collection.
    """
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for kind in set(device_types):
        backend = getattr(torch, kind, None)
        if kind == "cpu" or backend is None:
            continue
        initialized = getattr(backend, "is_initialized", None)
        if initialized is not None and not initialized():
            continue  # never initialise a device just to empty its (empty) cache
        empty = getattr(backend, "empty_cache", None)
        if empty is not None:
            empty()
