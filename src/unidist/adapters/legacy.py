"""The compatibility shim for adapters written to the pre-releases' one-class contract.

Such an adapter has every member of :class:`unidist.adapters.base.Adapter` but ``environment``
(where its jobs run). :func:`adapt` wraps it in a :class:`LegacyShim` that says "nowhere of its
own" (``environment = None``: unidist's environments read the variables, as before) and
forwards everything else, so it keeps working unchanged for one release, with a
``DeprecationWarning`` that names what to add and the entry-point groups to register in.
unidist 0.2 removes the shim.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from unidist._env.environments import ENTRY_POINT_GROUP as ENVIRONMENTS_GROUP
from unidist.adapters.base import Adapter, LegacyAdapter, NamedAdapter
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

    from unidist._env import EnvReading, Topology
    from unidist._env.environments import Environment
    from unidist.adapters.base import PrimitiveOp

__all__ = ["LegacyShim", "adapt"]

#: The entry-point group adapters register in (the registry's; repeated to stay below it).
ADAPTERS_GROUP = "unidist.adapters"


class LegacyShim(NamedAdapter):
    """A one-class adapter seen as the pair: no environment of its own, the same methods.

    Attributes the contract does not name (``adapter.calls``, ...) are read from the wrapped
    adapter, which :attr:`legacy` holds.
    """

    environment: Environment | None = None

    def __init__(self, legacy: LegacyAdapter) -> None:
        self.legacy = legacy
        self.name = legacy.name

    def __getattr__(self, name: str) -> Any:  # only for names the shim itself lacks
        return getattr(self.__dict__["legacy"], name)

    def detect(self, env: EnvReading) -> str | None:
        return self.legacy.detect(env)

    def initialize(self, backend: str | None, *, timeout: timedelta, env: EnvReading) -> bool:
        return self.legacy.initialize(backend, timeout=timeout, env=env)

    def finalize(self) -> None:
        self.legacy.finalize()

    def topology(self, env: Topology) -> Topology:
        return self.legacy.topology(env)

    def all_reduce(self, tensor: torch.Tensor, op: PrimitiveOp, group: Any) -> torch.Tensor:
        return self.legacy.all_reduce(tensor, op, group)

    def all_gather(self, tensor: torch.Tensor, group: Any) -> list[torch.Tensor]:
        return self.legacy.all_gather(tensor, group)

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        return self.legacy.broadcast(tensor, src, group)

    def barrier(self, group: Any) -> None:
        self.legacy.barrier(group)

    def new_group(self, ranks: Sequence[int]) -> Any:
        return self.legacy.new_group(ranks)


def adapt(candidate: object, what: str) -> Adapter:
    """``candidate`` as an :class:`Adapter`: itself, or a one-class adapter in a
    :class:`LegacyShim` (with a ``DeprecationWarning``).

    Args:
        candidate: the adapter object.
        what: where it came from, for messages (``"examples.mine:MyAdapter"``).

    Raises:
        ConfigurationError: it is neither (a member is missing).
    """
    if isinstance(candidate, Adapter):
        return candidate
    if isinstance(candidate, LegacyAdapter):
        warnings.warn(
            f"the adapter {candidate.name!r} ({what}) has no `environment`: it follows the "
            "pre-releases' one-class adapter contract and runs through a compatibility shim, "
            "which unidist 0.2 removes. HINT: give it `environment = None` (unidist's "
            "environments read its launcher's variables), or the Environment of the place it "
            f"runs, registered under the entry-point group {ENVIRONMENTS_GROUP!r}; keep the "
            f"adapter under {ADAPTERS_GROUP!r}. See unidist.adapters.base.",
            DeprecationWarning,
            stacklevel=3,
        )
        return LegacyShim(candidate)
    missing = [name for name in ("name", "environment", *_METHODS) if not hasattr(candidate, name)]
    raise ConfigurationError(
        f"{what} does not implement the adapter contract (unidist.adapters.base.Adapter): it "
        f"has no {', '.join(missing)}. HINT: run unidist.testing.check_adapter on it."
    )


_METHODS = (
    "detect",
    "initialize",
    "finalize",
    "topology",
    "all_reduce",
    "all_gather",
    "broadcast",
    "barrier",
    "new_group",
)
