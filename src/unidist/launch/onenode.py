"""The rendezvous of a one-node job: a store on this host, and nothing to wait for.

``unidist launch -n 4 train.py`` (one node, no endpoint) must not listen on a fixed port, so it
cannot use torch's static rendezvous (torchrun's default, on 29500). torch's c10d rendezvous on
a free port (what ``--standalone`` asks for) works, but it starts every job with a random sleep
of up to 0.3 s (``DynamicRendezvousHandler.next_rendezvous``, there to spread the first joins of
many nodes over time) and a second store. With one node there is nobody to wait for: this
handler hosts one ``TCPStore`` on a port the system picks, and answers every round at once.

It is registered with torch's public handler registry under :data:`BACKEND` and reached through
``LaunchConfig(rdzv_backend=BACKEND)``, like any other backend. Each round gets its own key
prefix; the ranks share this store (``TORCHELASTIC_USE_AGENT_STORE``), or, where restarts are
possible (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, see ``launch.supervise.runner``), rank 0
hosts a fresh one per round on a port published through this store, as torch's own handlers do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters

__all__ = ["BACKEND", "DEFAULT_JOIN_TIMEOUT", "register"]

#: The backend name unidist launch passes to torch's agent for a one-node job.
BACKEND = "unidist-one-node"
#: Seconds a rank may take to reach the store (c10d's ``join_timeout`` default).
DEFAULT_JOIN_TIMEOUT = 600


def register() -> None:
    """Make :data:`BACKEND` known to torch's rendezvous registry (again: a no-op)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create)


def _create(params: RendezvousParameters) -> RendezvousHandler:
    from unidist.launch.onenode_handler import OneNodeRendezvous  # imports torch

    return OneNodeRendezvous(params, BACKEND, DEFAULT_JOIN_TIMEOUT)
