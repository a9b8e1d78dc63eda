"""translate_errors: torch.distributed's failures as unidist's errors, everything else untouched."""

from __future__ import annotations

import pytest

from unidist.errors import DistributedTimeoutError, RemoteError, translate_errors


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
