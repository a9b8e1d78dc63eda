"""What unidist adds around ``torch.distributed.checkpoint``: its writers count as progress, two
warnings about nothing a user can change are hidden."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

from unidist._base import workarounds as _workarounds
from unidist.hangs import stacks

__all__ = ["progress_writer", "quiet_checkpoint"]


@contextlib.contextmanager
def quiet_checkpoint(world: int) -> Iterator[None]:
    """Without two warnings torch's distributed checkpoint raises inside itself, about nothing
    the user can change (each filter matches one message, raised in that package only):

    * "TypedStorage is deprecated", once per process at its first save: torch 2.7's writer
      (``filesystem.py``) calls ``tensor.storage()`` (pytorch#148498). torch 2.14's calls
      ``untyped_storage()``: there the filter has nothing to hide.
    * "torch.distributed is ... uninitialized, assuming the intent is to save (load) in a single
      process", at every save and load of a one-process run (torch 2.7 and 2.14 alike, even
      with ``no_dist=True``). Hidden only when the world is one process, which unidist knows:
      with more, the barrier before the save has already checked the process group.
    """
    with warnings.catch_warnings():
        package = r"torch\.distributed\.checkpoint\."
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, module=package)
        if world == 1:
            warnings.filterwarnings(
                "ignore", r"torch\.distributed is .*single process", UserWarning, module=package
            )
        yield


def progress_writer(writer: Any) -> Any:
    """torch's checkpoint writer, whose writes count as this rank's progress for the hang
    watch: a save that writes is not a hang, however long it takes."""
    return _workarounds.count_checkpoint_writes(writer, stacks.moved)
