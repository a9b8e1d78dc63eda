"""``unidist launch``, :func:`unidist.spawn` and ``unidist smoke``, on torch's elastic agent.

* :mod:`~unidist.launch.plan`: options -> a checked :class:`LaunchPlan`.
* :mod:`~unidist.launch.runner`: runs a plan through ``torch.distributed.launcher``'s
  ``elastic_launch``, with per-rank logs, a fast-stop watchdog and a final sweep.
* :mod:`~unidist.launch.report`: culprit versus collateral, the summary, the exit code.
* :mod:`~unidist.launch._rank` and ``_bootstrap``: what runs inside each rank.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unidist.launch.plan import LaunchPlan
    from unidist.launch.spawn import spawn

__all__ = ["LaunchPlan", "spawn"]


def __getattr__(name: str) -> Any:
    # Imported on first access: a rank imports unidist.launch._bootstrap and needs neither.
    value: Any
    if name == "LaunchPlan":
        from unidist.launch.plan import LaunchPlan as value
    elif name == "spawn":
        from unidist.launch.spawn import spawn as value
    else:
        raise AttributeError(f"module 'unidist.launch' has no attribute {name!r}")
    globals()[name] = value
    return value
