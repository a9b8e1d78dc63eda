"""translate_errors: torch.distributed's failures as unidist's errors, everything else untouched."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from unidist.errors import (
    DistributedTimeoutError,
    RemoteError,
    TorchFailure,
    torch_failure,
    translate_errors,
)


def test_a_peer_gone_becomes_a_remote_error_naming_the_call() -> None:
    cause = RuntimeError("[gloo/pair.cc:534] Connection closed by peer [127.0.0.1]:4000")
    expected = pytest.raises(RemoteError, match="all_reduce over 2 ranks failed because")
    with expected as caught, translate_errors("all_reduce over 2 ranks"):
        raise cause
    assert caught.value.__cause__ is cause


def test_a_timeout_becomes_a_distributed_timeout_error() -> None:
    expected = pytest.raises(DistributedTimeoutError, match="broadcast from rank 0 timed out")
    with expected, translate_errors("broadcast from rank 0"):
        raise RuntimeError("Timed out waiting 1800000ms for recv operation to complete")


@pytest.mark.parametrize(
    "error", [RuntimeError("CUDA error: an illegal memory access"), ValueError("timed out")]
)
def test_other_errors_pass_through_unchanged(error: Exception) -> None:
    with pytest.raises(type(error)) as caught, translate_errors("all_gather"):
        raise error
    assert caught.value is error
    assert caught.value.__cause__ is None


def test_a_block_that_succeeds_is_left_alone() -> None:
    with translate_errors("barrier") as entered:
        done = True
    assert done
    assert entered is None


def _dist_errors() -> tuple[type[Exception], type[Exception], type[Exception]]:
    import torch.distributed as dist

    return dist.DistStoreError, dist.DistNetworkError, dist.DistError


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: RuntimeError("Connection reset by peer"), TorchFailure.PEER_GONE),
        (
            lambda: _dist_errors()[0]("wait timeout after 100ms, keys: /x"),
            TorchFailure.STORE_TIMEOUT,
        ),
        (lambda: _dist_errors()[1]("Socket Timeout"), TorchFailure.NETWORK_TIMEOUT),
        (lambda: RuntimeError("Timed out waiting 5ms for recv"), TorchFailure.TIMEOUT),
        (lambda: _dist_errors()[2]("the store has no such key"), TorchFailure.COMMUNICATION),
        (lambda: RuntimeError("NCCL error in: ProcessGroupNCCL.cpp"), TorchFailure.COMMUNICATION),
        (lambda: RuntimeError("CUDA error: out of memory"), TorchFailure.OTHER),
        (lambda: ValueError("timed out"), TorchFailure.OTHER),
        (lambda: DistributedTimeoutError("timed out"), TorchFailure.OTHER),
    ],
)
def test_torchs_untyped_failures_are_classified_in_one_place(
    make: Callable[[], Exception], expected: TorchFailure
) -> None:
    assert torch_failure(make()) is expected
