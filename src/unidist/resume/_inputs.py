"""What a script hands to :class:`ResumableState`, checked: its stateful objects, its JSON, its
loader's epoch."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unidist.errors import ConfigurationError
from unidist.resume import _manifest as records
from unidist.samplers import DistributedSampler

__all__ = ["check_json", "check_stateful", "epoch_of", "has_state", "set_epoch"]


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")


def has_state(obj: object) -> bool:
    """Whether ``obj`` can be saved and restored: it has ``state_dict()`` and
    ``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def check_stateful(stateful: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``stateful=`` objects by name, each with ``state_dict()``/``load_state_dict()``."""
    if stateful is None:
        return {}
    if not isinstance(stateful, Mapping):
        raise ConfigurationError(
            f"stateful={type(stateful).__name__}: expected a dict of name -> object, e.g. "
            "stateful={'scheduler': scheduler, 'scaler': scaler}."
        )
    for name, obj in stateful.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(
                f"stateful name {name!r}: names are letters, digits, '_' and '-' (64 at most, "
                "not starting with a digit), since torch's checkpoint keys are built from "
                "them. HINT: stateful={'scheduler': ...}."
            )
        if not has_state(obj):
            raise ConfigurationError(
                f"stateful[{name!r}] is a {type(obj).__name__}, which has no "
                "state_dict()/load_state_dict(). HINT: pass objects such as LR schedulers, "
                "GradScaler, torchmetrics metrics, or wrap yours in a class with both methods."
            )
    return dict(stateful)


def check_json(progress: dict[str, Any]) -> None:
    try:
        json.dumps(progress)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"ResumableState saves the loader's state_dict() and state.extra as JSON, and "
            f"one of them cannot be ({exc}). HINT: keep state.extra to numbers, strings, lists "
            "and dicts."
        ) from exc


def epoch_of(data: Any, epoch: int, where: Path) -> int:
    """The epoch to go on with: the data position's own when it is a unidist sampler's."""
    sampler = data.get("sampler", data) if isinstance(data, Mapping) else None
    if isinstance(sampler, Mapping) and DistributedSampler.saved_epoch(sampler) is not None:
        return records.count(sampler, "epoch", where, label="loader.sampler.epoch")
    return epoch


def set_epoch(loader: Any, epoch: int) -> None:
    for candidate in (loader, getattr(loader, "sampler", None)):
        set_epoch = getattr(candidate, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return
