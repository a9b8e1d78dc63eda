"""The frameworks' own distributed samplers, for ``get_sampler(native=...)``.

Imports Composer and Ignite only when asked, and only here: the samplers themselves are written
once in :mod:`unidist.samplers`, never inside an adapter.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from unidist import _state
from unidist.errors import AdapterUnavailableError, ConfigurationError

__all__ = ["native_sampler"]


def native_sampler(
    which: bool | str,
    dataset: Any,
    sampler: Any,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    rank: int,
    world: int,
) -> torch.utils.data.DistributedSampler[Any]:
    """torch's, Composer's or Ignite's sampler (``which=True``: the running adapter's)."""
    if which is True:
        active = _state.current()
        name = active.adapter.name if active is not None else "torch"
        which = name if name in ("composer", "ignite") else "torch"
    if which == "ignite":
        if sampler is None:  # Ignite's auto_dataloader injects torch's sampler for datasets
            return torch.utils.data.DistributedSampler(
                dataset,
                num_replicas=world,
                rank=rank,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
            )
        if drop_last:
            raise ConfigurationError(
                "Ignite's DistributedProxySampler always pads; it has no drop_last. "
                "HINT: use native=False (unidist's DistributedSamplerWrapper) to drop the tail."
            )
        auto = _framework("ignite.distributed.auto", "ignite")
        return auto.DistributedProxySampler(sampler, num_replicas=world, rank=rank)  # type: ignore[no-any-return]
    if sampler is not None:
        raise ConfigurationError(
            f"native={which!r} has no sampler wrapper. HINT: use native='ignite' "
            "(DistributedProxySampler) or native=False (unidist's DistributedSamplerWrapper)."
        )
    if which == "composer":
        cdist = _framework("composer.utils.dist", "composer")
        return cdist.get_sampler(  # type: ignore[no-any-return]
            dataset, drop_last=drop_last, shuffle=shuffle, num_replicas=world, rank=rank, seed=seed
        )
    if which == "torch":
        return torch.utils.data.DistributedSampler(
            dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
    raise ConfigurationError(
        f"native={which!r} is not one of True, False, 'torch', 'composer', 'ignite'."
    )


def _framework(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"pip install 'pytorch-unidist[{extra}]'"
        raise AdapterUnavailableError(
            f"native={extra!r} needs {extra}, which is not installed ({exc}). HINT: {hint}",
            pip_hint=hint,
        ) from exc
