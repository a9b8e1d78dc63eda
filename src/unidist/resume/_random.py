"""Each rank's random states (Python's, NumPy's, torch's, CUDA's), saved and put back.

Two paths: with a model, the states are tensors in torch's own checkpoint files (``rng.r<rank>``,
read back into slots of the saved shapes); without one, a JSON record per rank. Either way every
field is checked before any state is set, as the checkpoint is untrusted input.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from unidist.errors import CheckpointError
from unidist.resume import _manifest as records
from unidist.resume._remote import redact

if TYPE_CHECKING:
    from unidist.resume._storage import Folder

__all__ = ["random_from_tensors", "random_state", "rng_slots", "rng_tensors", "set_random"]


def random_state() -> dict[str, Any]:
    version, keys, gauss = random.getstate()
    name, table, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(keys), gauss],
        "numpy": [name, np.asarray(table).tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


#: The random states of one rank as tensors in torch's checkpoint: name -> dtype.
_RNG_SLOTS = {
    "python": torch.int64,  # random.getstate()'s 625 words
    "numpy": torch.int64,  # the legacy MT19937 table's 624 words
    "ints": torch.int64,  # numpy's position and has_gauss, whether python has a gauss
    "floats": torch.float64,  # python's gauss, numpy's cached gaussian
    "torch": torch.uint8,  # torch.get_rng_state()
    "cuda": torch.uint8,  # torch.cuda.get_rng_state_all(), one row per device (optional)
}


_RNG_SIZES = {"python": 625, "numpy": 624, "ints": 3, "floats": 2}


def rng_tensors() -> dict[str, torch.Tensor]:
    """This rank's random states as tensors, saved in torch's files (no file of their own)."""
    _, keys, gauss = random.getstate()
    _, table, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": torch.tensor(keys, dtype=torch.int64),
        "numpy": torch.from_numpy(np.asarray(table, dtype=np.int64)),
        "ints": torch.tensor([pos, has_gauss, gauss is not None], dtype=torch.int64),
        "floats": torch.tensor([gauss or 0.0, cached], dtype=torch.float64),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def rng_slots(folder: Folder, rank: int) -> dict[str, torch.Tensor]:
    """Empty tensors of the shapes rank ``rank``'s random states were saved with."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    where = folder.path / ".metadata"
    try:
        found = folder.reader().read_metadata().state_dict_metadata
    except Exception as exc:
        raise CheckpointError(f"{where} cannot be read: {redact(repr(exc))[:300]}") from exc
    prefix = f"rng.r{rank}."
    slots: dict[str, torch.Tensor] = {}
    for key, meta in found.items():
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name is None:
            continue
        if name not in _RNG_SLOTS or not isinstance(meta, TensorStorageMetadata):
            raise CheckpointError(f"{where}: {key!r} is not one of unidist's random states.")
        size = _RNG_SIZES.get(name)
        if (
            meta.properties.dtype != _RNG_SLOTS[name]
            or meta.size.numel() > 1 << 24
            or (size is not None and list(meta.size) != [size])
        ):
            raise CheckpointError(
                f"{where}: {key!r} is {meta.properties.dtype}{list(meta.size)}, not the random "
                "state unidist saves: the checkpoint is damaged or not unidist's."
            )
        slots[name] = torch.empty(meta.size, dtype=_RNG_SLOTS[name])
    missing = sorted(set(_RNG_SLOTS) - {"cuda"} - set(slots))
    if missing:
        raise CheckpointError(
            f"{where} holds no random state {', '.join(missing)} of rank {rank}: the checkpoint "
            "is damaged. HINT: delete latest.json to fall back to starting afresh."
        )
    return slots


def random_from_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """Tensors of :func:`rng_tensors` as the JSON form :func:`set_random` checks and sets."""
    pos, has_gauss, with_gauss = state["ints"].tolist()
    gauss, cached = state["floats"].tolist()
    value: dict[str, Any] = {
        "python": [3, state["python"].tolist(), gauss if with_gauss else None],
        "numpy": ["MT19937", state["numpy"].tolist(), pos, has_gauss, cached],
        "torch": state["torch"].tolist(),
    }
    if "cuda" in state:
        value["cuda"] = state["cuda"].tolist()
    return value


def set_random(state: Mapping[str, Any], where: Path) -> None:
    """Put back one rank's random states, each field checked before any is set."""
    version, keys, gauss = records.pair(state.get("python"), where, "python", 3)
    if version != 3:
        raise CheckpointError(f'{where}: field "python" is of version {version!r:.40}, not 3.')
    keys = records.ints(keys, where, "python[1]", length=625, low=0, high=2**32 - 1)
    gauss = records.number(gauss, where, "python[2]", optional=True)
    name, table, pos, has_gauss, cached = records.pair(state.get("numpy"), where, "numpy", 5)
    if name != "MT19937":
        raise CheckpointError(f'{where}: field "numpy" is of generator {name!r:.40}, not MT19937.')
    table = records.ints(table, where, "numpy[1]", length=624, low=0, high=2**32 - 1)
    pos = records.ints([pos], where, "numpy[2]", length=1, low=0, high=624)[0]
    has_gauss = records.ints([has_gauss], where, "numpy[3]", length=1, low=0, high=1)[0]
    cached = records.number(cached, where, "numpy[4]", optional=False) or 0.0
    size = torch.get_rng_state().numel()
    cpu = records.ints(state.get("torch"), where, "torch", length=size, low=0, high=255)
    cuda = state.get("cuda")
    devices: list[list[int]] = []
    if cuda is not None and torch.cuda.is_available():
        if not isinstance(cuda, list):
            raise CheckpointError(f'{where}: field "cuda" is not a list of random states.')
        devices = [
            records.ints(s, where, f"cuda[{i}]", length=None, low=0, high=255)
            for i, s in enumerate(cuda)
        ]
    try:
        random.setstate((3, tuple(keys), gauss))
        np.random.set_state((name, np.array(table, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(torch.tensor(cpu, dtype=torch.uint8))
        if devices:
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in devices])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"{where}: a saved random state cannot be restored: {exc!r:.300}"
        ) from exc
