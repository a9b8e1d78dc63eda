"""What the installed torch says, for the plan: the one door from ``launch.plan`` to torch.

The plan (``launch/plan/``) is pure: options in, a frozen plan out, no process started. A few of
its answers depend on the installed torch (how torchrun counts ``--nproc-per-node auto``, how many
devices are visible, which settings this torch's elastic agent has, the objects torchrun builds
from ``--logs-specs`` and ``--numa-binding``). It asks them here, and only here; a contract keeps
every other module of the plan from importing torch, and each function imports torch only when it
is called, so a plan that needs none of them (``unidist launch -n 2 --dry-run``) never imports
torch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

__all__ = [
    "agent_settings",
    "cpu_count",
    "device_count",
    "logs_specs",
    "numa_options",
    "torch_version",
    "torchrun_count",
]


def torchrun_count(kind: str) -> int:
    """``--nproc-per-node KIND`` as the installed torchrun counts it (torch's own function).

    Raises:
        ValueError: torchrun refuses ``kind`` (its message).
    """
    from torch.distributed.run import determine_local_world_size

    return int(determine_local_world_size(kind))


def device_count(kind: str) -> int:
    """Visible devices of ``kind`` (``gpu``/``auto``: CUDA, ``xpu``: XPU); 0 when none."""
    import torch

    if kind == "xpu":
        xpu = getattr(torch, "xpu", None)
        return int(xpu.device_count()) if xpu is not None and xpu.is_available() else 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def cpu_count() -> int:
    """CPU cores (at least 1)."""
    return os.cpu_count() or 1


def torch_version() -> str:
    import torch

    return str(torch.__version__)


def agent_settings() -> frozenset[str]:
    """The settings this torch's elastic agent takes (the fields of its ``LaunchConfig``)."""
    from torch.distributed.launcher.api import LaunchConfig

    return frozenset(f.name for f in dataclasses.fields(LaunchConfig))


def numa_options(mode: str) -> Any:
    """torch's ``NumaOptions`` for ``--numa-binding MODE`` (torch >= 2.9)."""
    from torch.numa.binding import (  # type: ignore[import-not-found,unused-ignore]
        AffinityMode,
        NumaOptions,
    )

    return NumaOptions(affinity_mode=AffinityMode(mode))


def logs_specs(
    cls: Any, log_dir: str | None, redirects: str, tee: str, local_ranks: set[int] | None
) -> Any:
    """A ``LogsSpecs`` of class ``cls``, built as torchrun builds it from its options."""
    from torch.distributed.elastic.multiprocessing import Std

    return cls(
        log_dir=log_dir,
        redirects=Std.from_str(redirects),
        tee=Std.from_str(tee),
        local_ranks_filter=local_ranks,
    )
