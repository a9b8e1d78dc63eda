"""unidist.collectives.sync without a control store: the same values as over the store, and no
pickle."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import unidist
from unidist.collectives import sync
from unidist.session import state as _state
from unidist.session.communicator import CollectiveCommunicator
from unidist.testing import run_distributed


def _without_control_store() -> dict[str, Any]:
    session = _state.published()
    assert session is not None
    assert session.comm.plane is not None
    held = session.comm  # rank 0 hosts the store: keep it alive for finalize
    unidist.barrier()
    session.comm = CollectiveCommunicator(session)  # as under an adapter without torch.distributed

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("sync unpickled something")

    unpickle, pickle.loads = pickle.loads, refuse  # type: ignore[assignment]
    try:
        return _agree_and_exchange()
    finally:
        pickle.loads = unpickle
        session.comm = held


def _agree_and_exchange() -> dict[str, Any]:
    rank = unidist.get_rank()
    tally = sync.agree(
        {"rank": rank, "oom": rank == 1}, lambda votes: sorted(votes.items()), 30, "vote"
    )
    first = sync.exchange(
        ["done", rank] if rank == 1 else None,
        publish=rank == 1,
        wait_for=[1],
        timeout=30,
        what="exchange",
    )
    with unidist.one_rank_first(rank=0):
        pass
    return {"tally": tally, "first": first}


@pytest.mark.multiprocess
def test_agree_and_exchange_without_a_control_store_send_json_not_pickles() -> None:
    results = run_distributed(_without_control_store, world_size=2, timeout=90)
    expected_tally = [[0, {"rank": 0, "oom": False}], [1, {"rank": 1, "oom": True}]]
    for result in results:
        # JSON on every path: tuples come back as lists
        assert result["tally"] == expected_tally
        assert result["first"] == {1: ["done", 1]}


def test_exchange_takes_its_flags_by_keyword() -> None:
    with pytest.raises(TypeError):
        sync.exchange(None, True, [0], 10, "x")  # type: ignore[misc]


def _communicator_clause_and_wrapping_without_torch() -> tuple[str, str]:
    from torch import nn

    from unidist.testing.conformance import clause_communicator

    session = _state.published()
    assert session is not None
    held = session.comm
    unidist.barrier()
    session.comm = CollectiveCommunicator(session)
    try:
        clause_communicator()  # agreements over the adapter's gather; flags nobody else sees
        try:
            unidist.auto_model(nn.Linear(2, 2), device="cpu")
            refused = "not refused"
        except unidist.ConfigurationError as exc:
            refused = str(exc)
        return session.comm.kind, refused
    finally:
        session.comm = held


@pytest.mark.multiprocess
def test_without_torch_distributed_the_waits_work_and_torch_wrappers_are_refused() -> None:
    for kind, refused in run_distributed(_communicator_clause_and_wrapping_without_torch):
        assert kind == "collectives"
        assert "does not run on torch.distributed, which DDP, FSDP and TP need" in refused
        assert "adapter='torch'" in refused
