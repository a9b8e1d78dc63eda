"""The frameworks' own samplers, for ``get_sampler(native=...)``.

torch's sampler is built here; Composer's and Ignite's live in their integrations
(:mod:`unidist.integrations.composer`, :mod:`unidist.integrations.ignite`), which are loaded by name
only when asked for, so no framework is imported otherwise and no neutral module imports an
integration.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unidist import _state
from unidist.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

__all__ = ["FRAMEWORKS", "native_sampler", "no_sampler_wrapper", "torch_sampler"]

#: Frameworks whose own sampler ``native=`` can name, besides ``"torch"``.
FRAMEWORKS = ("composer", "ignite")


def native_sampler(
    which: bool | str,
    dataset: Any,
    sampler: Any,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    rank: int,
    world: int,
) -> torch.utils.data.DistributedSampler[Any]:
    """torch's, Composer's or Ignite's sampler (``which=True``: the running adapter's)."""
    if which is True:
        session = _state.current()
        name = session.adapter.name if session is not None else "torch"
        which = name if name in FRAMEWORKS else "torch"
    options: dict[str, Any] = {
        "shuffle": shuffle,
        "drop_last": drop_last,
        "seed": seed,
        "rank": rank,
        "world": world,
    }
    if which in FRAMEWORKS:
        integration = importlib.import_module(f"unidist.integrations.{which}")
        return integration.native_sampler(dataset, sampler, **options)  # type: ignore[no-any-return]
    if sampler is not None:
        raise no_sampler_wrapper(which)
    if which == "torch":
        return torch_sampler(dataset, **options)
    raise ConfigurationError(
        f"native={which!r} is not one of True, False, 'torch', 'composer', 'ignite'."
    )


def torch_sampler(
    dataset: Any, *, shuffle: bool, drop_last: bool, seed: int, rank: int, world: int
) -> torch.utils.data.DistributedSampler[Any]:
    """``torch.utils.data.DistributedSampler`` for this rank."""
    import torch

    return torch.utils.data.DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
    )


def no_sampler_wrapper(which: object) -> ConfigurationError:
    """The error for ``native=which`` together with ``sampler=``, for natives that cannot wrap."""
    return ConfigurationError(
        f"native={which!r} has no sampler wrapper. HINT: use native='ignite' "
        "(DistributedProxySampler) or native=False (unidist's DistributedSamplerWrapper)."
    )
