"""The store patches a launched rank applies before the user's code runs (launch/rank/runtime)."""

from __future__ import annotations

import importlib
import socket
from datetime import timedelta

import psutil
import pytest

from unidist.launch.rank import runtime as _rank

#: The module, not the function torch.distributed re-exports under the same name.
RENDEZVOUS = importlib.import_module("torch.distributed.rendezvous")
ORIGINAL = RENDEZVOUS._create_c10d_store


@pytest.fixture(autouse=True)
def _restore_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RENDEZVOUS, "_create_c10d_store", ORIGINAL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _listening_on(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def _one_node_rank0(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }.items():
        monkeypatch.setenv(name, value)


def test_rank0_of_a_one_node_job_hosts_the_group_store_on_master_addr_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _one_node_rank0(monkeypatch)
    _rank._bind_group_store_to_master_addr()
    assert RENDEZVOUS._create_c10d_store is not ORIGINAL  # the patch reached torch's module
    port = _free_port()
    store = RENDEZVOUS._create_c10d_store("127.0.0.1", port, 0, 1, timedelta(seconds=10))
    try:
        store.set("key", "value")
        assert store.get("key") == b"value"
        assert _listening_on(port) == {"127.0.0.1"}  # torch alone listens on "::" here
    finally:
        del store


def test_torch_alone_listens_on_every_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the patch exists; if this starts failing, torch binds MASTER_ADDR by itself."""
    port = _free_port()
    store = ORIGINAL("127.0.0.1", port, 0, 1, timedelta(seconds=10))
    try:
        assert _listening_on(port) & {"::", "0.0.0.0"}
    finally:
        del store


@pytest.mark.parametrize(
    "change",
    [
        {"RANK": "1"},  # only rank 0 hosts the store
        {"TORCHELASTIC_USE_AGENT_STORE": "True"},  # the agent hosts it
        {"WORLD_SIZE": "4"},  # several nodes: a host name may resolve differently on each
    ],
)
def test_other_ranks_agent_stores_and_multi_node_jobs_keep_torchs_way(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, str]
) -> None:
    _one_node_rank0(monkeypatch)
    for name, value in change.items():
        monkeypatch.setenv(name, value)
    _rank._bind_group_store_to_master_addr()
    assert RENDEZVOUS._create_c10d_store is ORIGINAL


def test_a_restarted_static_rank_prefixes_the_agents_store_by_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    _rank._prefix_store_by_attempt()
    assert RENDEZVOUS._create_c10d_store is ORIGINAL  # the first attempt needs no prefix
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    _rank._prefix_store_by_attempt()
    assert RENDEZVOUS._create_c10d_store is not ORIGINAL
