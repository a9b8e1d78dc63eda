"""The one-node rendezvous: a store on a free port, every round at once, torch's contract."""

from __future__ import annotations

import argparse
import socket
import time

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousParameters,
)
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from tests.launch.helpers import JOB
from unidist.launch import onenode
from unidist.launch.plan.job import add_arguments, plan_from_args


def params(**configs: str) -> RendezvousParameters:
    onenode.register()
    return RendezvousParameters(
        backend=onenode.BACKEND,
        endpoint="127.0.0.1:0",
        run_id="job1",
        min_nodes=1,
        max_nodes=1,
        **configs,
    )


def test_it_is_reached_through_torchs_registry_and_registers_twice() -> None:
    onenode.register()  # again: the same creator, no error
    handler = get_rendezvous_handler(params())
    assert isinstance(handler, RendezvousHandler)
    assert handler.get_backend() == onenode.BACKEND
    assert handler.get_run_id() == "job1"
    assert handler.num_nodes_waiting() == 0


def test_each_round_answers_at_once_with_its_own_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    handler = get_rendezvous_handler(params())

    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"the one-node rendezvous slept {seconds} s")

    monkeypatch.setattr(time, "sleep", no_sleep)  # c10d's first round sleeps up to 0.3 s
    first = handler.next_rendezvous()
    second = handler.next_rendezvous()
    monkeypatch.undo()
    assert (first.rank, first.world_size) == (second.rank, second.world_size) == (0, 1)
    info = first.bootstrap_store_info
    assert info is not None
    assert info.master_addr == socket.getfqdn()  # as torch's c10d rendezvous says
    assert info.master_port > 0  # the port the system picked
    first.store.set("k", b"first")
    second.store.set("k", b"second")
    # What a rank sees: the agent's store at MASTER_ADDR:MASTER_PORT, each round's keys apart.
    client = dist.TCPStore(info.master_addr, info.master_port, is_master=False)
    assert bytes(dist.PrefixStore("unidist.rendezvous.job1.0", client).get("k")) == b"first"
    assert bytes(dist.PrefixStore("unidist.rendezvous.job1.1", client).get("k")) == b"second"
    assert handler.use_agent_store


def test_without_a_shared_store_rank_0_gets_a_port_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    handler = get_rendezvous_handler(params())
    assert not handler.use_agent_store
    rendezvous = handler.next_rendezvous()
    info = rendezvous.bootstrap_store_info
    assert info is not None
    assert info.master_port > 0


def test_a_closed_rendezvous_refuses_the_next_round() -> None:
    handler = get_rendezvous_handler(params())
    handler.next_rendezvous()
    assert not handler.is_closed()
    assert handler.shutdown()
    assert handler.is_closed()
    with pytest.raises(RendezvousClosedError, match="job1 is closed"):
        handler.next_rendezvous()


def test_more_than_one_node_is_refused() -> None:
    onenode.register()
    several = RendezvousParameters(onenode.BACKEND, "127.0.0.1:0", "job1", 1, 2)
    with pytest.raises(ValueError, match="a rendezvous of one node; max_nodes=2"):
        get_rendezvous_handler(several)


@pytest.mark.parametrize(
    ("argv", "backend"),
    [
        (["-n", "2", JOB], onenode.BACKEND),
        (["--standalone", "-n", "2", JOB], "c10d"),  # torchrun's meaning, kept
        (["-n", "2", "--master-port", "0", JOB], onenode.BACKEND),
    ],
)
def test_only_the_default_one_node_job_uses_it(argv: list[str], backend: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert plan_from_args(parser.parse_args(argv)).rdzv.backend == backend
