"""Adapters connect unidist to a framework's process-group machinery.

See :mod:`unidist.adapters.base` for the contract and :mod:`unidist.adapters.registry` for how
adapters are found. Importing this package imports no framework.
"""

from __future__ import annotations

from unidist.adapters.base import REDUCE_OPS, Adapter, PrimitiveOp
from unidist.adapters.registry import (
    ENTRY_POINT_GROUP,
    AdapterSpec,
    available,
    get,
    register,
    specs,
)

__all__ = [
    "Adapter",
    "AdapterSpec",
    "ENTRY_POINT_GROUP",
    "PrimitiveOp",
    "REDUCE_OPS",
    "available",
    "get",
    "register",
    "specs",
]
