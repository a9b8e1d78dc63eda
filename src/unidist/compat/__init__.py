"""Drop-in modules with a framework's own names and semantics, written on top of unidist.

``import unidist.compat.ignite as idist`` in place of ``import ignite.distributed as idist``, or
``from unidist.compat import composer as dist`` in place of ``from composer.utils import dist``,
and a project keeps its code and its tests: every name behaves as the owner's does, results and
errors alike (Ignite's concatenating ``all_gather``, its ``group=[0, 1]``, its ``float32``
numbers in ``broadcast``; Composer's in-place collectives and signal files). What unidist adds
comes with it: every wait has a deadline, a failed first rank is raised on the ranks waiting for
it, and a job started by ``unidist launch`` gets its hang and failure reports. Neither module
imports its framework. Where the owner's behaviour cannot be kept, the call fails with an error
that names the owner's behaviour and unidist's spelling (docs/migration/ lists each case). What
unidist refuses before anything is sent, and the owner refuses too, raises the owner's type and
unidist's at once (``unidist.errors.ConfigurationRuntimeError`` is a ``RuntimeError`` and a
``ConfigurationError``), so a port's ``except`` clauses keep working.
"""

from __future__ import annotations

__all__: list[str] = []
