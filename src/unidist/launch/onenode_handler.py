"""The one-node rendezvous handler itself (imports torch; see :mod:`unidist.launch.onenode`)."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from unidist.environments import variables as _env

__all__ = ["OneNodeRendezvous"]


class OneNodeRendezvous(RendezvousHandler):
    """Rank 0 of a world of one node, every round, at once.

    Args:
        params: torch's rendezvous parameters (``max_nodes`` must be 1).
        name: the backend's name (:data:`unidist.launch.onenode.BACKEND`).
        join_timeout: seconds a rank may take to reach the store, unless ``join_timeout`` is in
            the parameters' configs.
    """

    def __init__(self, params: RendezvousParameters, name: str, join_timeout: int) -> None:
        if params.max_nodes != 1:
            raise ValueError(f"{name} is a rendezvous of one node; max_nodes={params.max_nodes}.")
        self._name = name
        self._run_id = params.run_id
        # MASTER_ADDR as torch's c10d rendezvous sets it (torchrun --standalone): the ranks
        # see the same variables under either launcher.
        self._addr = params.local_addr or socket.getfqdn()
        seconds = params.get_as_int("join_timeout", join_timeout) or join_timeout
        self._timeout = timedelta(seconds=seconds)
        self._store: Any = None
        self._round = 0
        self._closed = False

    def get_backend(self) -> str:
        return self._name

    @property
    def use_agent_store(self) -> bool:
        return _env.rendezvous_store_shared()

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"the {self._name} rendezvous {self._run_id} is closed")
        if self._store is None:
            self._store = dist.TCPStore(
                self._addr, 0, is_master=True, timeout=self._timeout, multi_tenant=True
            )
        prefix = f"unidist.rendezvous.{self._run_id}.{self._round}"
        self._round += 1
        store = dist.PrefixStore(prefix, self._store)
        if self.use_agent_store:
            info = RendezvousStoreInfo(self._addr, int(self._store.port))
        else:  # rank 0 hosts a fresh store for the round, on a port it publishes here
            info = RendezvousStoreInfo.build(0, store, local_addr=self._addr)
        return RendezvousInfo(store, 0, 1, info)

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0  # nobody else can join a one-node job

    def get_run_id(self) -> str:
        return str(self._run_id)

    def shutdown(self) -> bool:
        self._closed = True
        return True
