"""The ``torch.distributed`` helpers that several built-in adapters share.

* :func:`gather`: ``all_gather`` into a list sized by the group (Composer sizes it by the world).
* :func:`rank_zero_store_closes_first`: a teardown for frameworks that start a fresh ``env://``
  rendezvous on every initialize (Composer, Ignite).

Adapters import this module, the contract (:mod:`unidist.adapters.base`), the environment
(:mod:`unidist.environments.variables`) and the errors, nothing else (an import contract checks it).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from unidist.environments.variables import EnvReading

__all__ = ["gather", "rank_zero_store_closes_first"]


def gather(tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
    """``torch.distributed.all_gather`` into a list sized by ``group`` (the world for None)."""
    import torch
    import torch.distributed as dist

    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, tensor, group=group)
    return out


@contextlib.contextmanager
def rank_zero_store_closes_first(
    env: EnvReading, barrier: Callable[[], None], timeout: float = 5.0
) -> Iterator[None]:
    """Destroy the group inside the block; other ranks leave only once rank 0's store is gone.

    Composer and Ignite create a new ``TCPStore`` on ``MASTER_PORT`` at every initialize. If a
    fast rank finalizes and initializes again while rank 0 still serves the previous store, it
    joins that dying store and the new group never forms ("Gloo connectFullMesh failed"). So
    every other rank opens a plain connection to rank 0's store, all ranks meet at a barrier
    (rank 0 cannot be gone yet), the group is destroyed, and the other ranks wait (bounded) until
    that connection closes, which happens when rank 0's old store shuts down. Under torchrun the
    store belongs to the agent and outlives the group, so there is nothing to wait for.
    """
    watch: socket.socket | None = None
    if env.rank != 0 and not env.agent_store and env.master_addr and env.master_port:
        with contextlib.suppress(OSError):
            watch = socket.create_connection((env.master_addr, env.master_port), timeout=1.0)
    with contextlib.suppress(Exception):  # a peer already gone must not stop the teardown
        barrier()
    try:
        yield
    finally:
        if watch is not None:
            _wait_for_close(watch, timeout)


def _wait_for_close(sock: socket.socket, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with sock:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                if not sock.recv(4096):
                    return  # EOF: rank 0's store has shut down
            except TimeoutError:
                return
            except OSError:
                return
