"""Classes of modules already imported: an ``isinstance`` test that imports nothing.

An object exists only once its class's module has been imported (and, with it, every package
above that module), so a module missing from ``sys.modules`` means no instance of its classes
can exist, and asking costs nothing. unidist asks this way instead of importing: FSDP's
package (``torch.distributed.fsdp``) imports sympy, ``torch._dynamo`` and triton on the way,
1.1 s of CPU on torch 2.7, in every rank that calls ``auto_model`` or starts a ``MicroBatcher``
on a model that is not sharded at all. On the ground floor: it imports nothing of unidist's.
"""

from __future__ import annotations

import sys

__all__ = ["loaded_classes"]


def loaded_classes(module: str, *names: str) -> tuple[type, ...]:
    """The classes ``names`` of ``module`` if it is imported already, else ``()``.

    A name the module lacks (another torch release) is left out; ``isinstance(x, ())`` is
    False, so the result can be passed to ``isinstance`` as it is.
    """
    found = sys.modules.get(module)
    if found is None:
        return ()
    classes = (getattr(found, name, None) for name in names)
    return tuple(cls for cls in classes if isinstance(cls, type))
