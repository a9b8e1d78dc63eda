"""``torch.distributed.run`` as torch's own test_run.py uses it, backed by ``unidist launch``.

Harness only (scripts/owner-suites/torchrun). unidist-launch.sed turns
``import torch.distributed.run as launch`` into ``import unidist_as_torchrun as launch``.

``main``, ``run``, ``parse_args`` and ``get_args_parser`` are unidist's own drop-ins,
``unidist.compat.torchrun``: the job runs through ``unidist launch``; options refused after
parsing raise ValueError, a failed job raises torch's ChildFailedError, as torchrun's do.
Everything else the tests reach (``parse_min_max_nnodes``, ``config_from_args``, ...) is
torchrun's internals: it stays torch's, and summarize.py counts those tests apart
("internal API").
"""

from __future__ import annotations

from typing import Any

import torch.distributed.run as _torchrun

from unidist.compat.torchrun import get_args_parser, main, parse_args, run

__all__ = ["get_args_parser", "main", "parse_args", "run"]


def __getattr__(name: str) -> Any:
    return getattr(_torchrun, name)  # torchrun's internals: no unidist counterpart
