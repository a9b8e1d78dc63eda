"""The adapter contract: what a framework must provide. Nothing else lives here.

An adapter connects unidist to one framework (Composer's ``composer.utils.dist``, Ignite's
``ignite.distributed``, plain ``torch.distributed``, ...), and it is the pair it provides:

* **where** its jobs run: ``environment``, an :class:`unidist.environments.Environment` (the
  variables its launcher sets; None when unidist's own environments already read them). A
  third-party adapter's environment joins unidist's chooser when the adapter is loaded; register
  it under the entry-point group ``unidist.environments`` as well, so that the rank getters read
  it before anything loads the adapter.
* **how** its ranks talk: ``initialize``/``finalize``/``topology`` and five primitives, which
  unidist's communicator (:mod:`unidist.session.communicator`, one per session) calls for every
  collective. Everything users see — Python numbers, ``mean``, uneven and object gathers,
  type-preserving broadcasts, rank-zero helpers, deadlines, votes, samplers, OOM agreement — is
  written once above it, so an adapter stays small.

Rules every adapter follows (checked by :func:`unidist.testing.check_adapter`):

* ``detect`` is cheap, imports no framework, and never communicates. It answers "does this
  process run under this framework?" from the environment and from a framework context that is
  already live, never from a mere import (test harnesses and notebooks import everything).
* ``initialize`` either creates the process group or adopts one that already exists (the
  framework's, the user's or a launcher's). It returns ``True`` when it created it, so that
  ``finalize`` only destroys what the adapter owns.
* Collective primitives are only called with ``world_size > 1``: the world-of-one identity is
  handled once, above the adapters. ``group`` is ``None`` for the whole world or a handle returned
  by :meth:`Adapter.new_group`. Tensors are already on the backend's device.
* ``all_gather`` returns one tensor per rank of the group, in group-rank order, each shaped like
  the input; ``all_reduce`` and ``broadcast`` return the result (they may work in place).
* Failures propagate as exceptions; unidist translates ``torch.distributed`` errors into its own
  tree (:mod:`unidist.errors`).
* ``environment``, when not None, keeps the environment contract
  (:func:`unidist.testing.check_environment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from unidist.environments.places import Environment
    from unidist.environments.variables import EnvReading, Topology

__all__ = ["REDUCE_OPS", "Adapter", "NamedAdapter", "PrimitiveOp"]

#: Reduction ops adapters must implement. ``mean`` is built above them from ``sum``.
PrimitiveOp = Literal["sum", "min", "max", "product", "band", "bor"]
#: Reduction ops of :func:`unidist.all_reduce`.
REDUCE_OPS = ("sum", "mean", "min", "max", "product", "band", "bor")


@runtime_checkable
class Adapter(Protocol):
    """What a framework adapter provides: where (``environment``) and how (the methods).

    See the module docstring for the rules.
    """

    #: Registry name, e.g. ``"torch"``.
    name: str
    #: The place its jobs run, or None when unidist's own environments read its launcher's
    #: variables (the torch variables of Composer's launcher and Ignite's ``Parallel``).
    environment: Environment | None

    def detect(self, env: EnvReading) -> str | None:
        """Say why this adapter fits the running process (e.g. its launcher started it), or None."""
        ...

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        """Create or adopt the default process group; return True if this call created it."""
        ...

    def finalize(self) -> None:
        """Destroy the process group this adapter created (a no-op for an adopted one)."""
        ...

    def topology(self, env: Topology) -> Topology:
        """This framework's view of the topology, given what the environment says."""
        ...

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        """Reduce ``tensor`` across ``group`` with ``op``."""
        ...

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        """Gather same-shaped tensors from every rank of ``group``."""
        ...

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        """Broadcast ``tensor`` from global rank ``src`` to every rank of ``group``."""
        ...

    def barrier(self, group: Any) -> None:
        """Wait until every rank of ``group`` has arrived."""
        ...

    def new_group(self, ranks: Sequence[int]) -> Any:
        """Create a group of the given global ranks (called on every rank) and return its handle."""
        ...


class NamedAdapter:
    """A readable ``repr`` for an adapter: ``<IgniteAdapter 'ignite'>``, not a memory address.

    Optional (the contract does not ask for it): the built-in adapters inherit it, so that
    :func:`unidist.current_adapter` prints as something a person can read.
    """

    name: str

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
