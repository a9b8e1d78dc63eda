"""``unidist launch``, :func:`unidist.spawn` and ``unidist smoke``, on torch's elastic agent.

* :mod:`~unidist.launch.plan`: options -> a checked :class:`LaunchPlan`.
* :mod:`~unidist.launch.runner`: runs a plan through ``torch.distributed.launcher``'s
  ``elastic_launch``, with per-rank logs, a fast-stop watchdog and a final sweep.
* :mod:`~unidist.launch.report`: culprit versus collateral, the summary, the exit code.
* :mod:`~unidist.launch._rank` and ``_bootstrap``: what runs inside each rank.
"""

from __future__ import annotations

from unidist.launch.plan import LaunchPlan
from unidist.launch.spawn import spawn

__all__ = ["LaunchPlan", "spawn"]
