"""``unidist launch`` and :func:`unidist.spawn`, on torch's elastic agent, in rooms by phase.

* :mod:`~unidist.launch.plan`: options -> a checked :class:`LaunchPlan` (``plan.job``), the
  rendezvous options (``plan.rendezvous``), the checks, the console spec (``plan.output``), the
  run folder's names, the dry run. No process is started there, and no torch imported.
* :mod:`~unidist.launch.supervise`: the launcher process (its docstring lists its modules).
* :mod:`~unidist.launch.rank`: what runs inside each rank (``bootstrap``, ``runtime``).
* ``torchfacts``: the plan's one door to the installed torch (device counts, the agent's
  settings).
* ``onenode``, ``onenode_handler``: unidist's one-node rendezvous backend (its registration,
  without torch; the handler itself).
* ``records``, ``printing``, ``leaving``: the files ranks write and the launcher reads; escaped
  display; leaving a process at once (flushed, no teardown).
* ``spawn``: :func:`unidist.spawn`, the top floor (it plans, supervises and runs ranks).

A room imports only from the rooms below it (pyproject.toml's ``launch-rooms`` contract).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unidist.launch.plan.job import LaunchPlan
    from unidist.launch.spawn import spawn

__all__ = ["LaunchPlan", "spawn"]


def __getattr__(name: str) -> Any:
    # Imported on first access: a rank imports unidist.launch.rank.bootstrap and needs neither.
    value: Any
    if name == "LaunchPlan":
        from unidist.launch.plan.job import LaunchPlan as value
    elif name == "spawn":
        from unidist.launch.spawn import spawn as value
    else:
        raise AttributeError(f"module 'unidist.launch' has no attribute {name!r}")
    globals()[name] = value
    return value
