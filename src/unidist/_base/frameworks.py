"""The one way neutral code reaches a framework integration: a table of names, loaded on use.

Neutral modules (samplers, models, parallelism) never import :mod:`unidist.integrations`:
that would import Composer or Ignite with ``import unidist`` and turn the layers into a circle.
When a user asks for a framework's own object (``get_sampler(native="composer")``,
``auto_model(via="ignite")``, ``ParallelismConfig.to_composer()``), the neutral module asks this
registry for the integration's function by framework and name, and the integration is imported
then. Each integration declares what it offers in its ``PROVIDES``; a test checks that this table
and those declarations agree, so a renamed function fails a test instead of a user's call.

This is the only module, with :mod:`unidist.adapters.registry` for adapters, that imports a
unidist module by name (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from unidist.errors import ConfigurationError

__all__ = ["INTEGRATIONS", "integration"]

#: framework -> (the integration module, the functions neutral code may ask it for)
INTEGRATIONS: dict[str, tuple[str, frozenset[str]]] = {
    "composer": (
        "unidist.integrations.composer",
        frozenset({"native_sampler", "to_composer_parallelism"}),
    ),
    "ignite": (
        "unidist.integrations.ignite",
        frozenset({"auto_model", "auto_optim", "native_sampler"}),
    ),
}


def integration(framework: str, name: str) -> Callable[..., Any]:
    """The function ``name`` of ``framework``'s integration, importing the integration now.

    Raises:
        ConfigurationError: no integration for ``framework``, or it does not offer ``name``.
    """
    entry = INTEGRATIONS.get(framework)
    if entry is None or name not in entry[1]:
        offered = {fw: sorted(names) for fw, (_, names) in INTEGRATIONS.items()}
        raise ConfigurationError(
            f"no integration function {name!r} for framework {framework!r}; the integrations "
            f"offer {offered}."
        )
    module = importlib.import_module(entry[0])
    function: Callable[..., Any] = getattr(module, name)
    return function
