"""Pointers for names of Ignite's ``idist``, Composer's and torch's ``dist`` spelt otherwise here.

A user porting ``idist.get_nnodes()`` to ``unidist.get_nnodes()`` gets an ``AttributeError``
that names the unidist equivalent, instead of Python's guess from ``dir(unidist)`` (which
suggests the ``unidist.parallel`` module for ``unidist.Parallel``). The migration guides
(docs/migration/) list every public function of both modules; this table covers the names
that are missing here. :func:`foreign_keywords` does the same for keywords: a function that
shares its name with theirs refuses their spelling of a keyword with a pointer to unidist's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["POINTERS", "foreign_keywords", "missing"]

F = TypeVar("F", bound=Callable[..., Any])

_IGNITE, _COMPOSER, _TORCH = "ignite.distributed", "composer.utils.dist", "torch.distributed"
_LOCAL_FIRST = "`with unidist.one_rank_first(local=True):` around the download (or the work)"

#: name -> (the framework module that has it, what to use in unidist).
POINTERS: dict[str, tuple[str, str]] = {
    "Parallel": (
        _IGNITE,
        "`unidist launch -n N script.py` (it takes torchrun's options too), or "
        "`unidist.spawn(fn, *args, nproc=N)` from Python (it returns every rank's result): "
        "unidist does not wrap your code in a context manager; inside, call "
        "unidist.initialize() (or nothing: the first collective adopts the group)",
    ),
    "get_nproc_per_node": (_IGNITE, "unidist.get_local_world_size()"),
    "get_nnodes": (_IGNITE, "unidist.get_num_nodes()"),
    "hostname": (_IGNITE, "socket.gethostname() (unidist has no wrapper for it)"),
    "model_name": (
        _IGNITE,
        "unidist.current_adapter().name ('torch', 'ignite', 'composer' or 'serial'; Ignite's "
        "'native-dist' is the torch adapter) and unidist.backend() ('gloo', 'nccl', ...)",
    ),
    "set_local_rank": (
        _IGNITE,
        "nothing: the local rank comes from the launcher's environment (LOCAL_RANK, SLURM, "
        "MPI, ...) and unidist.get_local_rank() reads it; start the processes with a launcher "
        "(unidist launch, torchrun, composer -n)",
    ),
    "sync": (
        _IGNITE,
        "nothing: unidist adopts a process group started elsewhere on its first collective; "
        "call unidist.initialize() to adopt it explicitly",
    ),
    "all_gather_tensors_with_shapes": (
        _IGNITE,
        "unidist.all_gather_uneven(tensor) (no shapes needed: dim 0 may differ per rank)",
    ),
    "DistributedProxySampler": (_IGNITE, "unidist.DistributedSamplerWrapper(sampler)"),
    "has_native_dist_support": (_IGNITE, "unidist.available_backends() (empty without it)"),
    "has_xla_support": (_IGNITE, "'xla' in unidist.available_backends()"),
    "has_hvd_support": (_IGNITE, "nothing: unidist has no Horovod adapter"),
    "registered_computation_models": (_IGNITE, "unidist.available_adapters()"),
    "get_global_rank": (_COMPOSER, "unidist.get_rank()"),
    "initialize_dist": (_COMPOSER, "unidist.initialize(backend, timeout=seconds)"),
    "is_available": (_COMPOSER, "unidist.available_backends() (empty without torch.distributed)"),
    "broadcast_object_list": (
        _COMPOSER,
        "obj = unidist.broadcast_object(obj, src) (it returns the object instead of filling a "
        "list in place)",
    ),
    "all_gather_object_list_hpu": (_COMPOSER, "unidist.all_gather_object(obj)"),
    "local_rank_zero_download_and_wait": (_COMPOSER, _LOCAL_FIRST),
    "run_local_rank_zero_first": (_COMPOSER, "unidist.one_rank_first(local=True)"),
    "busy_wait_for_local_rank_zero": (_COMPOSER, _LOCAL_FIRST),
    "write_signal_file": (_COMPOSER, _LOCAL_FIRST + " (no signal files needed)"),
    "get_node_signal_file_name": (_COMPOSER, _LOCAL_FIRST + " (no signal files needed)"),
    "init_process_group": (
        _TORCH,
        "unidist.initialize(backend, timeout=seconds) (rank, world size and rendezvous come from "
        "the launcher's environment)",
    ),
    "destroy_process_group": (_TORCH, "unidist.finalize()"),
    "get_backend": (_TORCH, "unidist.backend()"),
}


def missing(name: str) -> AttributeError:
    """The ``AttributeError`` for ``unidist.<name>``, with a pointer if another library has it."""
    found = POINTERS.get(name)
    if found is None:
        return AttributeError(f"module 'unidist' has no attribute {name!r}")
    origin, pointer = found
    # name= and obj=None keep Python from appending its own "Did you mean" guess, which would
    # contradict the pointer (it proposes the unidist.parallel module for Parallel).
    return AttributeError(
        f"module 'unidist' has no attribute {name!r} ({origin}.{name}). HINT: use {pointer}.",
        name=name,
        obj=None,
    )


def foreign_keywords(spellings: Mapping[str, tuple[str, str]]) -> Callable[[F], F]:
    """Decorator: the owner's spelling of a keyword raises a ``TypeError`` naming unidist's.

    Without it Python says only "unexpected keyword argument"; a script ported by renaming
    deserves the keyword to use. The check runs only when keywords are given.

    Args:
        spellings: keyword -> (the functions that spell it so, what to use here).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not spellings.keys().isdisjoint(kwargs):
                name = next(k for k in kwargs if k in spellings)
                origin, pointer = spellings[name]
                raise TypeError(
                    f"unidist.{fn.__name__}() takes no keyword {name}= ({origin} does). "
                    f"HINT: {pointer}."
                )
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate
