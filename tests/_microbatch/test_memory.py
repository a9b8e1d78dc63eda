"""unidist.is_oom: types first, then the exception chain, then allocator messages; never others."""

from __future__ import annotations

import sys

import pytest
import torch

import unidist
from unidist._microbatch.memory import free_memory
from unidist.errors import MicrobatchOOMError, RemoteError


def chained(outer: BaseException, inner: BaseException, *, cause: bool) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            if cause:
                raise outer from exc
            raise outer  # noqa: B904 - the implicit __context__ is what this test needs
    except BaseException as final:
        return final


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (torch.OutOfMemoryError("anything"), "torch.OutOfMemoryError"),
        (torch.cuda.OutOfMemoryError("x"), "torch.OutOfMemoryError"),
        (MemoryError(), "MemoryError"),
        (
            RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            "message 'CUDA out of memory' (the CUDA caching allocator)",
        ),
        # mosaicml/composer#3397: CUDA 12.4's wording, which string matchers missed.
        (
            RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronous"),
            "message 'CUDA error: out of memory'",
        ),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "cuDNN"),
        (
            RuntimeError(
                "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in "
                "a non-contiguous input."
            ),
            "BatchNorm",
        ),
        (
            RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate"),
            "cuBLAS",
        ),
        (
            RuntimeError(
                "CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"
            ),
            "cuBLAS handle",
        ),
        (RuntimeError("HIP out of memory. Tried to allocate 20.00 MiB"), "HIP"),
        (RuntimeError("XPU out of memory. Tried to allocate 1 GiB"), "XPU"),
        (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), "MPS"),
        (RuntimeError("FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed"), "HPU"),
        (
            RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"),
            "CPU allocator",
        ),
        (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate"), "XLA"),
    ],
)
def test_recognised(exc: BaseException, expected: str) -> None:
    reason = unidist.is_oom(exc)
    assert reason is not None
    assert expected in reason


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("bad shape"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
        RuntimeError("the tutorial says: if you run out of memory, reduce the batch"),
        RuntimeError("cuda out of memory"),  # wording is exact: this is not an allocator's
        KeyboardInterrupt(),
        # A failed collective is never "just an OOM": the communicator is broken.
        RuntimeError(
            "NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error, CUDA error: out of memory"
        ),
        MicrobatchOOMError("out of memory with microbatch size 1, the minimum"),
        RemoteError("rank 1 failed: CUDA out of memory"),
    ],
)
def test_not_recognised(exc: BaseException) -> None:
    assert unidist.is_oom(exc) is None


def test_type_wins_over_message_and_chain_is_followed() -> None:
    wrapped = chained(
        RuntimeError("compiled graph failed"), torch.OutOfMemoryError("x"), cause=True
    )
    assert unidist.is_oom(wrapped) == "__cause__ is torch.OutOfMemoryError"
    implicit = chained(KeyError("k"), torch.OutOfMemoryError("x"), cause=False)
    assert unidist.is_oom(implicit) == "__context__ is torch.OutOfMemoryError"
    by_message = chained(ValueError("wrapper"), RuntimeError("CUDA out of memory."), cause=True)
    reason = unidist.is_oom(by_message)
    assert reason is not None
    assert reason.startswith("__cause__ has message 'CUDA out of memory'")
    # A type match anywhere in the chain is preferred to a message match at the top.
    both = chained(RuntimeError("HIP out of memory"), MemoryError(), cause=True)
    assert unidist.is_oom(both) == "__cause__ is MemoryError"


def test_suppressed_context_and_cycles() -> None:
    hidden = chained(ValueError("user error"), torch.OutOfMemoryError("x"), cause=False)
    hidden.__suppress_context__ = True  # `raise ... from None`
    assert unidist.is_oom(hidden) is None
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert unidist.is_oom(a) is None  # terminates


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups need Python 3.11")
def test_exception_groups_and_a_collective_anywhere_in_the_chain() -> None:
    errors = [ValueError("v"), torch.OutOfMemoryError("x")]
    group = BaseExceptionGroup("workers", errors)  # noqa: F821 - a builtin from Python 3.11
    assert unidist.is_oom(group) == "exceptions[1] is torch.OutOfMemoryError"
    broken = chained(
        torch.OutOfMemoryError("x"), torch.distributed.DistBackendError("nccl"), cause=True
    )
    assert unidist.is_oom(broken) is None


def test_a_real_cpu_allocator_failure() -> None:
    try:
        torch.empty(2**50, dtype=torch.uint8)  # a petabyte: the CPU allocator refuses at once
    except RuntimeError as exc:
        reason = unidist.is_oom(exc)
    else:  # pragma: no cover - a machine with a petabyte of memory
        pytest.skip("the allocation succeeded")
    assert reason is not None


def test_a_broken_str_does_not_hide_anything() -> None:
    class Weird(RuntimeError):
        def __str__(self) -> str:
            raise TypeError("no")

    assert unidist.is_oom(Weird()) is None


def test_free_memory_never_initialises_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    emptied: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append("cuda"))
    free_memory(("cuda", "cpu"))
    assert emptied == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    free_memory(("cuda", "cpu"))
    assert emptied == ["cuda"]
