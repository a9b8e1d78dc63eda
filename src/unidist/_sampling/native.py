"""The frameworks' own samplers, for ``get_sampler(native=...)``.

torch's sampler is built here; Composer's and Ignite's live in their integrations
(:mod:`unidist.integrations.composer`, :mod:`unidist.integrations.ignite`), reached through
:mod:`unidist._base.frameworks` only when asked for, so no framework is imported otherwise and no
neutral module imports an integration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unidist._base import frameworks as _frameworks
from unidist.errors import ConfigurationError
from unidist.session import state as _state

if TYPE_CHECKING:
    import torch

__all__ = ["FRAMEWORKS", "SamplerRequest", "native_sampler", "no_sampler_wrapper", "torch_sampler"]

#: Frameworks whose own sampler ``native=`` can name, besides ``"torch"``.
FRAMEWORKS = ("composer", "ignite")


@dataclass(frozen=True)
class SamplerRequest:
    """What ``get_sampler(native=...)`` asks of a framework's own sampler.

    Each integration's ``native_sampler(request)`` takes one of these.
    """

    dataset: Any
    sampler: Any
    shuffle: bool
    drop_last: bool
    seed: int
    rank: int
    world: int


def native_sampler(
    which: bool | str, request: SamplerRequest
) -> torch.utils.data.DistributedSampler[Any]:
    """torch's, Composer's or Ignite's sampler (``which=True``: the running adapter's)."""
    if which is True:
        session = _state.published()
        name = session.adapter.name if session is not None else "torch"
        which = name if name in FRAMEWORKS else "torch"
    if which in FRAMEWORKS:
        return _frameworks.integration(which, "native_sampler")(request)  # type: ignore[no-any-return]
    if request.sampler is not None:
        raise no_sampler_wrapper(which)
    if which == "torch":
        return torch_sampler(request)
    raise ConfigurationError(
        f"native={which!r} is not one of True, False, 'torch', 'composer', 'ignite'."
    )


def torch_sampler(request: SamplerRequest) -> torch.utils.data.DistributedSampler[Any]:
    """``torch.utils.data.DistributedSampler`` for the request's dataset."""
    import torch

    return torch.utils.data.DistributedSampler(
        request.dataset,
        num_replicas=request.world,
        rank=request.rank,
        shuffle=request.shuffle,
        seed=request.seed,
        drop_last=request.drop_last,
    )


def no_sampler_wrapper(which: object) -> ConfigurationError:
    """The error for ``native=which`` together with ``sampler=``, for natives that cannot wrap."""
    return ConfigurationError(
        f"native={which!r} has no sampler wrapper. HINT: use native='ignite' "
        "(DistributedProxySampler) or native=False (unidist's DistributedSamplerWrapper)."
    )
