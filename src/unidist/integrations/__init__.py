"""Framework integrations: unidist's features as a framework's own objects, each framework lazily.

An adapter (:mod:`unidist.adapters`) only carries collectives through a framework; an
integration translates unidist's settings into the framework's objects, or hands it work:

* :mod:`unidist.integrations.composer`: devices (``to_composer_device``), parallelism
  (``to_composer_parallelism``, behind ``ParallelismConfig.to_composer``), the microbatch setting
  (``composer_microbatch_size``) and Composer's own sampler.
* :mod:`unidist.integrations.ignite`: ``auto_model``/``auto_optim`` through Ignite (behind
  ``unidist.auto_model(..., via="ignite")``), trainers with automatic microbatching
  (``create_microbatch_trainer``, ``microbatch_training_step``) and Ignite's samplers.

Neutral modules never import an integration: they ask :mod:`unidist._base.frameworks` for an
integration's function when a user asks for that framework (each integration lists what it offers
in ``PROVIDES``), so ``import unidist`` imports no framework and the layers stay one-way.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from unidist.errors import AdapterUnavailableError

__all__ = ["import_framework"]


def import_framework(module: str, extra: str, needed_by: str) -> ModuleType:
    """Import a framework module, or say which unidist extra installs it.

    Args:
        module: the module to import (``"composer.utils.dist"``).
        extra: the unidist extra that installs the framework (``"composer"``).
        needed_by: what needs it, for the message (``"native='composer'"``).

    Raises:
        AdapterUnavailableError: the framework is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"pip install 'pytorch-unidist[{extra}]'"
        raise AdapterUnavailableError(
            f"{needed_by} needs {extra}, which is not installed ({exc}). HINT: {hint}",
            pip_hint=hint,
        ) from exc
